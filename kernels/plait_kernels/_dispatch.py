"""Choice between the Triton kernel and the torch path, plus shared argument checks.

Every public kernel takes ``impl: str = "auto"``:

- ``"auto"``: Triton for CUDA tensors, the vectorized torch path for CPU tensors. With the
  environment variable ``PLAIT_FORCE_TRITON=1`` "auto" picks Triton on CPU as well (which needs
  ``TRITON_INTERPRET=1`` set before ``plait.kernels`` is imported).
- ``"torch"``: the torch path on any device.
- ``"triton"``: the Triton kernel (CUDA, or the interpreter on CPU).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Literal

import torch

Impl = Literal["torch", "triton"]
IMPLS = ("auto", "torch", "triton")
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)


# ``@triton.jit`` picks the interpreter when the kernel is defined, i.e. when plait.kernels is
# imported (this module is imported first by every kernel module).
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_interpreted() -> bool:
    """True when the Triton kernels were defined for the CPU interpreter."""
    return _INTERPRETED


def choose_impl(impl: str, device: torch.device) -> Impl:
    """Resolve ``impl`` ("auto" | "torch" | "triton") for tensors on ``device``."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "torch":
        return "torch"
    if impl == "auto":
        forced = os.environ.get("PLAIT_FORCE_TRITON", "0") == "1"
        if device.type != "cuda" and not forced:
            return "torch"
    if device.type != "cuda" and not triton_interpreted():
        raise ValueError(
            f"impl={impl!r} selects Triton for tensors on {device}; Triton needs CUDA tensors "
            "or TRITON_INTERPRET=1 set before plait.kernels is imported"
        )
    return "triton"


def check_tensor(
    name: str,
    t: object,
    *,
    ndim: int | None = None,
    dtypes: Collection[torch.dtype] | None = None,
    device: torch.device | None = None,
    shape: tuple[int | None, ...] | None = None,
    last_contiguous: bool = False,
    contiguous: bool = False,
) -> torch.Tensor:
    """Validate one tensor argument; raise ValueError naming ``name`` on any mismatch.

    ``shape`` entries that are None are not checked.
    """
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dims = t.shape
    if ndim is not None and len(dims) != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(dims)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{name} must have dtype in ({names}), got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    if shape is not None and (
        len(shape) != len(dims)
        or any(want is not None and want != got for want, got in zip(shape, dims, strict=False))
    ):
        raise ValueError(f"{name} must have shape {_fmt(shape)}, got {tuple(dims)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")
    if last_contiguous and len(dims) > 0 and dims[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have unit stride in its last dim, got {t.stride()}")
    return t


def check_same_dtype(name: str, t: torch.Tensor, other_name: str, other: torch.Tensor) -> None:
    """Raise ValueError unless ``t`` and ``other`` share a dtype."""
    if t.dtype != other.dtype:
        raise ValueError(
            f"{name} must have the same dtype as {other_name} ({other.dtype}), got {t.dtype}"
        )


def next_pow2(n: int) -> int:
    """Smallest power of two >= max(n, 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def num_programs(device: torch.device, default: int = 4) -> int:
    """Number of resident programs for persistent grids (SM count on CUDA)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return default


def _fmt(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"

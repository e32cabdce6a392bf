"""The C quantized-matmul kernel (``csrc/quant_matmul_cpu.c``) through ctypes: which inputs it
takes and the ISA it runs; a weight is a :class:`NativeWeight` (its descriptor is built once)."""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

from ._native import load_native, pool_function
from .native_weight import NativeWeight, descriptor

ISAS = ("generic", "avx2", "avx512", "avx512_vnni", "amx")
last_parts = 0  # threads the last native call was split over (tests, diagnostics)

_i64, _ptr, _int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
# isa, threads, pool, x, ldx, m, weight, bias, out
_ARGTYPES: list[Any] = [_int, _int, _ptr, _ptr, _i64, _i64, _ptr, _ptr, _ptr]
_typed: list[ctypes.CDLL] = []  # the library whose argument types are set
__all__ = ["ISAS", "descriptor", "native_isa", "native_quant_linear", "pool_function"]


def _library() -> ctypes.CDLL | None:
    """The built kernel (argument types set on first use), or None without a compiler."""
    lib = load_native("quant_matmul_cpu")
    if lib is not None and lib not in _typed:
        lib.plait_qmm_f32.argtypes = _ARGTYPES
        lib.plait_qmm_f32.restype = ctypes.c_int
        lib.plait_qmm_isa.restype = ctypes.c_int
        _typed.append(lib)
    return lib


@functools.cache
def _best_isa() -> int:
    lib = _library()
    return 0 if lib is None else int(lib.plait_qmm_isa())


def native_isa() -> str | None:
    """The best instruction set the kernel runs here, or None when it cannot be built."""
    return None if _library() is None else ISAS[_best_isa()]


def native_quant_linear(
    x: torch.Tensor,
    w: NativeWeight,
    bias: torch.Tensor | None = None,
    *,
    threads: int | None = None,
    isa: str | None = None,
) -> torch.Tensor | None:
    """fp32 ``x [M, K] @ W^T (+ bias)`` -> [M, N] from the C kernel, or None when it cannot
    run (no compiler, tensors off the CPU). Row blocks of W are split over ``threads`` threads
    (default: torch's intra-op thread count) of the C pool when the work is large enough;
    every output is computed the same way on any thread, so the split does not change a bit.
    ``isa`` picks a lower instruction set than the best (tests)."""
    lib = _library()
    if lib is None or not x.is_cpu:
        return None
    if x.dim() != 2 or x.shape[1] != w.k or (bias is not None and bias.numel() != w.n):
        raise ValueError(f"x must be [M, {w.k}] and bias [{w.n}] (the kernel reads them directly)")
    level = _best_isa() if isa is None else min(_best_isa(), ISAS.index(isa))
    if x.dtype != torch.float32 or x.stride(-1) != 1:
        x = x.to(torch.float32).contiguous()
    m = x.shape[0]
    out = torch.empty(m, w.n, dtype=torch.float32)
    if m == 0:
        return out
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        bias = bias.to(torch.float32).contiguous()
    status = lib.plait_qmm_f32(
        level,
        threads or torch.get_num_threads(),
        pool_function(),
        x.data_ptr(),
        x.stride(0),
        m,
        descriptor(w),
        None if bias is None else bias.data_ptr(),
        out.data_ptr(),
    )
    if status == -1:
        raise MemoryError("quant_linear: cannot allocate the quantized activations")
    if status < 0:
        kinds = ", ".join(p.kind for p in w.parts)
        raise ValueError(f"quant_linear: the kernel rejected a weight of {kinds} [{w.n}, {w.k}]")
    global last_parts
    last_parts = status
    return out

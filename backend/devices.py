"""Where the model runs: the device and dtype a config's names choose. A leaf module (nothing of
plait imported), shared by the model runner and the tensor-parallel ranks."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(name: str) -> torch.device:
    """`auto` is the GPU when CUDA has one, else the CPU; any other name as torch reads it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` is bfloat16 on CUDA and float32 elsewhere; otherwise one of `DTYPES`."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)} or 'auto', got {name!r}")
    return DTYPES[name]

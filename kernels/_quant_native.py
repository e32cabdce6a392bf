"""The C quantized-matmul kernel (``csrc/quant_matmul_cpu.c``) through ctypes: which inputs it
takes, the ISA it runs, and the split of the weight's row blocks over threads."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from ._native import load_native
from .quant_weight import BLOCK_ROWS, QuantWeight

ISAS = ("generic", "avx2", "avx512", "avx512_vnni")
# A call stays on one thread below this many row blocks x K x rows of x (about 100 us of work
# on one core): waking a pool thread costs 10-40 us, more than a small product takes.
SPLIT_MIN_WORK = 1 << 18

_i64, _ptr = ctypes.c_int64, ctypes.c_void_p
_ARGTYPES: list[Any] = [
    ctypes.c_int,
    _ptr,
    _i64,
    _i64,
    _i64,
    _ptr,
    _ptr,
    _ptr,
    ctypes.c_int,
    ctypes.c_int,
]
_ARGTYPES += [_i64, _i64, _i64, _i64, _ptr, _ptr, _i64]


_typed: list[ctypes.CDLL] = []  # the library whose argument types are set


def _library() -> ctypes.CDLL | None:
    """The built kernel (argument types set on first use), or None without a compiler."""
    lib = load_native("quant_matmul_cpu")
    if lib is not None and lib not in _typed:
        lib.plait_qmm_f32.argtypes = _ARGTYPES
        lib.plait_qmm_f32.restype = ctypes.c_int
        lib.plait_qmm_isa.restype = ctypes.c_int
        _typed.append(lib)
    return lib


def native_isa() -> str | None:
    """The best instruction set the kernel runs here, or None when it cannot be built."""
    return None if _library() is None else ISAS[_best_isa()]


def native_quant_linear(
    x: torch.Tensor,
    w: QuantWeight,
    bias: torch.Tensor | None = None,
    *,
    threads: int | None = None,
    isa: str | None = None,
) -> torch.Tensor | None:
    """fp32 ``x [M, K] @ W^T (+ bias)`` -> [M, N] from the C kernel, or None when it cannot
    run (no compiler, tensors off the CPU). Row blocks of W are split over ``threads`` threads
    (default: torch's intra-op thread count) when the work is large enough; every output is
    computed the same way on any thread, so the split does not change a bit. ``isa`` picks a
    lower instruction set than the best (tests)."""
    lib = _library()
    if lib is None or not x.is_cpu or not w.codes.is_cpu:
        return None
    level = _best_isa() if isa is None else min(_best_isa(), ISAS.index(isa))
    if x.dtype != torch.float32 or x.stride(-1) != 1:
        x = x.to(torch.float32).contiguous()
    m = x.shape[0]
    out = torch.empty(m, w.n, dtype=torch.float32)
    if m == 0:
        return out
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        bias = bias.to(torch.float32).contiguous()
    bias_ptr = None if bias is None else bias.data_ptr()
    head = (level, x.data_ptr(), x.stride(0), m, w.k, *w.kernel_args)
    tail = (bias_ptr, out.data_ptr(), w.n)
    fn = lib.plait_qmm_f32
    blocks = (w.n + BLOCK_ROWS - 1) // BLOCK_ROWS
    parts = threads or torch.get_num_threads()
    if parts == 1 or blocks * w.k * m < SPLIT_MIN_WORK:
        status = fn(*head, 0, blocks, *tail)
    else:
        statuses = _run_split(lambda lo, hi: int(fn(*head, lo, hi, *tail)), blocks, parts)
        status = min(statuses)
    if status == -1:
        raise MemoryError("quant_linear: cannot allocate the quantized activations")
    if status:
        raise ValueError(f"quant_linear: the kernel rejected group={w.group} bits={w.bits}")
    return out


@functools.cache
def _best_isa() -> int:
    lib = _library()
    return 0 if lib is None else int(lib.plait_qmm_isa())


def _run_split(run: Callable[[int, int], int], blocks: int, threads: int) -> list[int]:
    """``run(lo, hi)`` over about equal ranges of row blocks, one per thread (the kernel
    releases the GIL); the caller's thread takes the first range."""
    parts = max(1, min(threads, blocks))
    if parts == 1:
        return [int(run(0, blocks))]
    cuts = [blocks * i // parts for i in range(parts + 1)]
    futures = [
        _executor(parts).submit(run, lo, hi) for lo, hi in zip(cuts[1:-1], cuts[2:], strict=True)
    ]
    return [int(run(cuts[0], cuts[1])), *(int(f.result()) for f in futures)]


@functools.cache
def _executor(parts: int) -> ThreadPoolExecutor:
    """Worker threads for the ranges after the first (the caller runs that one)."""
    return ThreadPoolExecutor(max_workers=parts - 1, thread_name_prefix="plait-qmm")


__all__ = ["BLOCK_ROWS", "ISAS", "native_isa", "native_quant_linear"]

"""The C decode-attention kernel (``csrc/decode_attention_cpu.c``) through ctypes: which
inputs it takes, bounds checks before it reads memory directly, and the split of a batch over
threads."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from ._native import load_native

_NATIVE_POOL_DTYPES = {torch.float32: "plait_decode_f32", torch.bfloat16: "plait_decode_bf16"}


def native_decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    req_to_token: torch.Tensor,
    req_slots: torch.Tensor,
    seq: torch.Tensor,
    start: torch.Tensor,
    *,
    scale: float,
    softcap: float | None = None,
    threads: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """fp32 output [B, Hq, D] and log-sum-exp [B, Hq] from the C kernel
    ``csrc/decode_attention_cpu.c``, which reads the pool's rows in place; None when it cannot
    run (no compiler, a pool dtype other than fp32/bf16, a non-contiguous pool). With ``softcap``
    c the scaled scores become ``c * tanh(score / c)`` before the softmax. The requests
    are split over ``threads`` threads (default: torch's intra-op thread count)."""
    name = _NATIVE_POOL_DTYPES.get(k_pool.dtype)
    b, hq, d = q.shape
    hkv = k_pool.shape[1]
    tensors = (q, k_pool, v_pool, req_to_token, req_slots, seq, start)
    supported = (
        name is not None
        and all(t.device.type == "cpu" for t in tensors)
        and 0 < hkv <= hq
        and hq % hkv == 0
        and k_pool.shape[2] == d
        and v_pool.shape == k_pool.shape
        and v_pool.dtype == k_pool.dtype
        and k_pool.is_contiguous()
        and v_pool.is_contiguous()
        and req_to_token.dtype == torch.int32
        and req_to_token.stride(-1) == 1
    )
    lib = load_native("decode_attention_cpu") if supported else None
    if lib is None or name is None:
        return None
    _check_bounds(req_to_token, req_slots, seq, start)
    qf = q.to(torch.float32).contiguous()
    out = torch.empty(b, hq, d, dtype=torch.float32)
    lse = torch.empty(b, hq, dtype=torch.float32)
    rows, first, last = (t.to(torch.int64).contiguous() for t in (req_slots, start, seq))
    fn = getattr(lib, name)

    def run(lo: int, hi: int) -> int:
        """The kernel over requests [lo, hi) (views into the same buffers); arguments in the
        order of the C signature."""
        return int(
            fn(
                _ptr(qf[lo:hi]),
                _ptr(k_pool),
                _ptr(v_pool),
                _ptr(req_to_token),
                _ptr(rows[lo:hi]),
                _ptr(first[lo:hi]),
                _ptr(last[lo:hi]),
                *(ctypes.c_int64(n) for n in (req_to_token.stride(0), k_pool.shape[0])),
                *(ctypes.c_int64(n) for n in (hi - lo, hq, hkv, d, 0, hkv)),
                ctypes.c_float(scale),
                ctypes.c_float(softcap or 0.0),
                _ptr(out[lo:hi]),
                _ptr(lse[lo:hi]),
            )
        )

    spans = (last - first).clamp(min=0)
    statuses = _run_split(run, spans, threads or torch.get_num_threads())
    if -2 in statuses:
        raise ValueError(f"req_to_token holds a KV slot outside the pool (size {k_pool.shape[0]})")
    if any(statuses):
        raise MemoryError("decode attention: cannot allocate the score buffer")
    return out, lse


def _ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def _run_split(run: Callable[[int, int], int], spans: torch.Tensor, threads: int) -> list[int]:
    """``run`` over contiguous ranges of requests with about equal total span, one per thread
    (the kernel releases the GIL; each pool thread keeps its own score buffer)."""
    b = spans.numel()
    parts = max(1, min(threads, b))
    if parts == 1:
        return [run(0, b)]
    cum = spans.cumsum(0).double() + torch.arange(1, b + 1)  # +1 per request: its fixed cost
    cuts = torch.searchsorted(cum, cum[-1] * torch.arange(1, parts) / parts).tolist()
    bounds = sorted({0, b, *(min(max(c, 1), b - 1) for c in cuts)})
    ranges = list(zip(bounds[:-1], bounds[1:], strict=False))
    futures = [_executor(parts).submit(run, lo, hi) for lo, hi in ranges[1:]]
    return [run(*ranges[0]), *(f.result() for f in futures)]


@functools.cache
def _executor(parts: int) -> ThreadPoolExecutor:
    """Worker threads for the ranges after the first (the caller runs that one)."""
    return ThreadPoolExecutor(max_workers=parts - 1, thread_name_prefix="plait-decode")


def _check_bounds(
    req_to_token: torch.Tensor, req_slots: torch.Tensor, seq: torch.Tensor, start: torch.Tensor
) -> None:
    """What the C kernel indexes with must lie inside req_to_token (it reads memory directly)."""
    rows, width = req_to_token.shape
    if req_slots.numel() and (int(req_slots.min()) < 0 or int(req_slots.max()) >= rows):
        raise ValueError(f"req_slots must lie in [0, {rows}), got {req_slots.tolist()}")
    if seq.numel() and (int(seq.max()) > width or int(start.min()) < 0):
        raise ValueError(f"positions must lie in [0, {width}]: seq_lens {seq.tolist()}")

"""The C extend-attention kernel (``csrc/extend_attention_cpu.c``) through ctypes: one
request's causal attention over its cached prefix and new tokens, the pool read through its
slots; which inputs it takes, and the bounds it is called within."""

from __future__ import annotations

import ctypes

import torch

from ._native import load_native, pool_function


def native_extend(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
    pre: int,
    *,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    threads: int | None = None,
) -> torch.Tensor | None:
    """fp32 output [E, Hq, D] of new tokens ``q`` [E, Hq, D] at positions ``pre .. pre + E - 1``
    attending causally to the positions whose KV slots are ``slots`` [pre + E] (int32; with
    ``sliding_window`` w, a token at p to positions p - w + 1 .. p only; with ``softcap`` c the
    scaled scores become ``c * tanh(score / c)``), or None
    when the kernel cannot run (no compiler, a dtype other than fp32, a non-contiguous pool, no
    vector path for this CPU and head size). Split over ``threads`` threads (default: torch's
    intra-op thread count) of the C pool; every token is computed the same way on any split."""
    ext, hq, d = q.shape
    hkv = k_pool.shape[1]
    supported = (
        all(t.device.type == "cpu" and t.dtype == torch.float32 for t in (q, k_pool, v_pool))
        and ext > 0
        and 0 < hkv <= hq
        and hq % hkv == 0
        and k_pool.shape[2] == d
        and v_pool.shape == k_pool.shape
        and k_pool.is_contiguous()
        and v_pool.is_contiguous()
        and slots.dtype == torch.int32
        and slots.shape == (pre + ext,)
    )
    lib = load_native("extend_attention_cpu") if supported else None
    if lib is None:
        return None
    qc, sc = q.contiguous(), slots.contiguous()
    lib.plait_extend_scratch.restype = ctypes.c_int64
    scratch = torch.empty(lib.plait_extend_scratch(*_i64(pre, ext, hkv, d)), dtype=torch.float32)
    out = torch.empty(ext, hq, d, dtype=torch.float32)
    status = lib.plait_extend_f32(
        *(_ptr(t) for t in (qc, k_pool, v_pool, sc)),
        *_i64(pre, ext, k_pool.shape[0], hq, hkv, d, sliding_window or 0),
        ctypes.c_float(scale),
        ctypes.c_float(softcap or 0.0),
        _ptr(scratch),
        _ptr(out),
        ctypes.c_int(threads or torch.get_num_threads()),
        ctypes.c_void_p(pool_function()),
    )
    if status == -2:
        raise ValueError(f"slots hold a KV slot outside the pool (size {k_pool.shape[0]})")
    return out if status > 0 else None


def _ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def _i64(*values: int) -> tuple[ctypes.c_int64, ...]:
    return tuple(ctypes.c_int64(v) for v in values)

"""Write new tokens' K/V into the paged KV pool: ``k_pool[slots] = k``, ``v_pool[slots] = v``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_same_dtype,
    check_tensor,
    choose_impl,
    next_pow2,
)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
    *,
    impl: str = "auto",
) -> None:
    """Copy ``k``/``v`` [T, Hkv, D] into rows ``slots`` [T] of ``k_pool``/``v_pool`` [S, Hkv, D].

    ``k``/``v`` may be strided views (e.g. slices of a fused qkv projection); the pools must be
    contiguous and share k's dtype. Slots must be distinct and in [0, S) (not checked on CUDA).
    """
    _check(k, v, k_pool, v_pool, slots)
    if k.shape[0] == 0:
        return
    if choose_impl(impl, k.device) == "triton":
        store_kv_triton(k, v, k_pool, v_pool, slots)
    else:
        store_kv_torch(k, v, k_pool, v_pool, slots)


def _check(
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    check_tensor("k", k, ndim=3, dtypes=FLOAT_DTYPES)
    dev = k.device
    t, h, d = k.shape
    check_tensor("v", v, shape=(t, h, d), device=dev)
    check_same_dtype("v", v, "k", k)
    check_tensor("k_pool", k_pool, shape=(None, h, d), device=dev, contiguous=True)
    check_tensor("v_pool", v_pool, shape=tuple(k_pool.shape), device=dev, contiguous=True)
    check_same_dtype("k_pool", k_pool, "k", k)
    check_same_dtype("v_pool", v_pool, "k", k)
    check_tensor("slots", slots, shape=(t,), dtypes=INDEX_DTYPES, device=dev)
    if dev.type == "cpu" and t > 0 and (int(slots.min()) < 0 or int(slots.max()) >= len(k_pool)):
        raise ValueError(f"slots must lie in [0, {len(k_pool)}), got {slots.min()}..{slots.max()}")


def store_kv_torch(
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Reference / CPU path: two ``index_copy_`` calls."""
    idx = slots.long()
    k_pool.index_copy_(0, idx, k)
    v_pool.index_copy_(0, idx, v)


@triton.jit
def _store_kv_kernel(
    k_ptr: tl.tensor,
    v_ptr: tl.tensor,
    k_pool_ptr: tl.tensor,
    v_pool_ptr: tl.tensor,
    slots_ptr: tl.tensor,
    n_heads: tl.tensor,
    head_dim: tl.tensor,
    stride_kt: tl.tensor,
    stride_kh: tl.tensor,
    stride_kd: tl.tensor,
    stride_vt: tl.tensor,
    stride_vh: tl.tensor,
    stride_vd: tl.tensor,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
) -> None:
    t = tl.program_id(0)
    hb = tl.program_id(1)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < n_heads) & (d[None, :] < head_dim)
    dst = slot * n_heads * head_dim + h[:, None] * head_dim + d[None, :]
    t64 = t.to(tl.int64)
    src_k = t64 * stride_kt + h[:, None] * stride_kh + d[None, :] * stride_kd
    src_v = t64 * stride_vt + h[:, None] * stride_vh + d[None, :] * stride_vd
    tl.store(k_pool_ptr + dst, tl.load(k_ptr + src_k, mask=mask), mask=mask)
    tl.store(v_pool_ptr + dst, tl.load(v_ptr + src_v, mask=mask), mask=mask)


def store_kv_triton(
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Triton path: one program per (token, block of heads)."""
    t, h, d = k.shape
    if t == 0:
        return
    block_d = next_pow2(d)
    block_h = min(next_pow2(h), max(1, 4096 // block_d))
    grid = (t, triton.cdiv(h, block_h))
    _store_kv_kernel[grid](
        k,
        v,
        k_pool,
        v_pool,
        slots,
        h,
        d,
        *k.stride(),
        *v.stride(),
        BLOCK_H=block_h,
        BLOCK_D=block_d,
    )

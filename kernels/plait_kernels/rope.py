"""Rotary position embedding (Neox / HF Llama ``rotate_half`` style), in place on q and k."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import FLOAT_DTYPES, INDEX_DTYPES, check_same_dtype, check_tensor, choose_impl


def rope(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q`` [T, Hq, D] and ``k`` [T, Hkv, D] in place; return ``(q, k)``.

    ``positions`` [T] int; ``cos_sin_cache`` [max_pos, D] float32 whose row p is
    ``cat(cos(p * inv_freq), sin(p * inv_freq))``. ``out = x * cos + rotate_half(x) * sin`` with
    cos/sin duplicated to D and ``rotate_half(x) = cat(-x2, x1)``; fp32 math, stored in the input
    dtype. q and k may be strided views (e.g. slices of a fused qkv output).
    """
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    t, _, d = q.shape
    if d % 2:
        raise ValueError(f"q head dim must be even, got shape {tuple(q.shape)}")
    check_tensor("k", k, shape=(t, None, d), device=q.device)
    check_same_dtype("k", k, "q", q)
    check_tensor("positions", positions, shape=(t,), dtypes=INDEX_DTYPES, device=q.device)
    check_tensor(
        "cos_sin_cache", cos_sin_cache, shape=(None, d), dtypes=(torch.float32,), device=q.device
    )
    check_tensor("cos_sin_cache", cos_sin_cache, ndim=2, contiguous=True)
    if q.device.type == "cpu" and t > 0:
        lo, hi = int(positions.min()), int(positions.max())
        if lo < 0 or hi >= cos_sin_cache.shape[0]:
            raise ValueError(
                f"positions must lie in [0, {cos_sin_cache.shape[0]}) (cos_sin_cache rows), "
                f"got {lo}..{hi}"
            )
    if t == 0:
        return q, k
    if choose_impl(impl, q.device) == "triton":
        return rope_triton(q, k, positions, cos_sin_cache)
    return rope_torch(q, k, positions, cos_sin_cache)


def rope_torch(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference / CPU path; writes through (possibly strided) views of q and k."""
    half = q.shape[-1] // 2
    cs = cos_sin_cache.index_select(0, positions.long()).unsqueeze(1)  # [T, 1, D]
    cos, sin = cs[..., :half], cs[..., half:]
    for x in (q, k):
        x1 = x[..., :half].to(torch.float32, copy=True)  # the first write clobbers it
        x2 = x[..., half:].float()
        x[..., :half] = x1 * cos - x2 * sin
        x[..., half:] = x2 * cos + x1 * sin
    return q, k


@triton.jit
def _rope_one(
    x_ptr: tl.tensor,
    t: tl.tensor,
    n_heads: tl.tensor,
    stride_t: tl.tensor,
    stride_h: tl.tensor,
    stride_d: tl.tensor,
    cos: tl.tensor,
    sin: tl.tensor,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
) -> None:
    i = tl.arange(0, BLOCK_HALF)
    for h0 in range(0, n_heads, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        mask = (h[:, None] < n_heads) & (i[None, :] < HALF)
        p1 = x_ptr + t * stride_t + h[:, None] * stride_h + i[None, :] * stride_d
        p2 = p1 + HALF * stride_d
        x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(p2, mask=mask, other=0.0).to(tl.float32)
        o1 = x1 * cos[None, :] - x2 * sin[None, :]
        o2 = x2 * cos[None, :] + x1 * sin[None, :]
        tl.store(p1, o1.to(x_ptr.dtype.element_ty), mask=mask)
        tl.store(p2, o2.to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr: tl.tensor,
    k_ptr: tl.tensor,
    pos_ptr: tl.tensor,
    cache_ptr: tl.tensor,
    n_q_heads: tl.tensor,
    n_k_heads: tl.tensor,
    stride_qt: tl.tensor,
    stride_qh: tl.tensor,
    stride_qd: tl.tensor,
    stride_kt: tl.tensor,
    stride_kh: tl.tensor,
    stride_kd: tl.tensor,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
) -> None:
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cache_ptr + pos * (2 * HALF) + i, mask=i < HALF, other=0.0)
    sin = tl.load(cache_ptr + pos * (2 * HALF) + HALF + i, mask=i < HALF, other=0.0)
    _rope_one(
        q_ptr, t, n_q_heads, stride_qt, stride_qh, stride_qd, cos, sin, HALF, BLOCK_H, BLOCK_HALF
    )
    _rope_one(
        k_ptr, t, n_k_heads, stride_kt, stride_kh, stride_kd, cos, sin, HALF, BLOCK_H, BLOCK_HALF
    )


def rope_triton(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton path: one program per token rotates all its q and k heads."""
    t, hq, d = q.shape
    if t == 0:
        return q, k
    half = d // 2
    block_half = triton.next_power_of_2(half)
    block_h = min(triton.next_power_of_2(max(hq, k.shape[1])), max(1, 2048 // block_half))
    _rope_kernel[(t,)](
        q,
        k,
        positions,
        cos_sin_cache,
        hq,
        k.shape[1],
        *q.stride(),
        *k.stride(),
        HALF=half,
        BLOCK_H=block_h,
        BLOCK_HALF=block_half,
    )
    return q, k

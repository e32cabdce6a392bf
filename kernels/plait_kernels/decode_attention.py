"""Decode attention over the paged KV pool: one query token per request.

Request ``b``'s query sits at position ``seq_lens[b] - 1`` and attends to its positions
``[0, seq_lens[b])`` (or the last ``sliding_window`` of them), whose KV slots are
``req_to_token[req_slots[b], pos]``. GQA: query head ``h`` reads kv head ``h // (Hq // Hkv)``.
A request with ``seq_lens[b] == 0`` gets a zero output row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._attn_common import check_paged_attention, tl_soft_cap
from ._decode_cpu import grouped_decode, shared_prefix_decode
from ._dispatch import choose_impl, next_pow2, num_programs


def paged_decode_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    req_to_token: torch.Tensor,
    req_slots: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    shared_prefix_len: int = 0,
    impl: str = "auto",
) -> torch.Tensor:
    """Attention of ``q`` [B, Hq, D] over each request's cached K/V; returns [B, Hq, D].

    ``k_pool``/``v_pool`` [S, Hkv, D] (q's dtype), ``req_to_token`` [R, L] int32,
    ``req_slots``/``seq_lens`` [B] ints. Scores and softmax in fp32; output in q's dtype. With
    ``sliding_window`` w only key positions ``kpos > query_pos - w`` are attended; with
    ``softcap`` c the scaled scores become ``c * tanh(score / c)``.
    ``shared_prefix_len`` P (a hint; 0 = none): positions [0, P) of every request map to the
    same slots, so the torch path reads that prefix once for the whole batch (cascade).
    """
    batch = check_paged_attention(
        q,
        k_pool,
        v_pool,
        req_to_token,
        {"req_slots": req_slots, "seq_lens": seq_lens},
        scale=scale,
        sliding_window=sliding_window,
        softcap=softcap,
    )
    if batch != q.shape[0]:
        raise ValueError(f"req_slots must have one entry per query row ({q.shape[0]}), got {batch}")
    if batch == 0:
        return torch.empty_like(q)
    use_triton = choose_impl(impl, q.device) == "triton"
    if not use_triton and shared_prefix_len > 0 and sliding_window is None and softcap is None:
        return shared_prefix_decode(
            q,
            k_pool,
            v_pool,
            req_to_token,
            req_slots,
            seq_lens,
            scale=scale,
            shared_prefix_len=shared_prefix_len,
        )
    fn = paged_decode_attention_triton if use_triton else paged_decode_attention_torch
    return fn(
        q,
        k_pool,
        v_pool,
        req_to_token,
        req_slots,
        seq_lens,
        scale=scale,
        sliding_window=sliding_window,
        softcap=softcap,
    )


def paged_decode_attention_torch(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    req_to_token: torch.Tensor,
    req_slots: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    native: bool = True,
) -> torch.Tensor:
    """CPU path and reference. With ``native`` (and an fp32/bf16 pool on the CPU) the C kernel
    ``csrc/decode_attention_cpu.c`` reads each request's K/V rows in place. Otherwise each
    request's K/V window is gathered for batched fp32 matmuls: requests are taken in order of
    length, a few at a time, and each group is padded only to its own longest window and kept
    small enough to stay in cache (large temporaries cost page faults on every step).
    """
    seq = seq_lens.long()
    start = (seq - sliding_window).clamp(min=0) if sliding_window else torch.zeros_like(seq)
    out, _ = grouped_decode(
        q, k_pool, v_pool, req_to_token, req_slots, seq, start,
        scale=scale, softcap=softcap, native=native,
    )  # fmt: skip
    return out.to(q.dtype)


# ---------------------------------------------------------------------------------------------
# Triton path: split-K (flash-decoding); stage 1 per (request, kv head, split), stage 2 merges.
# ---------------------------------------------------------------------------------------------


@triton.jit
def _decode_split_kernel(
    q_ptr: tl.tensor,
    k_ptr: tl.tensor,
    v_ptr: tl.tensor,
    r2t_ptr: tl.tensor,
    req_slots_ptr: tl.tensor,
    seq_lens_ptr: tl.tensor,
    mid_o_ptr: tl.tensor,
    mid_lse_ptr: tl.tensor,
    scale: tl.tensor,
    window: tl.tensor,
    softcap: tl.tensor,
    stride_qb: tl.tensor,
    stride_qh: tl.tensor,
    stride_r2t: tl.tensor,
    n_kv_heads: tl.tensor,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
) -> None:
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq = tl.load(seq_lens_ptr + b).to(tl.int32)
    req = tl.load(req_slots_ptr + b).to(tl.int64)
    start = 0
    if HAS_WINDOW:
        start = tl.maximum(seq - window, 0)
    per_split = tl.cdiv(tl.cdiv(seq - start, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = start + split * per_split
    hi = tl.minimum(lo + per_split, seq)

    g = tl.arange(0, BLOCK_H)
    h = kvh * GROUP + g
    d = tl.arange(0, BLOCK_D)
    hmask = g < GROUP
    dmask = d < HEAD_DIM
    q_off = b.to(tl.int64) * stride_qb + h[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_off, mask=hmask[:, None] & dmask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_D), tl.float32)
    row = n_kv_heads * HEAD_DIM
    for n0 in range(lo, hi, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pmask = pos < hi
        slot = tl.load(r2t_ptr + req * stride_r2t + pos, mask=pmask, other=0).to(tl.int64)
        kv_off = slot[:, None] * row + kvh * HEAD_DIM + d[None, :]
        kv_mask = pmask[:, None] & dmask[None, :]
        k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
        if HAS_SOFTCAP:
            s = tl_soft_cap(s, softcap)
        s = tl.where(pmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.log(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    mid = (b * n_kv_heads * GROUP + h).to(tl.int64) * NUM_SPLITS + split
    tl.store(mid_o_ptr + mid[:, None] * HEAD_DIM + d[None, :], out, mask=hmask[:, None] & dmask)
    tl.store(mid_lse_ptr + mid, lse, mask=hmask)


@triton.jit
def _decode_merge_kernel(
    mid_o_ptr: tl.tensor,
    mid_lse_ptr: tl.tensor,
    out_ptr: tl.tensor,
    stride_ob: tl.tensor,
    stride_oh: tl.tensor,
    n_heads: tl.tensor,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
) -> None:
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    smask = s < NUM_SPLITS
    base = (b * n_heads + h).to(tl.int64) * NUM_SPLITS
    lse = tl.load(mid_lse_ptr + base + s, mask=smask, other=float("-inf"))
    o = tl.load(
        mid_o_ptr + (base + s)[:, None] * HEAD_DIM + d[None, :],
        mask=smask[:, None] & (d[None, :] < HEAD_DIM),
        other=0.0,
    )
    m = tl.max(lse, 0)
    w = tl.where(lse > float("-inf"), tl.exp(lse - tl.where(m > float("-inf"), m, 0.0)), 0.0)
    total = tl.sum(w, 0)
    res = tl.sum(w[:, None] * o, 0) / tl.where(total > 0, total, 1.0)
    out_off = b.to(tl.int64) * stride_ob + h * stride_oh + d
    tl.store(out_ptr + out_off, res.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def paged_decode_attention_triton(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    req_to_token: torch.Tensor,
    req_slots: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Triton path (split-K flash decoding). ``num_splits``/``block_n`` override the tuning."""
    b, hq, d = q.shape
    out = torch.empty_like(q)
    if b == 0:
        return out
    hkv = k_pool.shape[1]
    group = hq // hkv
    if num_splits is None:
        want = triton.cdiv(4 * num_programs(q.device, default=8), b * hkv)
        num_splits = min(16, next_pow2(want))
    block_n = block_n or (64 if q.is_cuda else 128)
    mid_o = torch.empty(b, hq, num_splits, d, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(b, hq, num_splits, dtype=torch.float32, device=q.device)
    _decode_split_kernel[(b, hkv, num_splits)](
        q,
        k_pool,
        v_pool,
        req_to_token,
        req_slots,
        seq_lens,
        mid_o,
        mid_lse,
        float(scale),
        int(sliding_window or 0),
        float(softcap or 1.0),
        q.stride(0),
        q.stride(1),
        req_to_token.stride(0),
        hkv,
        GROUP=group,
        HEAD_DIM=d,
        NUM_SPLITS=num_splits,
        HAS_WINDOW=sliding_window is not None,
        HAS_SOFTCAP=softcap is not None,
        BLOCK_H=max(16, next_pow2(group)),
        BLOCK_D=max(16, next_pow2(d)),
        BLOCK_N=block_n,
        DOT_PRECISION="tf32" if q.is_cuda and q.dtype != torch.float32 else "ieee",
        UPCAST=not q.is_cuda,
        num_warps=4,
        num_stages=2,
    )
    _decode_merge_kernel[(b, hq)](
        mid_o,
        mid_lse,
        out,
        out.stride(0),
        out.stride(1),
        hq,
        HEAD_DIM=d,
        NUM_SPLITS=num_splits,
        BLOCK_S=next_pow2(num_splits),
        BLOCK_D=next_pow2(d),
    )
    return out

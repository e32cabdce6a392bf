"""Extend (prefill) attention over the paged KV pool with variable-length requests.

``q`` packs the new tokens of B requests in order: request ``b`` owns rows
``[sum(extend_lens[:b]), + extend_lens[b])`` at positions ``prefix_lens[b] + j``. The K/V of all
positions ``[0, prefix + extend)`` are already in the pool (``store_kv`` runs first). Causal; with
``sliding_window`` w a query at ``qpos`` sees keys ``kpos`` with ``qpos - w < kpos <= qpos``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._attn_common import check_paged_attention, soft_capped, tl_soft_cap
from ._dispatch import choose_impl, next_pow2
from ._extend_native import native_extend


def extend_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    req_to_token: torch.Tensor,
    req_slots: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Causal attention of the packed new tokens ``q`` [T, Hq, D]; returns [T, Hq, D].

    ``req_slots``/``prefix_lens``/``extend_lens`` are [B] ints; ``extend_lens`` must sum to T
    (zeros allowed). Softmax in fp32; output in q's dtype. With ``softcap`` c the scaled scores
    become ``c * tanh(score / c)`` before the softmax.
    """
    check_paged_attention(
        q,
        k_pool,
        v_pool,
        req_to_token,
        {"req_slots": req_slots, "prefix_lens": prefix_lens, "extend_lens": extend_lens},
        scale=scale,
        sliding_window=sliding_window,
        softcap=softcap,
    )
    if extend_lens.device.type == "cpu" and int(extend_lens.sum()) != q.shape[0]:
        raise ValueError(
            f"extend_lens must sum to q's token count ({q.shape[0]}), got {int(extend_lens.sum())}"
        )
    if q.shape[0] == 0:
        return torch.empty_like(q)
    fn = (
        extend_attention_triton
        if choose_impl(impl, q.device) == "triton"
        else extend_attention_torch
    )
    return fn(
        q,
        k_pool,
        v_pool,
        req_to_token,
        req_slots,
        prefix_lens,
        extend_lens,
        scale=scale,
        sliding_window=sliding_window,
        softcap=softcap,
    )


def extend_attention_torch(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    req_to_token: torch.Tensor,
    req_slots: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    native: bool = True,
) -> torch.Tensor:
    """Reference / CPU path: per request, the C kernel (``_extend_native``: fp32) when
    ``native`` and it can run, else one ``scaled_dot_product_attention`` (explicit scores where
    a soft cap must change them).

    Without a sliding window and a cached prefix the causal mask is implicit (torch's fused
    flash kernel); with a prefix it is the bottom-right aligned boolean mask (what torch's
    `causal_lower_right` materializes on the CPU; on CUDA the Triton kernel serves). GQA is
    handled by SDPA itself, so K/V are never repeated.
    """
    out = torch.empty_like(q)
    offset = 0
    for req, pre, ext in zip(
        req_slots.tolist(), prefix_lens.tolist(), extend_lens.tolist(), strict=True
    ):
        if ext == 0:
            continue
        rows = slice(offset, offset + ext)
        got = None
        if native:
            slots = req_to_token[req, : pre + ext]
            got = native_extend(
                q[rows], k_pool, v_pool, slots, pre,
                scale=scale, sliding_window=sliding_window, softcap=softcap,
            )  # fmt: skip
        if got is not None:
            out[rows] = got
        elif sliding_window or softcap is not None:
            out[rows] = _windowed(
                q[rows], k_pool, v_pool, req_to_token[req], pre, sliding_window, scale, softcap
            )
        else:
            out[rows] = _causal(q[rows], k_pool, v_pool, req_to_token[req], pre, scale)
        offset += ext
    return out


def _causal(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots_row: torch.Tensor,
    pre: int,
    scale: float,
) -> torch.Tensor:
    """One request's causal attention over its prefix + new tokens."""
    ext = q.shape[0]
    slots = slots_row[: pre + ext].long()
    k = k_pool[slots].transpose(0, 1).unsqueeze(0)  # [1, hkv, n, d]
    v = v_pool[slots].transpose(0, 1).unsqueeze(0)
    qb = q.transpose(0, 1).unsqueeze(0)  # [1, hq, ext, d]
    # bottom-right aligned: new token i sees the prefix and new tokens up to i (what torch's
    # causal_lower_right materializes on the CPU; importing it costs ~0.9 s of torch._dynamo)
    mask = torch.ones(ext, pre + ext, dtype=torch.bool, device=q.device).tril(pre) if pre else None
    o = F.scaled_dot_product_attention(
        qb, k, v, attn_mask=mask, is_causal=not pre, scale=scale, enable_gqa=True
    )
    return o[0].transpose(0, 1)


def _windowed(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots_row: torch.Tensor,
    pre: int,
    window: int | None,
    scale: float,
    softcap: float | None = None,
) -> torch.Tensor:
    """One request's attention with an explicit mask (a sliding window, or none) and, with a
    soft cap, explicit scores; GQA folded into the query length ([Hkv, G * e, D]) so K/V are
    never repeated."""
    ext, hq, d = q.shape
    hkv = k_pool.shape[1]
    group = hq // hkv
    total = pre + ext
    k_lo = max(0, pre - window + 1) if window else 0
    slots = slots_row[k_lo:total].long()
    k = k_pool[slots].transpose(0, 1)  # [hkv, n, d]
    v = v_pool[slots].transpose(0, 1)
    qb = q.view(ext, hkv, group, d).permute(1, 2, 0, 3).reshape(hkv, group * ext, d)
    qpos = torch.arange(pre, total, device=q.device).unsqueeze(1)
    kpos = torch.arange(k_lo, total, device=q.device).unsqueeze(0)
    mask = kpos <= qpos
    if window:
        mask &= kpos > qpos - window
    mask = mask.repeat(group, 1)
    if softcap is None:
        o = F.scaled_dot_product_attention(qb, k, v, attn_mask=mask, scale=scale)
    else:
        scores = soft_capped(torch.bmm(qb.float(), k.float().transpose(1, 2)).mul_(scale), softcap)
        probs = torch.softmax(scores.masked_fill_(~mask, float("-inf")), dim=-1)
        o = torch.bmm(probs, v.float()).to(q.dtype)
    return o.view(hkv, group, ext, d).permute(2, 0, 1, 3).reshape(ext, hq, d)


@triton.jit
def _extend_kernel(
    q_ptr: tl.tensor,
    k_ptr: tl.tensor,
    v_ptr: tl.tensor,
    out_ptr: tl.tensor,
    r2t_ptr: tl.tensor,
    req_slots_ptr: tl.tensor,
    prefix_lens_ptr: tl.tensor,
    extend_lens_ptr: tl.tensor,
    q_start_ptr: tl.tensor,
    scale: tl.tensor,
    window: tl.tensor,
    softcap: tl.tensor,
    stride_qt: tl.tensor,
    stride_qh: tl.tensor,
    stride_ot: tl.tensor,
    stride_oh: tl.tensor,
    stride_r2t: tl.tensor,
    n_kv_heads: tl.tensor,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
) -> None:
    b = tl.program_id(0)
    h = tl.program_id(1)
    mb = tl.program_id(2)
    ext = tl.load(extend_lens_ptr + b).to(tl.int32)
    pre = tl.load(prefix_lens_ptr + b).to(tl.int32)
    q_start = tl.load(q_start_ptr + b).to(tl.int64)
    req = tl.load(req_slots_ptr + b).to(tl.int64)
    kvh = h // GROUP

    m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    mmask = m < ext
    qpos = pre + m
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    q_off = (q_start + m)[:, None] * stride_qt + h * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_off, mask=mmask[:, None] & dmask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    # Keys this block of queries can see: causal upper end, sliding-window lower end.
    k_hi = tl.where(mb * BLOCK_M < ext, tl.minimum(pre + (mb + 1) * BLOCK_M, pre + ext), 0)
    k_lo = 0
    if HAS_WINDOW:
        k_lo = tl.maximum(pre + mb * BLOCK_M - window + 1, 0)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    row = n_kv_heads * HEAD_DIM
    for n0 in range(k_lo, k_hi, BLOCK_N):
        kpos = n0 + tl.arange(0, BLOCK_N)
        kmask = kpos < k_hi
        slot = tl.load(r2t_ptr + req * stride_r2t + kpos, mask=kmask, other=0).to(tl.int64)
        kv_off = slot[:, None] * row + kvh * HEAD_DIM + d[None, :]
        kv_mask = kmask[:, None] & dmask[None, :]
        k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
        if HAS_SOFTCAP:
            s = tl_soft_cap(s, softcap)
        visible = kmask[None, :] & (kpos[None, :] <= qpos[:, None])
        if HAS_WINDOW:
            visible = visible & (kpos[None, :] > qpos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_off = (q_start + m)[:, None] * stride_ot + h * stride_oh + d[None, :]
    tl.store(
        out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & dmask[None, :]
    )


def extend_attention_triton(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    req_to_token: torch.Tensor,
    req_slots: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Triton path: one program per (request, query head, block of query rows).

    Reads ``max(extend_lens)`` on the host to size the grid.
    """
    t, hq, d = q.shape
    out = torch.empty_like(q)
    b = extend_lens.shape[0]
    if t == 0 or b == 0:
        return out
    max_ext = int(extend_lens.max())
    hkv = k_pool.shape[1]
    block_m = block_m or (64 if q.is_cuda else 128)
    block_n = block_n or (64 if q.is_cuda else 128)
    q_start = torch.cumsum(extend_lens, 0) - extend_lens
    grid = (b, hq, triton.cdiv(max_ext, block_m))
    _extend_kernel[grid](
        q,
        k_pool,
        v_pool,
        out,
        req_to_token,
        req_slots,
        prefix_lens,
        extend_lens,
        q_start,
        float(scale),
        int(sliding_window or 0),
        float(softcap or 1.0),
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        req_to_token.stride(0),
        hkv,
        GROUP=hq // hkv,
        HEAD_DIM=d,
        HAS_WINDOW=sliding_window is not None,
        HAS_SOFTCAP=softcap is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=max(16, next_pow2(d)),
        DOT_PRECISION="tf32" if q.is_cuda and q.dtype != torch.float32 else "ieee",
        UPCAST=not q.is_cuda,
        num_warps=4,
        num_stages=2,
    )
    return out

"""CPU decode attention: the C kernel when it can run, else length-sorted groups small enough
to stay in cache; and the shared-prefix cascade. The plain entry points live in
``decode_attention``; this module holds the strategy behind its CPU path."""

from __future__ import annotations

import torch

from ._attn_common import gather_slots, soft_capped
from ._decode_native import native_decode

# Upper bound on the fp32 K (or V) elements the torch path gathers at once (2 MiB): small
# temporaries stay in cache and are reused by the allocator; large ones fault in fresh pages
# on every step (measured 2x slower decode at batch 32 x 1,500 tokens).
_TORCH_CHUNK_ELEMS = 1 << 19
# Most requests in one group (short sequences): bounds the padding to the group's longest.
_GROUP_REQUESTS = 64


def grouped_decode(
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
    with_lse: bool = False,
    native: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 attention of each query over its positions [start, seq); with ``with_lse`` also
    the log-sum-exp of the scores ([B, Hq], -inf where empty). The C kernel when ``native``
    and it can run, else torch in length-sorted groups."""
    if native:
        got = native_decode(
            q, k_pool, v_pool, req_to_token, req_slots, seq, start, scale=scale, softcap=softcap
        )
        if got is not None:
            return got[0], got[1] if with_lse else None
    b, hq, d = q.shape
    out = torch.zeros(b, hq, d, dtype=torch.float32, device=q.device)
    lse = torch.full((b, hq), float("-inf"), device=q.device) if with_lse else None
    spans = seq - start
    order = torch.argsort(spans)
    sorted_spans = spans[order].tolist()
    lo = 0
    while lo < b:
        hi = _group_end(sorted_spans, lo, row_elems=k_pool.shape[1] * d)
        if sorted_spans[hi - 1] > 0:
            idx = order[lo:hi]
            o, group_lse = _decode_chunk(
                q[idx],
                k_pool,
                v_pool,
                req_to_token,
                req_slots[idx],
                seq[idx],
                start[idx],
                span=sorted_spans[hi - 1],
                scale=scale,
                softcap=softcap,
                with_lse=with_lse,
            )
            out[idx] = o
            if lse is not None and group_lse is not None:
                lse[idx] = group_lse
        lo = hi
    return out, lse


def _group_end(sorted_spans: list[int], lo: int, *, row_elems: int) -> int:
    """End of the group starting at ``lo``: at most ``_GROUP_REQUESTS`` requests whose padded
    K (or V) stays under ``_TORCH_CHUNK_ELEMS`` elements (always at least one request)."""
    hi = lo + 1
    while (
        hi < len(sorted_spans)
        and hi - lo < _GROUP_REQUESTS
        and (hi - lo + 1) * sorted_spans[hi] * row_elems <= _TORCH_CHUNK_ELEMS
    ):
        hi += 1
    return hi


def _decode_chunk(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    req_to_token: torch.Tensor,
    req_slots: torch.Tensor,
    seq: torch.Tensor,
    start: torch.Tensor,
    *,
    span: int,
    scale: float,
    softcap: float | None,
    with_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    b, hq, d = q.shape
    hkv = k_pool.shape[1]
    pos = start.unsqueeze(1) + torch.arange(span, device=q.device)
    valid = pos < seq.unsqueeze(1)
    slots = gather_slots(req_to_token, req_slots, pos, valid)
    # Gather rows of the pool viewed as [S * Hkv, D] straight into [b, hkv, span, d] order, so
    # the batched matmuls below need no transposing copies.
    heads = torch.arange(hkv, device=q.device).view(1, hkv, 1)
    rows = (slots.unsqueeze(1) * hkv + heads).view(-1)
    k = k_pool.view(-1, d).index_select(0, rows).view(b, hkv, span, d).float()
    v = v_pool.view(-1, d).index_select(0, rows).view(b, hkv, span, d).float()
    qf = q.float().view(b, hkv, hq // hkv, d)
    scores = torch.matmul(qf, k.transpose(-1, -2)).mul_(scale)  # [b, hkv, group, span]
    scores = soft_capped(scores, softcap)
    scores.masked_fill_(~valid[:, None, None, :], float("-inf"))
    if with_lse:
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)
        probs = scores.sub_(lse).exp_()  # the softmax, from the lse already at hand
    else:
        lse, probs = None, torch.softmax(scores, dim=-1)
    if bool((seq <= start).any()):
        probs = probs.nan_to_num_(0.0)
    return torch.matmul(probs, v).view(b, hq, d), None if lse is None else lse.view(b, hq)


def shared_prefix_decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    req_to_token: torch.Tensor,
    req_slots: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float,
    shared_prefix_len: int,
) -> torch.Tensor:
    """CPU path when every request starts with the same P slots (cascade): the prefix's K/V
    are read once and scored against all queries in one matmul per kv head; each request's
    own suffix goes through the grouped path; the two parts merge by their log-sum-exps."""
    b, hq, d = q.shape
    hkv, p = k_pool.shape[1], shared_prefix_len
    seq = seq_lens.long()
    if p > int(seq.min()):
        raise ValueError(f"shared_prefix_len {p} exceeds the shortest sequence {int(seq.min())}")
    shared = req_to_token[req_slots[0].long(), :p].long()
    kp = k_pool.index_select(0, shared).float().permute(1, 2, 0)  # [hkv, d, p]
    vp = v_pool.index_select(0, shared).float().permute(1, 0, 2)  # [hkv, p, d]
    qh = q.float().view(b, hkv, hq // hkv, d).permute(1, 0, 2, 3).reshape(hkv, -1, d)
    sp = torch.bmm(qh, kp).mul_(scale)  # [hkv, b * group, p]
    lse_p = torch.logsumexp(sp, dim=-1, keepdim=True)
    o_p = torch.bmm(sp.sub_(lse_p).exp_(), vp)  # [hkv, b * group, d]
    o_p = o_p.view(hkv, b, hq // hkv, d).permute(1, 0, 2, 3).reshape(b, hq, d)
    lse_p = lse_p.view(hkv, b, hq // hkv).permute(1, 0, 2).reshape(b, hq)
    start = torch.full_like(seq, p)
    o_s, lse_s = grouped_decode(
        q, k_pool, v_pool, req_to_token, req_slots, seq, start, scale=scale, with_lse=True
    )
    assert lse_s is not None
    top = torch.maximum(lse_p, lse_s)
    w_s = torch.exp(lse_s - top).unsqueeze(-1)  # 0 where no suffix
    w_p = torch.exp(lse_p - top).unsqueeze(-1)
    return ((o_p * w_p + o_s * w_s) / (w_p + w_s)).to(q.dtype)

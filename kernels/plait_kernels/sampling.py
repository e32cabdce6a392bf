"""Top-k / min-p / top-p filtering and inverse-CDF sampling from probabilities.

Semantics, shared exactly by both paths (up to float summation order):

1. ``top_k`` in (0, V): keep tokens whose prob >= the k-th largest prob (ties kept).
2. ``min_p``: keep prob >= ``min_p * max_prob``.
3. ``top_p`` < 1: among kept tokens sorted by prob descending take the minimal prefix whose
   cumulative sum >= ``top_p * sum(kept)``; with t the prob of its last token, keep prob >= t.
4. ``target = uniforms * sum(kept)``; return the first token id (in id order) whose running
   cumsum of kept probs exceeds target, clamped to the last kept token (with prob > 0).

Sums of probabilities accumulate in float64 in both paths, so they agree with each other (and
with an exact reference) except when a draw or a threshold sits within rounding of a boundary.
Every filter is a threshold on the prob value, so both paths compute thresholds: the torch path
by ``topk`` (or a radix select over the float bits for flat distributions), the Triton kernel
by bisection over the float bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import INDEX_DTYPES, check_tensor, choose_impl

_FLOAT_ARGS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# Thresholds come from ``topk`` (or a sort) of at most this many values per row, else from a
# radix select.
_TOPK_LIMIT = 256
# Block size of the torch path's inverse CDF.
_CDF_BLOCK = 256


def top_k_top_p_sample(
    probs: torch.Tensor,
    *,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None = None,
    uniforms: torch.Tensor,
    impl: str = "auto",
) -> torch.Tensor:
    """Sample one token id per row of ``probs`` [B, V] float32; returns int64 [B].

    ``top_k`` [B] int (<= 0 or >= V: off), ``top_p`` [B] float (1.0: off), ``min_p`` [B] float or
    None, ``uniforms`` [B] float in [0, 1) drives the inverse-CDF draw (see the module doc).
    """
    check_tensor("probs", probs, ndim=2, dtypes=(torch.float32,), last_contiguous=True)
    b = probs.shape[0]
    dev = probs.device
    check_tensor("top_k", top_k, shape=(b,), dtypes=INDEX_DTYPES, device=dev)
    check_tensor("top_p", top_p, shape=(b,), dtypes=_FLOAT_ARGS, device=dev)
    if min_p is not None:
        check_tensor("min_p", min_p, shape=(b,), dtypes=_FLOAT_ARGS, device=dev)
    check_tensor("uniforms", uniforms, shape=(b,), dtypes=_FLOAT_ARGS, device=dev)
    if probs.shape[1] == 0:
        raise ValueError("probs must have at least one column (vocab size 0)")
    if b == 0:
        return torch.empty(0, dtype=torch.int64, device=dev)
    if choose_impl(impl, dev) == "triton":
        return top_k_top_p_sample_triton(
            probs, top_k=top_k, top_p=top_p, min_p=min_p, uniforms=uniforms
        )
    return top_k_top_p_sample_torch(probs, top_k=top_k, top_p=top_p, min_p=min_p, uniforms=uniforms)


def top_k_top_p_sample_torch(
    probs: torch.Tensor,
    *,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None = None,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """Reference / CPU path: ``topk`` or a radix select for each threshold (no full sort of a
    large vocab), then a blocked inverse CDF."""
    b, v = probs.shape
    thr = torch.zeros(b, dtype=torch.float32, device=probs.device)
    k = top_k.long()
    has_k = (k > 0) & (k < v)
    if bool(has_k.any()):
        rows = has_k.nonzero().squeeze(1)
        thr[rows] = _kth_largest(_rows(probs, rows), k[rows])
    if min_p is not None:
        thr = torch.maximum(thr, min_p.float() * probs.amax(-1))
    has_p = top_p < 1
    if bool(has_p.any()):
        rows = has_p.nonzero().squeeze(1)
        p = _rows(probs, rows)
        w = _keep_ge(p, thr[rows])
        t = _top_p_threshold(w, top_p[rows].double() * _block_sums(w).sum(-1))
        thr[rows] = torch.maximum(thr[rows], torch.minimum(t, w.amax(-1)))
    w = _keep_ge(probs, thr) if bool((thr > 0).any()) else probs
    return _inverse_cdf(w, uniforms.float())


def _keep_ge(p: torch.Tensor, thr: torch.Tensor) -> torch.Tensor:
    """``p`` where ``p >= thr`` (per row), else 0."""
    zero = torch.zeros((), dtype=p.dtype, device=p.device)
    return torch.where(p >= thr.unsqueeze(1), p, zero)


def _block_sums(w: torch.Tensor) -> torch.Tensor:
    """float64 sums of consecutive ``_CDF_BLOCK``-wide blocks of each row (the last block may be
    shorter): fp32 within a block, float64 across blocks, and no copy of ``w``."""
    n, v = w.shape
    full = v // _CDF_BLOCK
    main = w.as_strided((n, full, _CDF_BLOCK), (w.stride(0), _CDF_BLOCK, 1)).sum(-1)
    if full * _CDF_BLOCK == v:
        return main.double()
    tail = w[:, full * _CDF_BLOCK :].sum(-1, keepdim=True)
    return torch.cat([main, tail], 1).double()


def _rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``x[rows]`` without the copy when ``rows`` selects every row."""
    return x if rows.numel() == x.shape[0] else x[rows]


def _kth_largest(p: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The k[i]-th largest value of each row (1-based)."""
    kmax = int(k.max())
    if kmax <= _TOPK_LIMIT:
        vals = p.topk(kmax, dim=-1).values
        return vals.gather(1, (k - 1).unsqueeze(1)).squeeze(1)
    return _radix_select(p, torch.ones_like(p), k.double())


def _top_p_threshold(w: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Prob of the last token of the minimal descending prefix of ``w`` whose sum >= target."""
    n, v = w.shape
    kk = min(v, _TOPK_LIMIT)
    vals = w.sort(dim=-1, descending=True).values if v <= _TOPK_LIMIT else w.topk(kk).values
    cs = vals.cumsum(-1, dtype=torch.float64)
    idx = torch.searchsorted(cs, target.unsqueeze(1)).clamp_max(kk - 1)
    t = vals.gather(1, idx).squeeze(1)
    unresolved = cs[:, -1] < target
    if kk < v and bool(unresolved.any()):
        # The prefix runs past the top candidates (a flat distribution): radix select.
        rows = unresolved.nonzero().squeeze(1)
        sub = _rows(w, rows)
        t[rows] = _radix_select(sub, sub, target[rows])
    return t


def _radix_select(p: torch.Tensor, w: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Largest value t (an entry of ``p`` >= 0) with ``sum(w[p >= t]) >= target``, per row.

    Non-negative floats order like their int32 bits. Histogram the weight by the high 15 bits
    and keep the bucket where the mass counted from the top crosses ``target``; then sort just
    that bucket's entries (all rows at once, as one flat array) to find the exact value.
    """
    n = p.shape[0]
    dev = p.device
    keys = p.view(torch.int32) & 0x7FFFFFFF
    high = (keys >> 16).long()
    hist = torch.zeros(n, 1 << 15, dtype=w.dtype, device=dev).scatter_add_(1, high, w).double()
    suffix = hist.sum(-1, keepdim=True) - hist.cumsum(-1) + hist  # mass of buckets >= j
    j = (torch.count_nonzero(suffix >= target.unsqueeze(1), dim=-1) - 1).clamp_min(0)
    above = torch.cat([suffix, suffix.new_zeros(n, 1)], 1).gather(1, (j + 1).unsqueeze(1))
    flat = (high == j.unsqueeze(1)).view(-1).nonzero().squeeze(1)
    rows = flat // p.shape[1]
    counts = torch.bincount(rows, minlength=n)
    low = keys.view(-1)[flat] & 0xFFFF
    order = torch.argsort(rows * 65536 + (65535 - low))  # by row, then value descending
    flat = flat[order]
    vals = p.reshape(-1)[flat]
    running = w.reshape(-1)[flat].cumsum(0, dtype=torch.float64)
    starts = torch.cumsum(counts, 0) - counts
    before = torch.where(starts > 0, running[(starts - 1).clamp_min(0)], 0.0) if n else running
    running = running - before[rows] + above.squeeze(1)[rows]
    ids = torch.arange(vals.numel(), device=dev)
    hit = torch.where(running >= target[rows], ids, vals.numel())
    first = torch.full((n,), vals.numel(), device=dev).scatter_reduce_(0, rows, hit, "amin")
    last = (starts + counts - 1).clamp_min(0)
    pick = torch.where(first < vals.numel(), first, last)
    return torch.where(counts > 0, vals[pick.clamp_max(max(vals.numel() - 1, 0))], 0.0)


def _inverse_cdf(w: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """First id whose running sum of ``w`` exceeds ``u * sum(w)`` (else the last id with w > 0),
    via block sums so only one block per row is scanned element by element."""
    b, v = w.shape
    bs = _CDF_BLOCK
    bsum = _block_sums(w)
    nb = bsum.shape[1]
    cb = bsum.cumsum(-1)
    target = u.double() * cb[:, -1]
    blk = torch.searchsorted(cb, target.unsqueeze(1), right=True).squeeze(1)
    ids = torch.arange(max(nb, bs), device=w.device)
    last_blk = torch.where(bsum > 0, ids[:nb], -1).amax(-1).clamp_min(0)
    blk = torch.minimum(blk, last_blk)
    rows = torch.arange(b, device=w.device)
    cols = blk.unsqueeze(1) * bs + ids[:bs]
    inner = torch.where(cols < v, w.gather(1, cols.clamp_max(v - 1)), 0.0)  # [b, bs]
    before = torch.where(blk > 0, cb[rows, (blk - 1).clamp_min(0)], 0.0)
    running = before.unsqueeze(1) + inner.cumsum(-1, dtype=torch.float64)
    pos = torch.searchsorted(running, target.unsqueeze(1), right=True).squeeze(1)
    last_in = torch.where(inner > 0, ids[:bs], -1).amax(-1).clamp_min(0)
    return blk * bs + torch.minimum(pos, last_in)


# ---------------------------------------------------------------------------------------------
# Triton path: one program per row; thresholds by bisection over the float bits (no sort).
# ---------------------------------------------------------------------------------------------


@triton.jit
def _count_or_mass_ge(
    row_ptr: tl.tensor,
    vocab: tl.tensor,
    key: tl.tensor,
    thr: tl.tensor,
    BY_MASS: tl.constexpr,
    BLOCK: tl.constexpr,
) -> tl.tensor:
    """Sum over the row of 1 (count) or p (mass) for entries with p >= thr and bits >= key."""
    total = tl.zeros((BLOCK,), tl.float64)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        p = tl.load(row_ptr + offs, mask=offs < vocab, other=-1.0)
        bits = p.to(tl.int32, bitcast=True)
        hit = (bits >= key) & (p >= thr)
        if BY_MASS:
            total += tl.where(hit, p, 0.0).to(tl.float64)
        else:
            total += tl.where(hit, 1.0, 0.0).to(tl.float64)
    return tl.sum(total, 0)


@triton.jit
def _bisect_threshold(
    row_ptr: tl.tensor,
    vocab: tl.tensor,
    thr: tl.tensor,
    target: tl.tensor,
    BY_MASS: tl.constexpr,
    BLOCK: tl.constexpr,
) -> tl.tensor:
    """Largest float bit pattern t with f(t) >= target (f non-increasing), as a float."""
    lo = tl.zeros((), tl.int32)
    hi = tl.full((), 0x7F800001, tl.int32)
    for _ in range(31):
        mid = lo + (hi - lo) // 2
        ok = _count_or_mass_ge(row_ptr, vocab, mid, thr, BY_MASS, BLOCK) >= target
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    return lo.to(tl.float32, bitcast=True)


@triton.jit
def _sample_kernel(
    probs_ptr: tl.tensor,
    top_k_ptr: tl.tensor,
    top_p_ptr: tl.tensor,
    min_p_ptr: tl.tensor,
    uniforms_ptr: tl.tensor,
    out_ptr: tl.tensor,
    vocab: tl.tensor,
    stride_row: tl.tensor,
    HAS_MIN_P: tl.constexpr,
    BLOCK: tl.constexpr,
) -> None:
    row = tl.program_id(0)
    row_ptr = probs_ptr + row.to(tl.int64) * stride_row
    k = tl.load(top_k_ptr + row).to(tl.int64)
    top_p = tl.load(top_p_ptr + row).to(tl.float32)
    u = tl.load(uniforms_ptr + row).to(tl.float32)

    thr = 0.0
    if (k > 0) & (k < vocab):
        thr = _bisect_threshold(row_ptr, vocab, -1.0, k.to(tl.float64), False, BLOCK)
    if HAS_MIN_P:
        vmax = tl.zeros((BLOCK,), tl.float32)
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            vmax = tl.maximum(vmax, tl.load(row_ptr + offs, mask=offs < vocab, other=0.0))
        thr = tl.maximum(thr, tl.load(min_p_ptr + row).to(tl.float32) * tl.max(vmax, 0))
    if top_p < 1.0:
        kept_sum = tl.zeros((BLOCK,), tl.float64)
        kept_max = tl.zeros((BLOCK,), tl.float32)
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            p = tl.load(row_ptr + offs, mask=offs < vocab, other=-1.0)
            kept_sum += tl.where(p >= thr, p, 0.0).to(tl.float64)
            kept_max = tl.maximum(kept_max, tl.where(p >= thr, p, 0.0))
        target = top_p.to(tl.float64) * tl.sum(kept_sum, 0)
        t = _bisect_threshold(row_ptr, vocab, thr, target, True, BLOCK)
        thr = tl.maximum(thr, tl.minimum(t, tl.max(kept_max, 0)))

    kept_sum = tl.zeros((BLOCK,), tl.float64)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        p = tl.load(row_ptr + offs, mask=offs < vocab, other=-1.0)
        kept_sum += tl.where(p >= thr, p, 0.0).to(tl.float64)
    goal = u.to(tl.float64) * tl.sum(kept_sum, 0)
    running = tl.zeros((), tl.float64)
    first = vocab
    last = -1
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        p = tl.load(row_ptr + offs, mask=offs < vocab, other=-1.0)
        kept = p >= thr
        c = running + tl.cumsum(tl.where(kept, p, 0.0).to(tl.float64), 0)
        first = tl.minimum(first, tl.min(tl.where(kept & (c > goal), offs, vocab), 0))
        last = tl.maximum(last, tl.max(tl.where(kept & (p > 0), offs, -1), 0))
        running = tl.max(c, 0)
    tl.store(out_ptr + row, tl.maximum(tl.minimum(first, last), 0).to(tl.int64))


def top_k_top_p_sample_triton(
    probs: torch.Tensor,
    *,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None = None,
    uniforms: torch.Tensor,
    block: int | None = None,
) -> torch.Tensor:
    """Triton path: one program per row, each threshold by a 31-step bisection."""
    b, v = probs.shape
    out = torch.empty(b, dtype=torch.int64, device=probs.device)
    if b == 0:
        return out
    block = block or min(triton.next_power_of_2(v), 4096 if probs.is_cuda else 1 << 17)
    _sample_kernel[(b,)](
        probs,
        top_k,
        top_p,
        min_p if min_p is not None else top_p,
        uniforms,
        out,
        v,
        probs.stride(0),
        HAS_MIN_P=min_p is not None,
        BLOCK=block,
        num_warps=8,
    )
    return out

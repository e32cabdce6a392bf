"""Grammar masks: set logits of disallowed tokens to -inf from an xgrammar-packed bitmask.

Bit ``j`` of int32 word ``w`` (little-endian bit order) stands for token ``w * 32 + j``; a set bit
means allowed. Logits columns past ``W * 32`` are masked; bits past the logits width are ignored.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from ._dispatch import FLOAT_DTYPES, INDEX_DTYPES, check_tensor, choose_impl, num_programs

try:  # xgrammar's native CPU kernel: the fastest option for mostly-allowed masks
    from xgrammar.kernels.apply_token_bitmask_inplace_cpu import (
        apply_token_bitmask_inplace_cpu as _xgrammar_kernel,
    )
except ImportError:  # pragma: no cover - xgrammar is a dependency, but stay usable without
    _xgrammar_kernel = None  # type: ignore[assignment]

# -inf as raw bits, per dtype (the CPU path writes integers through a same-width view).
_NEG_INF_BITS = {torch.float32: -8388608, torch.bfloat16: -128, torch.float16: -1024}
_INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
_NP_INT = {torch.int32: np.int32, torch.int16: np.int16}


def apply_token_bitmask(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    *,
    indices: torch.Tensor | Sequence[int] | None = None,
    impl: str = "auto",
) -> None:
    """Mask ``logits`` [B, V] in place with ``bitmask`` [Bm, W] int32 (clear bit -> -inf).

    Without ``indices`` every logits row ``i`` uses bitmask row ``i`` (``Bm`` must equal ``B``).
    With ``indices`` only logits rows ``indices[i]`` are masked, each with bitmask row
    ``indices[i]`` (the semantics of ``xgrammar.apply_token_bitmask_inplace``). A CPU bitmask
    with CUDA logits is copied to the GPU first (non-blocking).
    """
    check_tensor("logits", logits, ndim=2, dtypes=FLOAT_DTYPES, last_contiguous=True)
    device = logits.device
    if device.type != "cpu" and isinstance(bitmask, torch.Tensor) and bitmask.device.type == "cpu":
        bitmask = bitmask.to(device, non_blocking=True)  # xgrammar fills it on the host
    rows = _check(logits, bitmask, indices)
    if logits.shape[0] == 0 or (rows is not None and rows.numel() == 0):
        return
    if choose_impl(impl, device) == "triton":
        apply_token_bitmask_triton(logits, bitmask, rows)
    else:
        apply_token_bitmask_torch(logits, bitmask, rows)


def _check(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | Sequence[int] | None
) -> torch.Tensor | None:
    check_tensor(
        "bitmask",
        bitmask,
        ndim=2,
        dtypes=(torch.int32,),
        device=logits.device,
        last_contiguous=True,
    )
    if indices is None:
        if bitmask.shape[0] != logits.shape[0]:
            raise ValueError(
                f"bitmask must have one row per logits row ({logits.shape[0]}) when indices is "
                f"None, got shape {tuple(bitmask.shape)}"
            )
        return None
    if isinstance(indices, torch.Tensor):
        check_tensor("indices", indices, ndim=1, dtypes=INDEX_DTYPES)
        rows = indices.to(device=logits.device, dtype=torch.int64)
    else:
        rows = torch.as_tensor(list(indices), dtype=torch.int64).to(logits.device)
        if rows.dim() != 1:
            raise ValueError(f"indices must be a flat sequence of ints, got {indices!r}")
    if rows.device.type == "cpu" and rows.numel() > 0:
        limit = min(logits.shape[0], bitmask.shape[0])
        if int(rows.min()) < 0 or int(rows.max()) >= limit:
            raise ValueError(
                f"indices must lie in [0, {limit}) (rows of logits and bitmask), "
                f"got min {int(rows.min())} max {int(rows.max())}"
            )
    return rows


# ---------------------------------------------------------------------------------------------
# torch path (the production CPU path)
# ---------------------------------------------------------------------------------------------


def apply_token_bitmask_torch(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    rows: torch.Tensor | None = None,
    *,
    native_sparse: bool = True,
) -> None:
    """Reference / CPU path. ``rows``: int64 logits (and bitmask) rows to mask, or None = all.

    On CPU, masks where at most a third of the words have a clear bit (mostly-allowed masks)
    go to xgrammar's native CPU kernel when ``native_sparse`` (~1.5x faster there than the
    vectorized ``_scatter_sparse``, used otherwise); every other mask takes the vectorized
    unpack + fill, 2-4x faster than xgrammar's bit loop on mostly-disallowed masks.
    """
    vocab, words = logits.shape[1], bitmask.shape[1]
    covered = min(vocab, words * 32)
    if vocab > covered:
        if rows is None:
            logits[:, covered:] = float("-inf")
        else:
            logits[rows, covered:] = float("-inf")
    if covered == 0:
        return
    if logits.device.type == "cpu" and not logits.requires_grad:
        _apply_cpu(logits, bitmask, rows, covered, native_sparse=native_sparse)
    else:
        _apply_generic(logits, bitmask, rows, covered)


def _apply_generic(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None, covered: int
) -> None:
    """Any-device path: unpack all bits, masked fill."""
    nw = (covered + 31) // 32
    bm = bitmask[:, :nw] if rows is None else bitmask[rows, :nw]
    shifts = torch.arange(32, device=bm.device, dtype=torch.int32)
    disallowed = ((bm.unsqueeze(-1) >> shifts) & 1).view(bm.shape[0], -1)[:, :covered] == 0
    if rows is None:
        logits[:, :covered].masked_fill_(disallowed, float("-inf"))
    else:
        logits[rows, :covered] = logits[rows, :covered].masked_fill_(disallowed, float("-inf"))


def _apply_cpu(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    rows: torch.Tensor | None,
    covered: int,
    *,
    native_sparse: bool,
) -> None:
    """CPU path: sparse scatter when few words have clear bits, else dense unpack + fill."""
    nw = (covered + 31) // 32
    bm = bitmask.numpy()
    rows_np = None if rows is None else rows.numpy()
    if native_sparse:
        # Estimate the share of words with a clear bit from every 61st word (cheap, and enough
        # to pick the faster kernel; both are exact).
        sample = bm[:, :nw:61] if rows_np is None else bm[rows_np, :nw:61]
        sparse = 3 * np.count_nonzero(sample != -1) <= sample.size
        if sparse and _xgrammar_cpu(logits, bitmask, rows, covered):
            return
    words = bm[:, :nw] if rows_np is None else bm[rows_np, :nw]
    if covered % 32:
        # Bits past the logits width count as allowed: nothing is written there.
        words = np.array(words)
        words[:, -1] |= np.int32(np.uint32(0xFFFFFFFF) << np.uint32(covered % 32))
    words = np.ascontiguousarray(words)
    flat = words.reshape(-1)
    nonfull_mask = flat != -1
    n_nonfull = int(np.count_nonzero(nonfull_mask))
    if n_nonfull == 0:
        return
    if n_nonfull * 3 <= flat.size:
        _scatter_sparse(logits, flat, np.flatnonzero(nonfull_mask), nw, rows_np)
    else:
        mixed = n_nonfull - int(np.count_nonzero(flat == 0))
        _fill_dense(logits, words, rows, covered, branch_free=2 * mixed > flat.size)


def _xgrammar_cpu(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None, covered: int
) -> bool:
    """Run xgrammar's native CPU kernel on ``logits[:, :covered]``; False if unavailable."""
    if _xgrammar_kernel is None:  # pragma: no cover - xgrammar is a dependency
        return False
    indices = None if rows is None else rows.tolist()
    _xgrammar_kernel(logits, bitmask, vocab_size=covered, indices=indices)
    return True


def _scatter_sparse(
    logits: torch.Tensor, flat: np.ndarray, nonfull: np.ndarray, nw: int, rows: np.ndarray | None
) -> None:
    """Write -inf only at clear bits: the cost grows with the number of words that have any."""
    stride = logits.stride(0)
    if rows is None and stride == nw * 32:
        base = nonfull << 5
    else:
        r = nonfull // nw
        base = (r if rows is None else rows[r]) * stride + (nonfull - r * nw) * 32
    int_dtype = _INT_VIEW[logits.dtype]
    raw = logits.view(int_dtype).numpy()
    span = (logits.shape[0] - 1) * stride + logits.shape[1]
    out = np.lib.stride_tricks.as_strided(raw, shape=(span,), strides=(raw.itemsize,))
    value = _NP_INT[int_dtype](_NEG_INF_BITS[logits.dtype])
    cleared = ~flat[nonfull]
    for _ in range(2):
        # Lowest clear bit of every word at once: the float32 exponent of the isolated bit.
        low = cleared & -cleared
        out[base + (((low.astype(np.float32).view(np.int32) >> 23) & 255) - 127)] = value
        cleared ^= low
        left = np.flatnonzero(cleared != 0)
        if left.size == 0:
            return
        cleared, base = cleared[left], base[left]
    hit = np.flatnonzero(np.unpackbits(cleared.view(np.uint8), bitorder="little").view(np.bool_))
    out[base[hit >> 5] + (hit & 31)] = value


def _fill_dense(
    logits: torch.Tensor,
    words: np.ndarray,
    rows: torch.Tensor | None,
    covered: int,
    *,
    branch_free: bool,
) -> None:
    """Unpack every bit; fill with a predicated where, or a branch-free bit blend when the
    allowed/disallowed pattern is too mixed for branch prediction."""
    dis = np.unpackbits((~words).view(np.uint8), axis=-1, bitorder="little")[:, :covered]
    target = logits[:, :covered] if rows is None else logits[rows, :covered]
    if branch_free:
        # raw = (raw & ~sel) | (NEG_INF & sel), with sel all-ones where disallowed; in place.
        int_dtype = _INT_VIEW[logits.dtype]
        raw = target.view(int_dtype).numpy()
        sel = dis.astype(raw.dtype)
        np.negative(sel, out=sel)
        np.invert(sel, out=sel)
        raw &= sel
        np.invert(sel, out=sel)
        sel &= _NEG_INF_BITS[logits.dtype]
        raw |= sel
    else:
        neg = torch.tensor(float("-inf"), dtype=logits.dtype)
        torch.where(torch.from_numpy(dis).view(torch.bool), neg, target, out=target)
    if rows is not None:
        logits[rows, :covered] = target


# ---------------------------------------------------------------------------------------------
# Triton path
# ---------------------------------------------------------------------------------------------


@triton.jit
def _bitmask_kernel(
    logits_ptr: tl.tensor,
    bitmask_ptr: tl.tensor,
    rows_ptr: tl.tensor,
    n_rows: tl.tensor,
    vocab: tl.tensor,
    n_words: tl.tensor,
    stride_logits: tl.tensor,
    stride_bitmask: tl.tensor,
    HAS_ROWS: tl.constexpr,
    BLOCK_W: tl.constexpr,
) -> None:
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    n_blocks = tl.cdiv(vocab, BLOCK_W * 32)
    bit = tl.arange(0, 32)
    neg = tl.full((BLOCK_W, 32), float("-inf"), logits_ptr.dtype.element_ty)
    for work in range(pid, n_rows * n_blocks, nprog):
        i = work // n_blocks
        blk = work % n_blocks
        row = tl.load(rows_ptr + i).to(tl.int64) if HAS_ROWS else i.to(tl.int64)
        w = blk * BLOCK_W + tl.arange(0, BLOCK_W)
        packed = tl.load(bitmask_ptr + row * stride_bitmask + w, mask=w < n_words, other=0)
        clear = ((packed[:, None] >> bit[None, :]) & 1) == 0
        tok = w[:, None] * 32 + bit[None, :]
        tl.store(logits_ptr + row * stride_logits + tok, neg, mask=clear & (tok < vocab))


def apply_token_bitmask_triton(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    rows: torch.Tensor | None = None,
    *,
    block_words: int = 128,
    programs: int | None = None,
) -> None:
    """Triton path: a persistent grid; stores -inf at clear bits and never loads logits."""
    n_rows = logits.shape[0] if rows is None else rows.numel()
    if n_rows == 0:
        return
    vocab = logits.shape[1]
    n_blocks = triton.cdiv(vocab, block_words * 32)
    grid = min(programs or 4 * num_programs(logits.device), n_rows * n_blocks)
    _bitmask_kernel[(grid,)](
        logits,
        bitmask,
        rows if rows is not None else bitmask,
        n_rows,
        vocab,
        bitmask.shape[1],
        logits.stride(0),
        bitmask.stride(0),
        HAS_ROWS=rows is not None,
        BLOCK_W=block_words,
        num_warps=4,
    )

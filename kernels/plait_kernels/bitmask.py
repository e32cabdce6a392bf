"""Grammar masks: set logits of disallowed tokens to -inf from an xgrammar-packed bitmask.

Bit ``j`` of int32 word ``w`` (little-endian bit order) stands for token ``w * 32 + j``; a set bit
means allowed. Logits columns past ``W * 32`` are masked; bits past the logits width are ignored.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence

import torch
import triton
import triton.language as tl

from ._dispatch import FLOAT_DTYPES, INDEX_DTYPES, check_tensor, choose_impl, num_programs
from ._native import load_native


@functools.cache
def _xgrammar_cpu() -> Callable[..., None] | None:
    """xgrammar's CPU kernel: the fallback when the C kernel cannot be built (no compiler),
    imported then (xgrammar takes a tenth of a second to import)."""
    try:
        from xgrammar.kernels.apply_token_bitmask_inplace_cpu import (
            apply_token_bitmask_inplace_cpu,
        )
    except ImportError:  # pragma: no cover - xgrammar is a dependency, but stay usable without
        return None
    return apply_token_bitmask_inplace_cpu  # type: ignore[no-any-return]


# -inf as raw bits, per dtype (the C kernel writes integers of the element's width).
_NEG_INF_BITS = {torch.float32: 0xFF800000, torch.bfloat16: 0xFF80, torch.float16: 0xFC00}


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


def prepare_cpu_kernel() -> bool:
    """Build (or load) the CPU kernel now instead of at the first masked batch; False when
    it cannot be built (masks then use xgrammar's CPU kernel)."""
    return load_native("bitmask_cpu") is not None


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
    native: bool = True,
) -> None:
    """Reference / CPU path. ``rows``: int64 logits (and bitmask) rows to mask, or None = all.

    CPU tensors go to the C kernel ``csrc/bitmask_cpu.c`` when ``native`` and it could be built
    (it skips all-allowed words with one compare, so mostly-allowed masks cost little), else
    (no C compiler) to xgrammar's CPU kernel; other devices, tensors that need grad, and
    ``native=False`` take the vectorized unpack + masked fill of :func:`_apply_generic`.
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
    on_cpu = logits.device.type == "cpu" and not logits.requires_grad
    if on_cpu and native:
        if _apply_native(logits, bitmask, rows, covered):
            return
        fallback = _xgrammar_cpu()
        if fallback is not None:
            indices = None if rows is None else rows.tolist()
            fallback(logits, bitmask, vocab_size=covered, indices=indices)
            return
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


def _apply_native(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None, covered: int
) -> bool:
    """Run the C kernel over ``logits[rows, :covered]``; False when it is unavailable."""
    lib = load_native("bitmask_cpu")
    supported = (
        logits.dtype in _NEG_INF_BITS
        and (logits.stride(1) == 1 or logits.shape[1] == 1)
        and bitmask.device.type == "cpu"
        and bitmask.dtype == torch.int32
        and (bitmask.stride(1) == 1 or bitmask.shape[1] == 1)
    )
    if lib is None or not supported:
        return False
    wide = logits.element_size() == 4
    fn = lib.plait_mask_b32 if wide else lib.plait_mask_b16
    if rows is not None:
        rows = rows.to(device="cpu", dtype=torch.int64).contiguous()
    fn(
        ctypes.c_void_p(logits.data_ptr()),
        ctypes.c_int64(logits.stride(0)),
        ctypes.c_void_p(bitmask.data_ptr()),
        ctypes.c_int64(bitmask.stride(0)),
        ctypes.c_void_p(None if rows is None else rows.data_ptr()),
        ctypes.c_int64(logits.shape[0] if rows is None else rows.numel()),
        ctypes.c_int64(covered),
        (ctypes.c_uint32 if wide else ctypes.c_uint16)(_NEG_INF_BITS[logits.dtype]),
    )
    return True


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

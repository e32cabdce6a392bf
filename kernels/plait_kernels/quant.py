"""Weight-only quantized matmuls: ``quant_linear`` (x @ W^T with W kept packed) and
``quant_embedding`` (rows of W dequantized on lookup; a tied LM head shares the weight).

On the CPU a weight is a :class:`NativeWeight` (each GGUF kind in its own packed form) and the
C kernel ``csrc/quant_matmul_cpu.c`` (``_quant_native``) runs every M: activations are
quantized per group of 32 to int8 and dotted with the integer codes, so the float weight never
exists. A :class:`QuantWeight` (the Triton kernel's layout) given on the CPU is packed natively
once, at its first use; without a C compiler the torch path dequantizes panels of its rows and
calls ``F.linear``. On CUDA a Triton kernel dequantizes tiles into registers and feeds
``tl.dot``. The reference is dequantize-then-matmul (:func:`quant_linear_reference`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._dispatch import FLOAT_DTYPES, INDEX_DTYPES, check_tensor, choose_impl
from ._quant_native import native_isa, native_quant_linear
from .native_weight import GROUP, NativeWeight, native_available
from .quant_weight import BLOCK_ROWS, QuantWeight, dequantize_rows, quantize_weight

AnyQuant = QuantWeight | NativeWeight

# Float elements of W the fallback dequantizes at once (4 MiB of fp32).
_PANEL_ELEMS = 1 << 20
# From this many rows of x the portable C kernel (5-9 GMAC/s) loses to dequantize + GEMM.
GENERIC_MAX_M = 32


def quant_linear(
    x: torch.Tensor,
    w: AnyQuant,
    *,
    bias: torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """``x [..., K] @ W^T + bias`` -> [..., N] in x's dtype, for a packed ``w`` [N, K].

    x is fp32, bf16 or fp16 (the CPU kernel computes in fp32); bias is [N] or None.
    """
    _check_linear(x, w, bias)
    flat = x.dim() == 2  # the common case skips two reshapes (a decode step makes ~120 calls)
    x2 = x if flat else x.reshape(-1, w.k)
    if isinstance(w, NativeWeight):
        out = quant_linear_native(x2, w, bias=bias)
    elif choose_impl(impl, x.device) == "triton":
        out = quant_linear_triton(x2, w, bias=bias)
    else:
        out = quant_linear_torch(x2, w, bias=bias)
    return out if flat else out.reshape(*x.shape[:-1], w.n)


def quant_embedding(
    ids: torch.Tensor, w: AnyQuant, *, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Rows ``ids`` of ``w`` dequantized: [*ids.shape, K] in ``dtype`` (an embedding lookup)."""
    if not isinstance(w, QuantWeight | NativeWeight):
        raise ValueError(f"w must be a QuantWeight or NativeWeight, got {type(w).__name__}")
    check_tensor("ids", ids, dtypes=INDEX_DTYPES, device=w.device)
    flat = ids.reshape(-1).to(torch.int64)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= w.n):
        lo, hi = int(flat.min()), int(flat.max())
        raise ValueError(f"ids must lie in [0, {w.n}), got min {lo} max {hi}")
    if isinstance(w, NativeWeight):
        return w.dequantize_rows(flat, dtype=dtype).reshape(*ids.shape, w.k)
    return dequantize_rows(w, flat, dtype=dtype).reshape(*ids.shape, w.k)


def _check_linear(x: torch.Tensor, w: AnyQuant, bias: torch.Tensor | None) -> None:
    if not isinstance(w, QuantWeight | NativeWeight):
        raise ValueError(f"w must be a QuantWeight or NativeWeight, got {type(w).__name__}")
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOAT_DTYPES or x.device != w.device:
        check_tensor("x", x, dtypes=FLOAT_DTYPES, device=w.device)  # raises, naming the problem
    if x.dim() == 0 or x.shape[-1] != w.k:
        raise ValueError(f"x must have shape [..., {w.k}], got {tuple(x.shape)}")
    if bias is not None:
        check_tensor("bias", bias, shape=(w.n,), dtypes=FLOAT_DTYPES, device=w.device)


# ---------------------------------------------------------------------------------------------
# torch path (the production CPU path) and the reference
# ---------------------------------------------------------------------------------------------


def quant_linear_torch(
    x: torch.Tensor,
    w: QuantWeight,
    *,
    bias: torch.Tensor | None = None,
    native: bool = True,
    threads: int | None = None,
) -> torch.Tensor:
    """CPU path for a :class:`QuantWeight` and x [M, K]: the C kernel on the weight packed
    natively (once, at its first use) when ``native``, a compiler works and K is a multiple
    of 32, else W dequantized a panel of rows at a time."""
    if native and w.codes.is_cpu and w.k % GROUP == 0 and native_available():
        return quant_linear_native(x, native_form(w), bias=bias, threads=threads)
    b = None if bias is None else bias.float()
    return _panels(x.float(), w.n, lambda idx: dequantize_rows(w, idx), b).to(x.dtype)


def quant_linear_native(
    x: torch.Tensor,
    w: NativeWeight,
    *,
    bias: torch.Tensor | None = None,
    threads: int | None = None,
) -> torch.Tensor:
    """The C kernel on x [M, K] (over ``threads`` threads, default torch's count). The portable
    C build (no AVX2: e.g. ARM) takes only small M; a prefill is faster through dequantized
    panels and torch's GEMM there."""
    out = None
    if x.shape[0] < GENERIC_MAX_M or native_isa() != "generic":
        out = native_quant_linear(x, w, bias, threads=threads)
    if out is None:
        b = None if bias is None else bias.float()
        xf = x.float() if w.x_bits == 16 else one_byte_x(x.float(), span=w.column_step)
        out = _panels(xf, w.n, w.dequantize_rows, b)
    return out if x.dtype == torch.float32 else out.to(x.dtype)


def one_byte_x(x: torch.Tensor, *, span: int) -> torch.Tensor:
    """x [M, K] as the C kernel holds it with x_bits 8: per `span` values dx = max|x| / 127,
    each value round(x / dx) * dx (for the dequantize-then-GEMM path to round as it does)."""
    m, k = x.shape
    xs = x.view(m, k // span, span)
    amax = xs.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    r = xs * inv
    q = torch.trunc(torch.where(r >= 0, r + 0.5, r - 0.5))
    return (q * (amax / 127.0)).view(m, k)


def _panels(
    x: torch.Tensor,
    n: int,
    rows_of: Callable[[torch.Tensor], torch.Tensor],
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """x @ W^T with W dequantized `rows_of(index)` a panel of rows at a time."""
    rows = max(BLOCK_ROWS, _PANEL_ELEMS // max(x.shape[1], 1))
    out = torch.empty(x.shape[0], n, dtype=torch.float32, device=x.device)
    for lo in range(0, n, rows):
        idx = torch.arange(lo, min(lo + rows, n), device=x.device)
        b = None if bias is None else bias[lo : lo + rows]
        out[:, lo : lo + rows] = F.linear(x, rows_of(idx), b)
    return out


_natives: weakref.WeakKeyDictionary[QuantWeight, NativeWeight] = weakref.WeakKeyDictionary()


def native_form(w: QuantWeight) -> NativeWeight:
    """A CPU :class:`QuantWeight` packed natively (kept while `w` lives)."""
    got = _natives.get(w)
    if got is None:
        codes, scales, mins = w.unpack()
        got = _natives[w] = NativeWeight.from_logical(
            codes=codes, scales=scales, mins=mins, group=w.group
        )
    return got


def quant_linear_reference(
    x: torch.Tensor, w: AnyQuant, *, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Dequantize W whole, then fp32 ``F.linear`` (the definition the kernels are tested on)."""
    b = None if bias is None else bias.float()
    return F.linear(x.float(), w.dequantize(), b).to(x.dtype)


# ---------------------------------------------------------------------------------------------
# Triton path
# ---------------------------------------------------------------------------------------------


@triton.jit
def _quant_linear_kernel(
    x_ptr: tl.tensor,
    codes_ptr: tl.tensor,
    scales_ptr: tl.tensor,
    mins_ptr: tl.tensor,
    bias_ptr: tl.tensor,
    out_ptr: tl.tensor,
    m: tl.tensor,
    n: tl.tensor,
    k: tl.tensor,
    stride_x: tl.tensor,
    stride_out: tl.tensor,
    GROUP: tl.constexpr,
    BITS: tl.constexpr,
    HAS_MINS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    USE_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
) -> None:
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, GROUP)
    rows64 = rows.to(tl.int64)
    cols64 = cols.to(tl.int64)
    blk = cols64 // 16
    r = cols64 % 16
    gc = k // GROUP
    # Byte offset of (row, k within the group) inside the group's chunk (csrc layout).
    if BITS == 8:
        inner = (kk // 2)[None, :] * 32 + 2 * r[:, None] + (kk % 2)[None, :]
    else:
        word = 2 * r[:, None] + (kk % 2)[None, :]
        j = (kk % 8) // 2
        inner = (kk // 8)[None, :] * 64 + 2 * word + (j // 2)[None, :]
        shift = (4 * (j % 2))[None, :]
    cmask = cols[:, None] < n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g in range(0, gc):
        base = (blk * gc + g) * (GROUP * 16 * BITS // 8)
        raw = tl.load(codes_ptr + base[:, None] + inner, mask=cmask, other=0)
        if BITS == 8:  # noqa: SIM108 (constexpr branches; `shift` exists only for 4 bits)
            q = raw.to(tl.float32)
        else:
            q = ((raw.to(tl.int32) >> shift) & 0xF).to(tl.float32)
        sidx = (blk * gc + g) * 16 + r
        s = tl.load(scales_ptr + sidx, mask=cols < n, other=0.0).to(tl.float32)
        wt = q * s[:, None]
        if HAS_MINS:
            mn = tl.load(mins_ptr + sidx, mask=cols < n, other=0.0).to(tl.float32)
            wt += mn[:, None]
        xmask = (rows[:, None] < m) & (kk[None, :] < GROUP)
        xoff = rows64[:, None] * stride_x + g * GROUP + kk[None, :]
        xt = tl.load(x_ptr + xoff, mask=xmask, other=0.0)
        if USE_DOT:
            acc += tl.dot(xt, tl.trans(wt.to(xt.dtype)), input_precision=DOT_PRECISION)
        else:  # BLOCK_M == 1: a matrix-vector product, no tensor cores and no padded rows
            acc += tl.sum(xt.to(tl.float32) * wt, axis=1)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < n, other=0.0).to(tl.float32)[None, :]
    omask = (rows[:, None] < m) & (cols[None, :] < n)
    tl.store(out_ptr + rows64[:, None] * stride_out + cols[None, :], acc, mask=omask)


def quant_linear_triton(
    x: torch.Tensor,
    w: QuantWeight,
    *,
    bias: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Triton path for x [M, K]: per group of K, a [block_n, group] tile of W is dequantized in
    registers (fp32) and multiplied with tl.dot (in x's dtype), fp32 accumulation. Below 16
    rows of x (decode) each program takes one row of x and sums products instead
    (``block_m=1``): a dot would pad x to 16 rows and launch too few programs."""
    if block_m is None:
        block_m = 16 if x.shape[0] >= 16 else 1
    block_n = block_n or (64 if block_m > 1 else 32)
    xc = x if x.stride(-1) == 1 else x.contiguous()
    m = xc.shape[0]
    out = torch.empty(m, w.n, dtype=torch.float32, device=x.device)
    if m == 0:
        return out.to(x.dtype)
    codes = w.codes.view(torch.int8) if w.bits == 8 else w.codes
    grid = (triton.cdiv(m, block_m), triton.cdiv(w.n, block_n))
    _quant_linear_kernel[grid](
        xc,
        codes,
        w.scales,
        w.mins if w.mins is not None else w.scales,
        bias if bias is not None else w.scales,
        out,
        m,
        w.n,
        w.k,
        xc.stride(0),
        out.stride(0),
        GROUP=w.group,
        BITS=w.bits,
        HAS_MINS=w.mins is not None,
        HAS_BIAS=bias is not None,
        DOT_PRECISION="tf32" if x.is_cuda and x.dtype != torch.float32 else "ieee",
        USE_DOT=block_m > 1,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=4,
    )
    return out.to(x.dtype)


__all__ = [
    "NativeWeight",
    "QuantWeight",
    "quant_embedding",
    "quant_linear",
    "quant_linear_native",
    "quant_linear_reference",
    "quant_linear_torch",
    "quant_linear_triton",
    "quantize_weight",
]

"""RMSNorm with the Hugging Face Llama rounding order, optionally fused with a residual add."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import FLOAT_DTYPES, check_same_dtype, check_tensor, choose_impl, next_pow2


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float,
    residual: torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of ``x`` [T, H] with ``weight`` [H] (HF Llama: fp32 statistics, then
    ``weight * normed.to(x.dtype)``; the result dtype promotes x's and weight's).

    With ``residual`` [T, H] (x's dtype) computes ``r = x + residual`` in x's dtype and returns
    ``(rmsnorm(r), r)``.
    """
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES, last_contiguous=True)
    check_tensor("weight", weight, shape=(x.shape[1],), dtypes=FLOAT_DTYPES, device=x.device)
    check_tensor("weight", weight, ndim=1, contiguous=True)
    if residual is not None:
        check_tensor("residual", residual, shape=tuple(x.shape), device=x.device)
        check_same_dtype("residual", residual, "x", x)
        check_tensor("residual", residual, ndim=2, last_contiguous=True)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or eps < 0:
        raise ValueError(f"eps must be a non-negative float, got {eps!r}")
    if choose_impl(impl, x.device) == "triton":
        return rmsnorm_triton(x, weight, eps=eps, residual=residual)
    return rmsnorm_torch(x, weight, eps=eps, residual=residual)


def rmsnorm_torch(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference / CPU path, exactly the HF LlamaRMSNorm arithmetic."""
    r = x if residual is None else x + residual
    h = r.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * h.to(r.dtype)
    return out if residual is None else (out, r)


@triton.jit
def _rmsnorm_kernel(
    x_ptr: tl.tensor,
    res_ptr: tl.tensor,
    w_ptr: tl.tensor,
    out_ptr: tl.tensor,
    res_out_ptr: tl.tensor,
    n_rows: tl.tensor,
    hidden: tl.tensor,
    eps: tl.tensor,
    stride_x: tl.tensor,
    stride_res: tl.tensor,
    stride_out: tl.tensor,
    stride_res_out: tl.tensor,
    HAS_RESIDUAL: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
) -> None:
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rows64 = rows.to(tl.int64)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < hidden)
    x = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + rows64[:, None] * stride_res + cols[None, :], mask=mask, other=0.0)
        # The add rounds to x's dtype, exactly like ``x + residual`` in torch.
        x = (x.to(tl.float32) + res.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + rows64[:, None] * stride_res_out + cols[None, :], x, mask=mask)
    h = x.to(tl.float32)
    var = tl.sum(h * h, 1) / hidden
    h = h * tl.rsqrt(var + eps)[:, None]
    h = h.to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < hidden, other=0.0).to(tl.float32)
    out = (h * w[None, :]).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows64[:, None] * stride_out + cols[None, :], out, mask=mask)


def rmsnorm_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Triton path: ``ROWS`` rows per program, the residual add fused in."""
    t, hidden = x.shape
    out = torch.empty(t, hidden, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    res_out = torch.empty_like(x) if residual is not None else out
    if t > 0:
        block = next_pow2(hidden)
        rows = max(1, min(next_pow2(t), 4096 // block)) if x.is_cuda else min(next_pow2(t), 64)
        res = residual if residual is not None else x
        _rmsnorm_kernel[(triton.cdiv(t, rows),)](
            x,
            res,
            weight,
            out,
            res_out,
            t,
            hidden,
            float(eps),
            x.stride(0),
            res.stride(0),
            out.stride(0),
            res_out.stride(0),
            HAS_RESIDUAL=residual is not None,
            ROWS=rows,
            BLOCK=block,
            num_warps=8 if block >= 4096 else 4,
        )
    return out if residual is None else (out, res_out)

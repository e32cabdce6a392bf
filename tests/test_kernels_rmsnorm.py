"""rmsnorm: Triton (interpreter) vs torch path vs the HF Llama formula and float64 math."""

from __future__ import annotations

import pytest
import torch

from plait.kernels import rmsnorm

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# The interpreter rounds fp32 -> bf16 toward zero (CUDA rounds to nearest): allow 1-2 ulps.
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def hf_llama_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward, verbatim arithmetic."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("t", "h"), [(1, 64), (37, 1000), (130, 4096)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_triton_matches_torch(dtype: torch.dtype, t: int, h: int, with_residual: bool) -> None:
    g = torch.Generator().manual_seed(t + h)
    x = torch.randn(t, h, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(h, generator=g)).to(dtype)
    res = torch.randn(t, h, generator=g).to(dtype) if with_residual else None
    ref = rmsnorm(x, w, eps=1e-6, residual=res, impl="torch")
    out = rmsnorm(x, w, eps=1e-6, residual=res, impl="triton")
    if with_residual:
        assert isinstance(ref, tuple) and isinstance(out, tuple)
        torch.testing.assert_close(out[1], ref[1], atol=TOL[dtype], rtol=TOL[dtype])
        ref, out = ref[0], out[0]
    assert isinstance(out, torch.Tensor) and isinstance(ref, torch.Tensor)
    assert out.dtype == ref.dtype == dtype
    torch.testing.assert_close(out, ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_is_hf_llama_exactly(dtype: torch.dtype) -> None:
    x = torch.randn(9, 256).to(dtype)
    w = torch.randn(256).to(dtype)
    r = torch.randn(9, 256).to(dtype)
    assert torch.equal(rmsnorm(x, w, eps=1e-5), hf_llama_rmsnorm(x, w, 1e-5))
    out, summed = rmsnorm(x, w, eps=1e-5, residual=r)
    assert torch.equal(summed, x + r)
    assert torch.equal(out, hf_llama_rmsnorm(x + r, w, 1e-5))
    # float64 math agrees to the dtype's precision.
    x64 = x.double()
    want = w.double() * x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(
        rmsnorm(x, w, eps=1e-5).double(), want, atol=TOL[dtype] * 4, rtol=TOL[dtype] * 4
    )


def test_mixed_weight_dtype_and_strided_rows() -> None:
    x = torch.randn(6, 128).to(torch.bfloat16)
    w = torch.randn(128)  # fp32 weight promotes the result, as in HF
    for impl in ("torch", "triton"):
        out = rmsnorm(x, w, eps=1e-6, impl=impl)
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
        torch.testing.assert_close(out, hf_llama_rmsnorm(x, w, 1e-6), atol=2e-2, rtol=2e-2)
    big = torch.randn(6, 200)
    view = big[:, :128]  # row stride 200
    for impl in ("torch", "triton"):
        out = rmsnorm(view, w, eps=1e-6, impl=impl)
        torch.testing.assert_close(out, hf_llama_rmsnorm(view, w, 1e-6))


def test_empty() -> None:
    for impl in ("torch", "triton"):
        out = rmsnorm(torch.zeros(0, 64), torch.ones(64), eps=1e-6, impl=impl)
        assert isinstance(out, torch.Tensor) and out.shape == (0, 64)
        pair = rmsnorm(
            torch.zeros(0, 64), torch.ones(64), eps=1e-6, residual=torch.zeros(0, 64), impl=impl
        )
        assert isinstance(pair, tuple) and pair[1].shape == (0, 64)


def test_input_checks() -> None:
    x = torch.zeros(3, 8)
    w = torch.ones(8)
    with pytest.raises(ValueError, match="x must be 2-D"):
        rmsnorm(torch.zeros(8), w, eps=1e-6)
    with pytest.raises(ValueError, match="weight must have shape"):
        rmsnorm(x, torch.ones(4), eps=1e-6)
    with pytest.raises(ValueError, match="residual must have shape"):
        rmsnorm(x, w, eps=1e-6, residual=torch.zeros(2, 8))
    with pytest.raises(ValueError, match="residual must have the same dtype"):
        rmsnorm(x, w, eps=1e-6, residual=torch.zeros(3, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="eps"):
        rmsnorm(x, w, eps=-1.0)
    with pytest.raises(ValueError, match="x must have unit stride"):
        rmsnorm(torch.zeros(8, 3).t(), w, eps=1e-6)

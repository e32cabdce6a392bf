"""rope: Triton (interpreter) vs torch path vs a manual HF-style rotate_half."""

from __future__ import annotations

import pytest
import torch

from plait.kernels import rope

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def cos_sin_cache(max_pos: int, d: int, base: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], -1)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def hf_rope(x: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """HF apply_rotary_pos_emb on [T, H, D] in fp32 with cos/sin duplicated to D."""
    half = cache.shape[1] // 2
    cos = cache[positions, :half].repeat(1, 2)[:, None, :]
    sin = cache[positions, half:].repeat(1, 2)[:, None, :]
    xf = x.float()
    return (xf * cos + rotate_half(xf) * sin).to(x.dtype)


def fused_qkv(t: int, hq: int, hkv: int, d: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, hq + 2 * hkv, d, generator=g).to(dtype)
    return qkv, qkv[:, :hq], qkv[:, hq : hq + hkv]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("t", "hq", "hkv", "d"), [(1, 4, 4, 64), (37, 8, 2, 128), (130, 32, 4, 64)]
)
def test_triton_matches_torch_on_fused_views(dtype, t: int, hq: int, hkv: int, d: int) -> None:
    cache = cos_sin_cache(4096, d)
    positions = torch.randint(0, 4096, (t,), generator=torch.Generator().manual_seed(t))
    qkv_a, qa, ka = fused_qkv(t, hq, hkv, d, dtype, seed=t)
    qkv_b, qb, kb = fused_qkv(t, hq, hkv, d, dtype, seed=t)
    untouched = qkv_a[:, hq + hkv :].clone()
    ra = rope(qa, ka, positions, cache, impl="torch")
    rb = rope(qb, kb, positions, cache, impl="triton")
    assert ra[0] is qa and rb[1] is kb  # in place, returned
    torch.testing.assert_close(qkv_b.float(), qkv_a.float(), atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.equal(qkv_a[:, hq + hkv :], untouched)
    assert torch.equal(qkv_b[:, hq + hkv :], untouched)


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_matches_hf_rotate_half(dtype: torch.dtype) -> None:
    cache = cos_sin_cache(512, 64)
    positions = torch.tensor([0, 1, 5, 511, 3])
    _, q, k = fused_qkv(5, 4, 2, 64, dtype, seed=0)
    want_q, want_k = hf_rope(q, positions, cache), hf_rope(k, positions, cache)
    rope(q, k, positions, cache)
    torch.testing.assert_close(q, want_q, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(k, want_k, atol=TOL[dtype], rtol=TOL[dtype])
    if dtype == torch.float32:
        # Position 0 is the identity.
        x = torch.randn(1, 2, 64)
        y = x.clone()
        rope(y, y[:, :1].clone(), torch.zeros(1, dtype=torch.int64), cache)
        torch.testing.assert_close(y, x)


def test_empty_and_checks() -> None:
    cache = cos_sin_cache(16, 8)
    q, k = torch.zeros(0, 2, 8), torch.zeros(0, 1, 8)
    for impl in ("torch", "triton"):
        assert rope(q, k, torch.zeros(0, dtype=torch.int64), cache, impl=impl)[0].shape == (0, 2, 8)
    q, k, pos = torch.zeros(3, 2, 8), torch.zeros(3, 1, 8), torch.arange(3)
    with pytest.raises(ValueError, match="q must be 3-D"):
        rope(q[0], k, pos, cache)
    with pytest.raises(ValueError, match="head dim must be even"):
        rope(torch.zeros(3, 2, 7), torch.zeros(3, 1, 7), pos, cache)
    with pytest.raises(ValueError, match="k must have shape"):
        rope(q, torch.zeros(3, 1, 4), pos, cache)
    with pytest.raises(ValueError, match="k must have the same dtype"):
        rope(q, k.half(), pos, cache)
    with pytest.raises(ValueError, match="positions"):
        rope(q, k, pos.float(), cache)
    with pytest.raises(ValueError, match="positions must lie"):
        rope(q, k, torch.tensor([0, 1, 16]), cache)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        rope(q, k, pos, cache.double())
    with pytest.raises(ValueError, match="cos_sin_cache"):
        rope(q, k, pos, cos_sin_cache(16, 4))

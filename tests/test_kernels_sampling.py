"""top_k_top_p_sample: Triton (interpreter) vs torch path vs the spec, row by row."""

from __future__ import annotations

import pytest
import torch

from plait.kernels import top_k_top_p_sample
from plait.kernels.sampling import _radix_select, top_k_top_p_sample_triton


def spec_sample(probs, top_k, top_p, min_p, uniforms) -> list[int]:
    """The documented semantics, literally, one row at a time in float64."""
    out = []
    for b in range(probs.shape[0]):
        p = probs[b].double()
        v = p.numel()
        kept = torch.ones(v, dtype=torch.bool)
        k = int(top_k[b])
        if 0 < k < v:
            kept &= p >= p.sort(descending=True).values[k - 1]
        if min_p is not None:
            kept &= p >= float(min_p[b]) * float(p.max())
        tp = float(top_p[b])
        if tp < 1:
            vals = p[kept].sort(descending=True).values
            target = tp * float(vals.sum())
            n = int(torch.searchsorted(vals.cumsum(0), torch.tensor([target], dtype=torch.float64)))
            kept &= p >= vals[min(n, vals.numel() - 1)]
        w = torch.where(kept, p, 0.0)
        goal = float(uniforms[b]) * float(w.sum())
        running = w.cumsum(0)
        hits = (running > goal).nonzero()
        out.append(int(hits[0]) if hits.numel() else int(kept.nonzero()[-1]))
    return out


def make_probs(b: int, v: int, seed: int, sharp: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(b, v, generator=g, dtype=torch.float64) * sharp, -1).float()


SETTINGS = [
    # top_k, top_p, min_p
    ([0, -1, 1, 5, 50, 999999], [1.0] * 6, None),
    ([0] * 6, [0.1, 0.5, 0.9, 0.95, 0.999, 1.0], None),
    ([20, 0, 300, 7, 0, 2], [0.8, 0.9, 0.5, 1.0, 0.3, 0.0], None),
    ([0, 40, 0, 0, 10, 0], [1.0, 0.9, 0.7, 1.0, 1.0, 0.95], [0.05, 0.0, 0.1, 0.5, 0.02, 0.01]),
]


@pytest.mark.parametrize("vocab", [1000, 32000])
@pytest.mark.parametrize("setting", range(len(SETTINGS)))
def test_triton_torch_and_spec_agree(vocab: int, setting: int) -> None:
    ks, ps, mps = SETTINGS[setting]
    b = len(ks)
    probs = make_probs(b, vocab, seed=vocab + setting)
    top_k = torch.tensor(ks)
    top_p = torch.tensor(ps)
    min_p = None if mps is None else torch.tensor(mps)
    u = torch.rand(b, generator=torch.Generator().manual_seed(setting))
    want = spec_sample(probs, top_k, top_p, min_p, u)
    got_torch = top_k_top_p_sample(probs, top_k=top_k, top_p=top_p, min_p=min_p, uniforms=u)
    got_triton = top_k_top_p_sample_triton(probs, top_k=top_k, top_p=top_p, min_p=min_p, uniforms=u)
    assert got_torch.dtype == torch.int64
    assert got_torch.tolist() == want
    assert got_triton.tolist() == want


def test_flat_distribution_uses_radix_select() -> None:
    # top-p past the top-256 candidates: the torch path falls back to the radix select.
    probs = make_probs(3, 128256, seed=5, sharp=0.5)
    top_p = torch.tensor([0.9, 0.5, 0.99])
    u = torch.tensor([0.3, 0.9, 0.01])
    args = dict(top_k=torch.zeros(3, dtype=torch.int64), top_p=top_p, uniforms=u)
    want = spec_sample(probs, args["top_k"], top_p, None, u)
    assert top_k_top_p_sample(probs, **args).tolist() == want  # type: ignore[arg-type]
    sorted_p = probs.double().sort(-1, descending=True).values
    target = (top_p.double() * probs.double().sum(-1)).float()
    idx = torch.searchsorted(sorted_p.cumsum(-1).float(), target.unsqueeze(1))
    t = _radix_select(probs, probs, target)
    assert torch.equal(t, sorted_p.gather(1, idx).squeeze(1).float())
    # Counting weights give the k-th largest value.
    k = torch.tensor([1.0, 7.0, 5000.0])
    kth = _radix_select(probs, torch.ones_like(probs), k)
    assert torch.equal(kth, probs.sort(-1, descending=True).values[[0, 1, 2], [0, 6, 4999]])


def test_ties_are_kept_and_draws_follow_token_order() -> None:
    probs = torch.tensor([[0.1, 0.3, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25, 0.0]])
    top_k = torch.tensor([2, 3])
    top_p = torch.ones(2)
    for impl in ("torch", "triton"):
        for u, want in [(0.0, [1, 0]), (0.49, [1, 1]), (0.51, [2, 2]), (0.999, [2, 3])]:
            got = top_k_top_p_sample(
                probs, top_k=top_k, top_p=top_p, uniforms=torch.full((2,), u), impl=impl
            )
            assert got.tolist() == want, (impl, u)


def test_greedy_like_settings() -> None:
    probs = make_probs(4, 5000, seed=9)
    argmax = probs.argmax(-1)
    for impl in ("torch", "triton"):
        for top_k, top_p in [(1, 1.0), (0, 0.0)]:
            got = top_k_top_p_sample(
                probs,
                top_k=torch.full((4,), top_k),
                top_p=torch.full((4,), top_p),
                uniforms=torch.rand(4),
                impl=impl,
            )
            assert torch.equal(got, argmax), (impl, top_k, top_p)


def test_empty_and_checks() -> None:
    z = torch.zeros(0)
    for impl in ("torch", "triton"):
        out = top_k_top_p_sample(torch.zeros(0, 10), top_k=z.long(), top_p=z, uniforms=z, impl=impl)
        assert out.shape == (0,) and out.dtype == torch.int64
    probs = make_probs(2, 10, seed=0)
    ok = dict(top_k=torch.zeros(2, dtype=torch.int64), top_p=torch.ones(2), uniforms=torch.rand(2))
    with pytest.raises(ValueError, match="probs"):
        top_k_top_p_sample(probs.double(), **ok)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="top_k"):
        top_k_top_p_sample(probs, **{**ok, "top_k": torch.zeros(2)})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="top_p"):
        top_k_top_p_sample(probs, **{**ok, "top_p": torch.ones(3)})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_p"):
        top_k_top_p_sample(probs, min_p=torch.ones(1), **ok)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="uniforms"):
        top_k_top_p_sample(probs, **{**ok, "uniforms": torch.rand(2, 1)})  # type: ignore[arg-type]

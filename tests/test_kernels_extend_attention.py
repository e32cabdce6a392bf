"""extend_attention: Triton (interpreter) vs the CPU paths (the C kernel, torch's SDPA) vs
explicit per-token math."""

from __future__ import annotations

import pytest
import torch

import plait.kernels._extend_native as extend_native
from plait.kernels import extend_attention
from plait.kernels._native import load_native
from plait.kernels.extend_attention import extend_attention_torch, extend_attention_triton

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def make_case(prefix: list[int], extend: list[int], hq: int, hkv: int, d: int, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = len(prefix)
    totals = [p + e for p, e in zip(prefix, extend, strict=True)]
    pool = sum(totals) + 9
    k_pool = torch.randn(pool, hkv, d, generator=g).to(dtype)
    v_pool = torch.randn(pool, hkv, d, generator=g).to(dtype)
    req_to_token = torch.zeros(b + 2, max(totals + [1]) + 3, dtype=torch.int32)
    req_slots = torch.randperm(b + 2, generator=g)[:b]
    perm = torch.randperm(pool - 1, generator=g) + 1
    used = 0
    for i, n in enumerate(totals):
        req_to_token[req_slots[i], :n] = perm[used : used + n].int()
        used += n
    q = torch.randn(sum(extend), hq, d, generator=g).to(dtype)
    return (q, k_pool, v_pool, req_to_token, req_slots, torch.tensor(prefix), torch.tensor(extend))


def naive_extend(
    q, k_pool, v_pool, r2t, req_slots, prefix, extend, scale, window=None, softcap=None
):
    t, hq, d = q.shape
    group = hq // k_pool.shape[1]
    out = torch.zeros(t, hq, d, dtype=torch.float64)
    row = 0
    for i in range(len(prefix)):
        for j in range(int(extend[i])):
            qpos = int(prefix[i]) + j
            kpos = [p for p in range(qpos + 1) if window is None or qpos - p < window]
            slots = r2t[req_slots[i], kpos].long()
            for h in range(hq):
                k = k_pool[slots, h // group].double()
                v = v_pool[slots, h // group].double()
                scores = k @ q[row, h].double() * scale
                if softcap is not None:
                    scores = softcap * torch.tanh(scores / softcap)
                probs = torch.softmax(scores, 0)
                out[row, h] = probs @ v
            row += 1
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("hq", "hkv", "d"), [(2, 2, 64), (4, 1, 128), (8, 1, 64)])
def test_triton_matches_torch(dtype: torch.dtype, hq: int, hkv: int, d: int) -> None:
    # Pure prefill, prefix + chunk, a single decode-like token, an empty extend; lengths that
    # straddle the 128 block.
    case = make_case([0, 100, 700, 5], [130, 70, 1, 0], hq, hkv, d, dtype, seed=hq + d)
    scale = d**-0.5
    ref = extend_attention(*case, scale=scale, impl="torch")
    out = extend_attention_triton(*case, scale=scale, block_m=128, block_n=256)
    assert out.dtype == dtype and out.shape == ref.shape
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("window", [1, 33, 4096])
def test_triton_sliding_window(window: int) -> None:
    case = make_case([0, 70, 200], [90, 40, 3], 4, 2, 64, torch.float32, seed=window)
    ref = extend_attention(*case, scale=0.125, sliding_window=window, impl="torch")
    out = extend_attention(*case, scale=0.125, sliding_window=window, impl="triton")
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


@pytest.fixture(params=["native", "torch"])
def cpu_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a CPU test through the C kernel (csrc/extend_attention_cpu.c) and through torch's
    SDPA, which it falls back to."""
    if request.param == "torch":
        monkeypatch.setattr(extend_native, "load_native", lambda name: None)
    else:
        assert load_native("extend_attention_cpu") is not None  # the C kernel really runs
    return str(request.param)


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize(("hq", "hkv"), [(2, 2), (4, 2), (8, 1)])
def test_torch_matches_naive(window: int | None, hq: int, hkv: int, cpu_path: str) -> None:
    case = make_case([0, 7, 3, 12], [6, 5, 0, 1], hq, hkv, 16, torch.float32, seed=hq + hkv)
    out = extend_attention(*case, scale=0.3, sliding_window=window)
    want = naive_extend(*case, scale=0.3, window=window)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_torch_low_precision_close_to_naive(dtype: torch.dtype) -> None:
    case = make_case([0, 9], [12, 4], 4, 2, 32, dtype, seed=1)
    out = extend_attention(*case, scale=0.2)
    want = naive_extend(*case, scale=0.2)
    torch.testing.assert_close(out.double(), want, atol=TOL[dtype], rtol=TOL[dtype])


def test_empty_inputs() -> None:
    q, k_pool, v_pool, r2t, req_slots, prefix, extend = make_case([3], [0], 4, 2, 16, torch.float32)
    for impl in ("torch", "triton"):
        out = extend_attention(
            q, k_pool, v_pool, r2t, req_slots, prefix, extend, scale=0.25, impl=impl
        )
        assert out.shape == (0, 4, 16)
        none = torch.zeros(0, dtype=torch.int64)
        out = extend_attention(q, k_pool, v_pool, r2t, none, none, none, scale=0.25, impl=impl)
        assert out.shape == (0, 4, 16)


def test_input_checks() -> None:
    q, k_pool, v_pool, r2t, req_slots, prefix, extend = make_case(
        [0, 3], [2, 2], 4, 2, 16, torch.float32
    )

    def call(**over):
        kw = dict(
            q=q,
            k_pool=k_pool,
            v_pool=v_pool,
            req_to_token=r2t,
            req_slots=req_slots,
            prefix_lens=prefix,
            extend_lens=extend,
            scale=0.25,
        )
        kw.update(over)
        return extend_attention(**kw)

    with pytest.raises(ValueError, match="extend_lens must sum"):
        call(extend_lens=torch.tensor([2, 3]))
    with pytest.raises(ValueError, match="prefix_lens"):
        call(prefix_lens=torch.tensor([0]))
    with pytest.raises(ValueError, match="extend_lens"):
        call(extend_lens=extend.float())
    with pytest.raises(ValueError, match="q must"):
        call(q=q.int())
    with pytest.raises(ValueError, match="k_pool"):
        call(k_pool=k_pool.double())
    with pytest.raises(ValueError, match="impl"):
        call(impl="cpu")


@pytest.mark.parametrize("window", [None, 5])
def test_soft_cap_matches_naive_and_triton(window: int | None, cpu_path: str) -> None:
    """Gemma 2's attention soft cap (scores -> c * tanh(scores / c)): the torch path against
    the explicit math, and the Triton kernel against the torch path; a cap that changes
    nothing (scores far below it) gives the uncapped result."""
    case = make_case([0, 7, 12], [6, 5, 3], 4, 2, 16, torch.float32, seed=11)
    out = extend_attention(*case, scale=0.9, sliding_window=window, softcap=2.5)
    want = naive_extend(*case, scale=0.9, window=window, softcap=2.5)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    uncapped = naive_extend(*case, scale=0.9, window=window)
    assert float((want - uncapped).abs().max()) > 1e-2  # the cap matters at this scale
    tri = extend_attention(*case, scale=0.9, sliding_window=window, softcap=2.5, impl="triton")
    torch.testing.assert_close(tri, out, atol=2e-5, rtol=2e-5)
    far = extend_attention(*case, scale=0.01, sliding_window=window, softcap=1e6)
    torch.testing.assert_close(far, extend_attention(*case, scale=0.01, sliding_window=window))


def test_soft_cap_must_be_positive() -> None:
    case = make_case([0], [3], 2, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="softcap"):
        extend_attention(*case, scale=0.3, softcap=0.0)


def _native(case, scale, window=None, threads=None, softcap=None):
    """The C kernel alone over each request of a case (None where it declines)."""
    q, k_pool, v_pool, r2t, req_slots, prefix, extend = case
    outs, row = [], 0
    for req, pre, ext in zip(req_slots.tolist(), prefix.tolist(), extend.tolist(), strict=True):
        if ext:
            got = extend_native.native_extend(
                q[row : row + ext], k_pool, v_pool, r2t[req, : pre + ext], pre,
                scale=scale, sliding_window=window, softcap=softcap, threads=threads,
            )  # fmt: skip
            if got is None:
                return None
            outs.append(got)
        row += ext
    return torch.cat(outs)


@pytest.mark.parametrize(
    ("window", "softcap"),
    [(None, None), (1, None), (63, None), (64, 2.5), (130, None), (None, 1.5)],
)
@pytest.mark.parametrize(
    ("hq", "hkv", "d"),
    [(4, 2, 64), (8, 1, 128), (6, 3, 48), (2, 2, 16), (3, 1, 256), (4, 4, 96), (2, 1, 80)],
)
def test_native_matches_naive(
    window: int | None, softcap: float | None, hq: int, hkv: int, d: int
) -> None:
    """The C kernel against the explicit math: a pure prefill longer than a key block (64), a
    prefix + chunk, one token after a prefix, a short one; tiles that straddle positions
    (groups of 1-8 query heads against 4 rows a tile); head sizes for the 16-lane loops (a
    multiple of their 64-float value runs) and the 8-lane ones (16-float runs: 16, 48, 80 and
    Phi-3's 96, on an AVX-512 CPU too); sliding windows within and across blocks; soft caps
    that change the scores (the scale below makes some exceed them)."""
    case = make_case([0, 70, 130, 0], [150, 40, 1, 3], hq, hkv, d, torch.float32, seed=d + hq)
    got = _native(case, 0.2, window, softcap=softcap)
    assert got is not None  # this CPU has AVX2 or AVX-512: the kernel runs
    want = naive_extend(*case, scale=0.2, window=window, softcap=softcap)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("threads", [2, 3])
def test_native_split_over_threads_is_exact(threads: int) -> None:
    """A token's output is computed the same way on any split over threads, and whatever
    the chunk its prompt was prefilled in (the key blocks start at position 0 either way)."""
    case = make_case([0], [300], 8, 2, 64, torch.float32, seed=5)
    one = _native(case, 0.125, threads=1)
    assert one is not None and torch.equal(one, _native(case, 0.125, threads=threads))
    q, k_pool, v_pool, r2t, req_slots, _, _ = case
    chunked = (q[200:], k_pool, v_pool, r2t, req_slots, torch.tensor([200]), torch.tensor([100]))
    assert torch.equal(one[200:], _native(chunked, 0.125))


def test_native_declines_what_it_does_not_take() -> None:
    """bf16 queries or pools, int64 slots and head sizes off the value runs go to torch."""
    q, k_pool, v_pool, r2t, req_slots, prefix, extend = make_case([0], [5], 4, 2, 16, torch.float32)
    slots = r2t[req_slots[0], :5]
    call = extend_native.native_extend
    assert call(q.bfloat16(), k_pool, v_pool, slots, 0, scale=0.3) is None
    assert call(q, k_pool.bfloat16(), v_pool.bfloat16(), slots, 0, scale=0.3) is None
    assert call(q, k_pool, v_pool, slots.long(), 0, scale=0.3) is None
    odd = make_case([0], [5], 4, 2, 24, torch.float32)
    assert _native(odd, 0.3) is None
    out = extend_attention(*odd, scale=0.3)  # the torch path serves it
    torch.testing.assert_close(out.double(), naive_extend(*odd, scale=0.3), atol=1e-5, rtol=1e-5)


def test_native_rejects_slots_outside_the_pool() -> None:
    q, k_pool, v_pool, r2t, req_slots, _, _ = make_case([0], [5], 4, 2, 16, torch.float32)
    slots = r2t[req_slots[0], :5].clone()
    slots[3] = k_pool.shape[0]
    with pytest.raises(ValueError, match="outside the pool"):
        extend_native.native_extend(q, k_pool, v_pool, slots, 0, scale=0.3)


def test_native_and_torch_paths_agree_on_a_long_prompt() -> None:
    """A 1,000-token prompt at a Llama head layout: the C kernel and torch's flash kernel."""
    case = make_case([0], [1000], 8, 2, 64, torch.float32, seed=3)
    got = extend_attention_torch(*case, scale=0.125)
    want = extend_attention_torch(*case, scale=0.125, native=False)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)

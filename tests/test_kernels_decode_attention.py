"""paged_decode_attention: Triton (interpreter) vs torch path vs explicit per-request math."""

from __future__ import annotations

import pytest
import torch

import plait.kernels._decode_native as decode_native
from plait.kernels import paged_decode_attention
from plait.kernels._native import load_native
from plait.kernels.decode_attention import paged_decode_attention_triton

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def make_case(seq_lens: list[int], hq: int, hkv: int, d: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b = len(seq_lens)
    max_len = max(seq_lens + [1])
    slots_needed = sum(seq_lens) + 1
    pool = slots_needed + 17
    k_pool = torch.randn(pool, hkv, d, generator=g).to(dtype)
    v_pool = torch.randn(pool, hkv, d, generator=g).to(dtype)
    # Requests live at scattered table rows; their slots are a random permutation (slot 0 unused).
    req_to_token = torch.zeros(b + 3, max_len + 5, dtype=torch.int32)
    req_slots = torch.randperm(b + 3, generator=g)[:b]
    perm = torch.randperm(pool - 1, generator=g) + 1
    used = 0
    for i, n in enumerate(seq_lens):
        req_to_token[req_slots[i], :n] = perm[used : used + n].int()
        used += n
    q = torch.randn(b, hq, d, generator=g).to(dtype)
    return q, k_pool, v_pool, req_to_token, req_slots, torch.tensor(seq_lens)


@pytest.fixture(params=["native", "torch"])
def cpu_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a CPU test through the C kernel (csrc/decode_attention_cpu.c) and through the
    grouped torch path it falls back to."""
    if request.param == "torch":
        monkeypatch.setattr(decode_native, "load_native", lambda name: None)
    else:
        assert load_native("decode_attention_cpu") is not None  # the C kernel really runs
    return str(request.param)


def naive_decode(
    q, k_pool, v_pool, req_to_token, req_slots, seq_lens, scale, window=None, softcap=None
):
    b, hq, d = q.shape
    group = hq // k_pool.shape[1]
    out = torch.zeros(b, hq, d, dtype=torch.float64)
    for i in range(b):
        n = int(seq_lens[i])
        qpos = n - 1
        for h in range(hq):
            keys, vals = [], []
            for pos in range(n):
                if window is not None and qpos - pos >= window:
                    continue
                slot = int(req_to_token[req_slots[i], pos])
                keys.append(k_pool[slot, h // group].double())
                vals.append(v_pool[slot, h // group].double())
            if not keys:
                continue
            scores = torch.stack(keys) @ q[i, h].double() * scale
            if softcap is not None:
                scores = softcap * torch.tanh(scores / softcap)
            out[i, h] = torch.softmax(scores, 0) @ torch.stack(vals)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("hq", "hkv", "d"), [(2, 2, 64), (8, 2, 128), (16, 2, 64)])
def test_triton_matches_torch(dtype: torch.dtype, hq: int, hkv: int, d: int) -> None:
    seq_lens = [1, 63, 129, 2000]
    case = make_case(seq_lens, hq, hkv, d, dtype, seed=hq + d)
    scale = d**-0.5
    ref = paged_decode_attention(*case, scale=scale, impl="torch")
    out = paged_decode_attention_triton(*case, scale=scale, num_splits=2, block_n=128)
    assert out.dtype == dtype and out.shape == ref.shape
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [1, 50, 4096])
def test_triton_sliding_window(dtype: torch.dtype, window: int) -> None:
    case = make_case([1, 40, 64, 300], 8, 2, 64, dtype, seed=window)
    ref = paged_decode_attention(*case, scale=0.125, sliding_window=window, impl="torch")
    out = paged_decode_attention(*case, scale=0.125, sliding_window=window, impl="triton")
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize(("hq", "hkv"), [(2, 2), (8, 2), (8, 1)])
def test_torch_matches_naive(window: int | None, hq: int, hkv: int, cpu_path: str) -> None:
    case = make_case([1, 5, 33, 70], hq, hkv, 16, torch.float32, seed=hq * 3 + hkv)
    out = paged_decode_attention(*case, scale=0.3, sliding_window=window)
    want = naive_decode(*case, scale=0.3, window=window)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


def test_zero_length_and_empty_batch(cpu_path: str) -> None:
    q, k_pool, v_pool, r2t, req_slots, _ = make_case([3, 4], 4, 2, 16, torch.float32)
    seq_lens = torch.tensor([0, 4])
    for impl in ("torch", "triton"):
        out = paged_decode_attention(
            q, k_pool, v_pool, r2t, req_slots, seq_lens, scale=0.25, impl=impl
        )
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        assert torch.isfinite(out).all()
        empty = paged_decode_attention(
            q[:0], k_pool, v_pool, r2t, req_slots[:0], seq_lens[:0], scale=0.25, impl=impl
        )
        assert empty.shape == (0, 4, 16)


def test_input_checks() -> None:
    q, k_pool, v_pool, r2t, req_slots, seq_lens = make_case([3, 4], 4, 2, 16, torch.float32)
    args = dict(scale=0.25)

    def call(**over):
        kw = dict(
            q=q,
            k_pool=k_pool,
            v_pool=v_pool,
            req_to_token=r2t,
            req_slots=req_slots,
            seq_lens=seq_lens,
        )
        kw.update(over)
        return paged_decode_attention(**kw, **args)

    with pytest.raises(ValueError, match="q must be 3-D"):
        call(q=q[0])
    with pytest.raises(ValueError, match="k_pool head dim"):
        call(k_pool=k_pool[..., :8].contiguous())
    with pytest.raises(ValueError, match="kv heads"):
        call(k_pool=torch.zeros(10, 3, 16), v_pool=torch.zeros(10, 3, 16))
    with pytest.raises(ValueError, match="v_pool"):
        call(v_pool=v_pool.half())
    with pytest.raises(ValueError, match="req_to_token"):
        call(req_to_token=r2t.float())
    with pytest.raises(ValueError, match="seq_lens"):
        call(seq_lens=seq_lens[:1])
    with pytest.raises(ValueError, match="req_slots"):
        call(req_slots=req_slots[:1], seq_lens=seq_lens[:1])
    with pytest.raises(ValueError, match="sliding_window"):
        paged_decode_attention(
            q, k_pool, v_pool, r2t, req_slots, seq_lens, scale=0.25, sliding_window=0
        )
    with pytest.raises(ValueError, match="scale"):
        paged_decode_attention(q, k_pool, v_pool, r2t, req_slots, seq_lens, scale=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("hq", "hkv", "prefix"), [(8, 2, 5), (4, 4, 33), (8, 1, 1)])
def test_shared_prefix_path_matches_naive(hq: int, hkv: int, prefix: int, cpu_path: str) -> None:
    """Requests whose first `prefix` positions share slots: the cascade path is exact."""
    q, k_pool, v_pool, r2t, req_slots, seq_lens = make_case(
        [40, 33, 70, 35], hq, hkv, 16, torch.float32
    )
    shared = r2t[req_slots[0], :prefix].clone()
    for row in req_slots:
        r2t[row, :prefix] = shared
    out = paged_decode_attention(
        q, k_pool, v_pool, r2t, req_slots, seq_lens, scale=0.3, shared_prefix_len=prefix
    )
    want = naive_decode(q, k_pool, v_pool, r2t, req_slots, seq_lens, scale=0.3)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    plain = paged_decode_attention(q, k_pool, v_pool, r2t, req_slots, seq_lens, scale=0.3)
    torch.testing.assert_close(out, plain, atol=1e-5, rtol=1e-5)


def test_torch_path_groups_mixed_lengths(cpu_path: str) -> None:
    """Enough requests of mixed lengths that the torch path splits them into several
    length-sorted groups (including empty and single-token ones); order is preserved."""
    g = torch.Generator().manual_seed(5)
    lens = [0, 1] + torch.randint(2, 3000, (38,), generator=g).tolist()
    # [hkv=1, d=16] rows: about 10 requests per 2 MiB group, so several groups form
    case = make_case(lens, 2, 1, 16, torch.float32, seed=11)
    out = paged_decode_attention(*case, scale=0.125)
    want = naive_decode(*case, scale=0.125)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


def test_shared_prefix_with_empty_suffixes_and_many_groups(cpu_path: str) -> None:
    lens = [64] * 3 + [64 + 37 * i for i in range(1, 30)]
    q, k_pool, v_pool, r2t, req_slots, seq_lens = make_case(lens, 8, 2, 64, torch.float32)
    shared = r2t[req_slots[0], :64].clone()
    for row in req_slots:
        r2t[row, :64] = shared
    out = paged_decode_attention(
        q, k_pool, v_pool, r2t, req_slots, seq_lens, scale=0.125, shared_prefix_len=64
    )
    want = naive_decode(q, k_pool, v_pool, r2t, req_slots, seq_lens, scale=0.125)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("hq", "hkv", "d"),
    [(8, 4, 64), (6, 3, 80), (16, 2, 128), (4, 1, 256), (9, 3, 48), (4, 2, 72), (2, 1, 272)],
)  # fp32 d in 16..256 by 16 takes the 16-lane vector path on AVX-512 (64 and 128 specialized,
# 48, 80 and 256 the general branch), d in 8..256 by 8 the 8-lane one on AVX2 (72 too); 272 the
# scalar loops, as bf16 always does
@pytest.mark.parametrize("softcap", [None, 0.5])
def test_native_matches_naive(
    dtype: torch.dtype, hq: int, hkv: int, d: int, softcap: float | None
) -> None:
    """The C kernel against float64 math over the same (rounded) pool, with its log-sum-exp;
    with a soft cap (Gemma 2: cap * tanh(score / cap), here about the scores' size)."""
    case = make_case([0, 1, 2, 63, 129, 777], hq, hkv, d, dtype, seed=hq * d)
    q, k_pool, v_pool, r2t, req_slots, seq = case
    # a table whose row stride is not its width; request 2 starts past its end (empty)
    r2t = torch.cat([r2t, torch.full((r2t.shape[0], 7), -1, dtype=torch.int32)], 1)[:, :-7]
    assert r2t.stride(0) != r2t.shape[1]
    start = torch.tensor([0, 0, 5, 10, 0, 700])
    got = decode_native.native_decode(
        q, k_pool, v_pool, r2t, req_slots, seq, start, scale=0.1, softcap=softcap
    )
    assert got is not None
    out, lse = got
    for i in range(len(seq)):
        n, s0 = int(seq[i]), int(start[i])
        slots = r2t[req_slots[i], s0:n].long()
        if n <= s0:
            assert torch.equal(out[i], torch.zeros_like(out[i]))
            assert torch.isinf(lse[i]).all() and (lse[i] < 0).all()
            continue
        group = hq // hkv
        k = k_pool[slots].double().repeat_interleave(group, dim=1)  # [n, hq, d]
        v = v_pool[slots].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[i].double(), k) * 0.1
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        want = torch.einsum("hn,nhd->hd", torch.softmax(scores, -1), v)
        torch.testing.assert_close(out[i].double(), want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse[i].double(), torch.logsumexp(scores, -1), atol=1e-5, rtol=0)


def test_native_declines_fp16_pools() -> None:
    """The C kernel reads fp32 and bf16 pools; fp16 goes to the torch path and still agrees."""
    q, k_pool, v_pool, r2t, req_slots, seq = make_case([5, 40], 4, 2, 16, torch.float16)
    start = torch.zeros_like(seq)
    assert (
        decode_native.native_decode(q, k_pool, v_pool, r2t, req_slots, seq, start, scale=1) is None
    )
    # nor shapes it cannot map (more kv heads than query heads)
    args = (q[:, :1].float(), k_pool.float(), v_pool.float(), r2t, req_slots, seq, start)
    assert decode_native.native_decode(*args, scale=1.0) is None
    out = paged_decode_attention(q, k_pool, v_pool, r2t, req_slots, seq, scale=1.0)
    want = naive_decode(q, k_pool, v_pool, r2t, req_slots, seq, scale=1.0)
    torch.testing.assert_close(out.double(), want, atol=2e-3, rtol=2e-3)


def test_native_rejects_out_of_range_indices() -> None:
    """The C kernel reads memory directly: indices outside the table or pool are errors."""
    q, k_pool, v_pool, r2t, req_slots, seq = make_case([5, 40], 4, 2, 16, torch.float32)
    start = torch.zeros_like(seq)
    args = (q, k_pool, v_pool)
    with pytest.raises(ValueError, match="req_slots"):
        decode_native.native_decode(*args, r2t, req_slots + 100, seq, start, scale=1.0)
    with pytest.raises(ValueError, match="positions"):
        decode_native.native_decode(*args, r2t, req_slots, seq + 1000, start, scale=1.0)
    bad = r2t.clone()
    bad[req_slots[1], 3] = k_pool.shape[0]
    with pytest.raises(ValueError, match="outside the pool"):
        decode_native.native_decode(*args, bad, req_slots, seq, start, scale=1.0)


@pytest.mark.parametrize("threads", [2, 3, 64])
def test_native_split_over_threads_is_exact(threads: int) -> None:
    """Requests split over threads give bit-identical results to one thread (each request is
    computed the same way wherever it runs), including empty requests and more threads than
    requests."""
    lens = [0, 1, 700, 5, 64, 300, 2, 129]
    q, k_pool, v_pool, r2t, req_slots, seq = make_case(lens, 8, 4, 64, torch.float32, seed=3)
    start = torch.zeros_like(seq)
    args = (q, k_pool, v_pool, r2t, req_slots, seq, start)
    one = decode_native.native_decode(*args, scale=0.125, threads=1)
    many = decode_native.native_decode(*args, scale=0.125, threads=threads)
    assert one is not None and many is not None
    assert torch.equal(one[0], many[0]) and torch.equal(one[1], many[1])
    bad = r2t.clone()
    bad[req_slots[-1], 3] = -5  # an error in a later range still surfaces
    with pytest.raises(ValueError, match="outside the pool"):
        decode_native.native_decode(
            q, k_pool, v_pool, bad, req_slots, seq, start, scale=1.0, threads=threads
        )


@pytest.mark.parametrize("window", [None, 7])
def test_soft_cap_matches_naive_and_triton(cpu_path: str, window: int | None) -> None:
    """The attention soft cap: the CPU path (the C kernel, and the grouped torch path)
    against the explicit math, the Triton kernel against it; the shared-prefix cascade is not
    taken under a cap (its answer is the capped one)."""
    case = make_case([1, 5, 33, 70], 8, 2, 16, torch.float32, seed=5)
    out = paged_decode_attention(*case, scale=0.9, sliding_window=window, softcap=3.0)
    want = naive_decode(*case, scale=0.9, window=window, softcap=3.0)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    assert float((want - naive_decode(*case, scale=0.9, window=window)).abs().max()) > 1e-2
    tri = paged_decode_attention(
        *case, scale=0.9, sliding_window=window, softcap=3.0, impl="triton"
    )
    torch.testing.assert_close(tri, out, atol=2e-5, rtol=2e-5)
    q, k_pool, v_pool, r2t, slots, seq = case
    r2t[slots, :1] = r2t[slots[0], :1]  # every request shares position 0's slot
    shared = paged_decode_attention(*case, scale=0.9, softcap=3.0, shared_prefix_len=1)
    want = naive_decode(q, k_pool, v_pool, r2t, slots, seq, scale=0.9, softcap=3.0)
    torch.testing.assert_close(shared.double(), want, atol=1e-5, rtol=1e-5)

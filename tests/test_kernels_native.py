"""GGUF weights in the CPU kernels' native layout (`NativeWeight`): every kind packed from its
blocks de-quantizes bit for bit like the file (the `gguf` package's de-quantization, through
plait's unpacker, which tests/test_gguf_quants.py holds to it), at about the file's size; the
C kernel on every ISA within the stated bound of the exact product (helpers.native_bound);
weights of several kinds stacked, sliced by rows and columns, split over threads."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants
from gguf_synthetic import random_blocks

import plait.kernels._quant_native as qn
import plait.kernels.quant as quant_module
from helpers import native_bound
from plait.backend.gguf.quants import QUANT_KINDS, unpack_blocks
from plait.kernels.native_weight import NativeWeight, gguf_form
from plait.kernels.quant import quant_embedding, quant_linear

BEST = qn.native_isa()
ISAS = [] if BEST is None else list(qn.ISAS[: qn.ISAS.index(BEST) + 1])
pytestmark = pytest.mark.skipif(not ISAS, reason="no C compiler")
LEGACY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")


def raw_rows(kind: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Rows of GGUF blocks: gguf's own quantizer for the legacy kinds (weights with outliers),
    random valid blocks for the K-quants and IQ4."""
    rng = np.random.default_rng(seed)
    if kind not in LEGACY:
        return random_blocks(kind, rows, cols, rng)
    w = rng.normal(size=(rows, cols)) * np.exp(rng.normal(size=(rows, 1)))
    return quants.quantize(w.astype(np.float32), GGMLQuantizationType[kind])


def terms(dense: torch.Tensor, kind: str, raw: np.ndarray, cols: int) -> torch.Tensor:
    q = unpack_blocks(kind, raw, cols)
    t = (q.codes.double().view(q.shape[0], -1, q.group) * q.scales.double()[..., None]).abs()
    t = t.view(q.shape)
    if q.mins is not None:
        t = t + q.mins.double().abs().repeat_interleave(q.group, dim=1)
    return t + dense.double().abs()  # covers the zero offsets' rounding too


@pytest.mark.parametrize("kind", QUANT_KINDS)
def test_every_kind_packs_exactly_at_its_file_size(kind: str) -> None:
    raw = raw_rows(kind, 48, 1024, seed=1)
    rows = torch.randperm(48, generator=torch.Generator().manual_seed(0))
    w = NativeWeight.from_gguf(kind, raw, rows=rows)
    want = unpack_blocks(kind, raw, 1024).dequantize()[rows]
    assert torch.equal(w.dequantize(), want)
    assert torch.equal(w.dequantize_rows(torch.tensor([5, 0, 47])), want[[5, 0, 47]])
    # at most the file's bytes plus a byte per 16 values where the file packs 4-bit (Q2_K's
    # scale and min) or 6-bit (Q3_K's, IQ4_XS's) sub-scales tighter
    most = 1.2 if kind == "Q2_K" else 1.07
    assert raw.nbytes <= w.nbytes <= raw.nbytes * most, w.nbytes / raw.nbytes
    assert w.parts[0].kind == kind and w.parts[0].form == gguf_form(kind)[0]


@pytest.mark.parametrize("kind", QUANT_KINDS)
@pytest.mark.parametrize("m", [1, 3, 16, 37])
def test_kernel_every_isa_within_bound(kind: str, m: int) -> None:
    n, k = 45, 512  # a last block of 13 rows: on AVX2 its second part of 8 is short
    raw = raw_rows(kind, n, k, seed=m)
    w = NativeWeight.from_gguf(kind, raw)
    dense = w.dequantize()
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=gen) * torch.logspace(-2, 1, k)  # outlier channels
    bias = torch.randn(n, generator=gen)
    exact = x.double() @ dense.double().T + bias.double()
    bound = native_bound(x, dense, terms(dense, kind, raw, k), span=w.column_step)
    outs = [qn.native_quant_linear(x, w, bias, isa=isa) for isa in ISAS]
    for isa, out in zip(ISAS, outs, strict=True):
        assert out is not None
        err = (out.double() - exact).abs()
        assert bool((err <= bound).all()), f"{isa}: err / bound {float((err / bound).max())}"
    assert all(torch.equal(outs[0], o) for o in outs)  # the ISAs agree bit for bit


def one_byte(x: torch.Tensor, span: int) -> torch.Tensor:
    """x as the kernel holds it with x_bits 8, in float64: per `span` values dx = max|x| / 127,
    each value round(x / dx) * dx, rounded as quantize_row rounds (in fp32, halves away from
    zero)."""
    m, k = x.shape
    xs = x.float().view(m, k // span, span)
    amax = xs.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros_like(amax))
    r = xs * inv
    q = torch.trunc(torch.where(r >= 0, r + 0.5, r - 0.5))
    dx = (amax / (127.0 * 256.0)).double() * 256.0  # stored / 256, as the kernel scales it
    return (q.double() * dx).view(m, k)


@pytest.mark.parametrize("kind", QUANT_KINDS)
@pytest.mark.parametrize("m", [1, 5, 37])
def test_one_byte_x_is_its_rounded_x_exactly_on_every_isa(kind: str, m: int) -> None:
    """With x_bits 8 the kernel computes W times x rounded to one byte per value, exactly but
    for fp32 rounding (the bound's second term), on every ISA bit for bit."""
    n, k = 45, 512
    raw = raw_rows(kind, n, k, seed=m + 7)
    w = NativeWeight.from_gguf(kind, raw).with_x_bits(8)
    dense = w.dequantize()
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * torch.logspace(-2, 1, k)
    exact = one_byte(x, w.column_step) @ dense.double().T
    bound = 2.0**-18 * (x.double().abs() @ terms(dense, kind, raw, k).T) + 1e-30
    outs = [qn.native_quant_linear(x, w, isa=isa) for isa in ISAS]
    for isa, out in zip(ISAS, outs, strict=True):
        assert out is not None
        err = (out.double() - exact).abs()
        assert bool((err <= bound).all()), f"{isa}: err / bound {float((err / bound).max())}"
    assert all(torch.equal(outs[0], o) for o in outs)
    two = qn.native_quant_linear(x, w.with_x_bits(16))  # the default: within dx / 256
    assert two is not None and not torch.equal(two, outs[0])


def test_the_portable_builds_gemm_rounds_x_to_one_byte_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without AVX2, 32 rows or more take dequantize + GEMM: with x_bits 8 x is rounded first,
    as the kernel rounds it (within fp32 GEMM rounding of the kernel's result)."""
    raw = raw_rows("Q4_K", 48, 512, seed=9)
    w = NativeWeight.from_gguf("Q4_K", raw).with_x_bits(8)
    x = torch.randn(40, 512, generator=torch.Generator().manual_seed(9))
    kernel = qn.native_quant_linear(x, w)
    monkeypatch.setattr(quant_module, "native_isa", lambda: "generic")
    gemm = quant_module.quant_linear_native(x, w)
    dense = w.dequantize()
    bound = 2.0**-14 * (x.double().abs() @ terms(dense, "Q4_K", raw, 512).T)
    assert kernel is not None and bool(((gemm.double() - kernel.double()).abs() <= bound).all())


def test_x_bits_is_checked_and_kept_by_stack_and_slice() -> None:
    w = NativeWeight.from_gguf("Q4_K", raw_rows("Q4_K", 32, 256, seed=2))
    with pytest.raises(ValueError, match="x_bits"):
        w.with_x_bits(4)
    w8 = w.with_x_bits(8)
    assert w8.parts is w.parts and w.x_bits == 16 and w8.with_x_bits(8) is w8
    assert NativeWeight.stack([w8, w8]).x_bits == 8
    assert w8.slice(rows=[(0, 16)]).x_bits == 8
    with pytest.raises(ValueError, match="share their x_bits"):
        NativeWeight.stack([w, w8])


def test_the_widest_codes_against_the_widest_bytes_of_x_are_exact() -> None:
    """Q8_0 codes of -128 and 127 (the signed pair dot's extremes: |code - 128| = 128) against
    x whose bytes reach +-127 (values just past half a step, where lo is clamped): every ISA
    within the bound and bit for bit the same."""
    n, k = 21, 256
    rng = np.random.default_rng(9)
    codes = rng.choice(np.array([-128, 127, -127, 0], dtype=np.int8), size=(n, k // 32, 32))
    d = np.full((n, k // 32, 1), 0.5, dtype=np.float16).view(np.uint8)
    raw = np.concatenate([d, codes.view(np.uint8)], axis=2).reshape(n, -1)
    w = NativeWeight.from_gguf("Q8_0", raw)
    dense = w.dequantize()
    assert float(dense.min()) == -64.0
    x = torch.full((4, k), -126.499)
    x[0, ::32] = 127.0  # hi -126, lo -128 clamped to -127 around each group's maximum
    x[1] = -x[0]
    x[2, 1::2] = 127.0
    x[3] = torch.linspace(-127, 127, k)
    exact = x.double() @ dense.double().T
    bound = native_bound(x, dense, terms(dense, "Q8_0", raw, k))
    outs = [qn.native_quant_linear(x, w, isa=isa) for isa in ISAS]
    for isa, out in zip(ISAS, outs, strict=True):
        assert out is not None
        assert bool(((out.double() - exact).abs() <= bound).all()), isa
    assert all(torch.equal(outs[0], o) for o in outs)
    rows = [qn.native_quant_linear(x[i : i + 1], w) for i in range(4)]
    assert torch.equal(torch.cat([r for r in rows if r is not None]), outs[-1])


@pytest.mark.parametrize("n", [72, 56])
@pytest.mark.parametrize("x_bits", [16, 8])
@pytest.mark.parametrize("kind", QUANT_KINDS)
def test_the_super_block_path_past_a_pass_of_rows_with_the_widest_bytes(
    kind: str, x_bits: int, n: int
) -> None:
    """The super-block paths (AVX2: x + 128 against the codes, less the zero for K forms; with
    AVX-512 VNNI, K forms only, x's signed bytes against the codes as they are, 8 rows a
    vector of codes or 4 with two bytes, then one at a time; both at most 128 rows of x a pass,
    split evenly: here 66 and 65 for blocks taken in pairs, 66 and 64 and an odd last row alone
    for a block taken alone on AVX2): rows of bytes at +-127 (x + 128 at 1 and 255, the int16
    pair sums' extremes) and rows on both sides of the passes' seam stay within the bound,
    every ISA and every row alone give the same bits. 72 rows of weights: two
    pairs of blocks and a short block alone; 56: a pair whose second block is short. The legacy
    kinds run 576 values (a last run of two groups where K forms have super-blocks of eight;
    Q8_0's codes, like IQ4's, take the other paths)."""
    k, m = (576 if kind in LEGACY else 512), 131
    raw = raw_rows(kind, n, k, seed=5)
    w = NativeWeight.from_gguf(kind, raw).with_x_bits(x_bits)
    dense = w.dequantize()
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(5))
    x[:4] = 1.0
    x[1] = -1.0
    x[2, 1::2] = -1.0
    x[3, ::5] = -1.0
    if x_bits == 8:  # W times x rounded to one byte, within fp32 rounding
        exact = one_byte(x, w.column_step) @ dense.double().T
        bound = 2.0**-18 * (x.double().abs() @ terms(dense, kind, raw, k).T) + 1e-30
    else:
        exact = x.double() @ dense.double().T
        bound = native_bound(x, dense, terms(dense, kind, raw, k), span=w.column_step)
    outs = [qn.native_quant_linear(x, w, isa=isa) for isa in ISAS]
    for isa, out in zip(ISAS, outs, strict=True):
        assert out is not None
        assert bool(((out.double() - exact).abs() <= bound).all()), isa
    assert all(torch.equal(outs[0], o) for o in outs)
    for i in (0, 1, 2, 3, 65, 66, 67, 127, 128, 129, 130):
        assert torch.equal(qn.native_quant_linear(x[i : i + 1], w), outs[-1][i : i + 1]), i


def test_parts_of_different_kinds_stack_and_run_once() -> None:
    """q, k, v of Q4_K, Q4_K, Q6_K (llama.cpp's Q4_K_M): Q4_K parts join, Q6_K stays its own,
    nothing is widened; the product equals the parts' products."""
    shapes = [("Q4_K", 64), ("Q4_K", 32), ("Q6_K", 32)]
    raws = [raw_rows(kind, n, 512, seed=i) for i, (kind, n) in enumerate(shapes)]
    parts = [NativeWeight.from_gguf(kind, r) for (kind, _), r in zip(shapes, raws, strict=True)]
    w = NativeWeight.stack(parts)
    assert [(p.kind, p.n) for p in w.parts] == [("Q4_K", 96), ("Q6_K", 32)]
    assert w.nbytes == sum(p.nbytes for p in parts)
    x = torch.randn(5, 512)
    assert torch.equal(quant_linear(x, w), torch.cat([quant_linear(x, p) for p in parts], 1))
    assert torch.equal(w.dequantize(), torch.cat([p.dequantize() for p in parts]))


def test_slices_by_rows_and_columns_are_exact() -> None:
    w = NativeWeight.stack([NativeWeight.from_gguf(kind, raw_rows(kind, 48, 768, seed=2))
                            for kind in ("Q4_K", "Q8_0")])  # fmt: skip
    dense = w.dequantize()
    rows = w.slice(rows=[(16, 32), (48, 80)])
    assert torch.equal(rows.dequantize(), torch.cat([dense[16:32], dense[48:80]]))
    cols = w.slice(cols=(256, 768))
    assert torch.equal(cols.dequantize(), dense[:, 256:768])
    with pytest.raises(ValueError, match="multiples of 256"):
        w.slice(cols=(32, 768))  # inside a Q4_K super-block
    with pytest.raises(ValueError, match="multiples of 16"):
        w.slice(rows=[(8, 24)])


@pytest.mark.parametrize(("m", "x_bits"), [(7, 16), (20, 8)])  # 20 x 8: x + 128 with VNNI
@pytest.mark.parametrize("threads", [2, 3, 64])
def test_threads_give_one_threads_bits(threads: int, m: int, x_bits: int) -> None:
    raw = raw_rows("Q6_K", 16 * 40 + 5, 512, seed=3)
    w = NativeWeight.from_gguf("Q6_K", raw).with_x_bits(x_bits)
    x = torch.randn(m, 512)
    one = qn.native_quant_linear(x, w, threads=1)
    many = qn.native_quant_linear(x, w, threads=threads)
    assert qn.last_parts > 1
    assert one is not None and many is not None and torch.equal(one, many)


@pytest.mark.parametrize("x_bits", [16, 8])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", QUANT_KINDS)
def test_a_row_does_not_depend_on_the_batch(kind: str, isa: str, x_bits: int) -> None:
    """One row alone (scales made per group as the codes stream), rows in fours and in
    sixteens (scales made once per block), and the remainder all give a row the same bits."""
    w = NativeWeight.from_gguf(kind, raw_rows(kind, 40, 512, seed=4)).with_x_bits(x_bits)
    x = torch.randn(23, 512, generator=torch.Generator().manual_seed(4))

    def run(rows: torch.Tensor) -> torch.Tensor:
        out = qn.native_quant_linear(rows, w, isa=isa)
        assert out is not None
        return out

    whole = run(x)
    for i in range(23):
        assert torch.equal(run(x[i : i + 1]), whole[i : i + 1]), i
    assert torch.equal(run(x[:3]), whole[:3])


@pytest.mark.parametrize("x_bits", [8, 16])
def test_a_k_form_beside_a_float_form_past_64_rows_agrees_on_every_isa(x_bits: int) -> None:
    """A K form and a float form stacked in one weight read one x on different paths: with
    AVX-512 VNNI the K form takes its super-block path (x laid out by super-block, signed)
    while the float form keeps the 16-lane loops; asked for AVX-512 without VNNI, the K form
    runs AVX2's super-block path (part_isa; x + 128) and the float form the 16-lane loops.
    Every ISA, and every row alone (one row: the 16-lane loops for both), give the same bits,
    within the bound of the exact product."""
    k = 512
    shapes = [("Q4_0", 40), ("Q4_K", 56)]
    w = NativeWeight.stack([NativeWeight.from_gguf(kind, raw_rows(kind, n, k, seed=n))
                            for kind, n in shapes]).with_x_bits(x_bits)  # fmt: skip
    x = torch.randn(72, k, generator=torch.Generator().manual_seed(7))
    outs = [qn.native_quant_linear(x, w, isa=isa) for isa in ISAS]
    assert all(o is not None and torch.equal(outs[0], o) for o in outs)
    for i in (0, 1, 63, 64, 71):
        assert torch.equal(qn.native_quant_linear(x[i : i + 1], w), outs[-1][i : i + 1]), i
    dense = w.dequantize().double()
    err = (outs[0].double() - x.double() @ dense.T).abs()
    assert float(err.max()) < 1e-2 * float(x.abs().max()) * float(dense.abs().sum(1).max())


@pytest.mark.parametrize("first", ["Q6_K", "Q8_0"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m", [16, 20, 37])
def test_chunks_of_blocks_give_a_rows_bits(m: int, threads: int, first: str) -> None:
    """Large batches run blocks in chunks (on AMX, a single sixteen of rows decodes each group
    as it goes, two or more have every block's codes decoded once per chunk and pass over it):
    chunks that end inside a part and at a part's end, a part's last block of 8 rows, one or
    two sixteens and a remainder, a bias and two threads all give every row the bits it gets
    alone. With a Q8_0 part beside the K-quant one, x is quantized per super-block and laid out
    in pairs of groups for both, and the Q8_0 part reads it so."""
    k = 2048  # 12 blocks to a chunk: the Q4_K part's 26 blocks take three
    shapes = [(first, 40), ("Q4_K", 16 * 25 + 8)]
    w = NativeWeight.stack([NativeWeight.from_gguf(kind, raw_rows(kind, n, k, seed=n))
                            for kind, n in shapes])  # fmt: skip
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(5))
    bias = torch.randn(w.n, generator=torch.Generator().manual_seed(6))
    whole = qn.native_quant_linear(x, w, bias, threads=threads)
    assert whole is not None and whole.shape == (m, w.n)
    for i in range(m):
        alone = qn.native_quant_linear(x[i : i + 1], w, bias, threads=1)
        assert alone is not None and torch.equal(alone, whole[i : i + 1]), i
    dense = w.dequantize()
    err = (whole.double() - (x.double() @ dense.double().T + bias.double())).abs()
    assert float(err.max()) < 1e-3 * float(x.abs().max()) * float(dense.abs().sum(1).max())


def test_nonfinite_input_gives_nan_in_its_row_only() -> None:
    w = NativeWeight.from_gguf("Q5_K", raw_rows("Q5_K", 32, 512, seed=5))
    x = torch.randn(3, 512)
    x[0, 5], x[1, 300] = float("inf"), float("nan")
    out = qn.native_quant_linear(x, w)
    assert out is not None and out[:2].isnan().all() and out[2].isfinite().all()


@pytest.mark.parametrize("kind", ["Q4_K", "Q4_1"])
def test_rows_too_small_for_a_scale_give_zeros_on_every_isa(kind: str) -> None:
    """A row whose largest value is below 127 / FLT_MAX (no finite 1 / dx) quantizes to
    zeros, not to bytes out of range; the other rows are untouched."""
    w = NativeWeight.from_gguf(kind, raw_rows(kind, 32, 512, seed=7))
    x = torch.randn(17, 512)
    x[3] = 1e-38
    x[4] = 0.0
    x[4, ::3] = -2e-39
    outs = [qn.native_quant_linear(x, w, isa=isa) for isa in ISAS]
    for out in outs:
        assert out is not None and bool(out.isfinite().all())
        assert float(out[3:5].abs().max()) < 1e-30
    assert all(torch.equal(outs[0], o) for o in outs)
    assert torch.equal(qn.native_quant_linear(x[5:6], w), outs[-1][5:6])


def test_embedding_lookup_and_bad_input() -> None:
    raw = raw_rows("IQ4_XS", 64, 256, seed=6)
    w = NativeWeight.from_gguf("IQ4_XS", raw)
    ids = torch.tensor([[3, 63], [0, 17]])
    want = unpack_blocks("IQ4_XS", raw, 256).dequantize()[ids]
    assert torch.equal(quant_embedding(ids, w), want)
    with pytest.raises(ValueError, match="ids must lie"):
        quant_embedding(torch.tensor([64]), w)
    with pytest.raises(ValueError, match="no native form"):
        NativeWeight.from_gguf("TQ1_0", raw)
    with pytest.raises(ValueError, match="rows must lie"):
        NativeWeight.from_gguf("IQ4_XS", raw, rows=torch.tensor([64]))
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType.IQ4_XS]
    with pytest.raises(ValueError, match="cannot pack"):
        NativeWeight.from_gguf("IQ4_XS", raw[:, : size * 256 // block - 1])

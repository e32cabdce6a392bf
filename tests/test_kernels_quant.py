"""Weight-only quantized matmuls: packing, the C kernel on every ISA, threads, the torch fallback,
Triton (interpreter), embedding lookup, quantize_weight, argument checks.

On the CPU the C kernel reads a weight in its native layout (a `QuantWeight` is packed once into
a `NativeWeight`; tests/test_kernels_native.py covers the GGUF kinds' own forms).

Tolerance. The reference dequantizes W and runs fp32 ``F.linear``. The C kernel holds each row
of x per group of 32 as two int8 parts (x = (hi + lo / 256) dx, dx = max|x_g| / 127), within
dx / 256 of x, and computes the rest exactly in integers, so an output may differ from the
reference by up to sum_g dx_g / 256 * sum_{k in g} |W[n, k]| (the worst case), plus fp32
rounding, bounded here by 2^-18 * sum_k |x_k| (|s q| + |m|). Every check below holds each output
to that bound.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import plait.kernels._quant_native as qn
from helpers import native_bound
from plait.kernels._native import load_native
from plait.kernels.quant import (
    native_form,
    quant_embedding,
    quant_linear,
    quant_linear_reference,
    quant_linear_torch,
    quant_linear_triton,
)
from plait.kernels.quant_weight import QuantWeight, quantize_weight

BEST = qn.native_isa()
ISAS = [] if BEST is None else list(qn.ISAS[: qn.ISAS.index(BEST) + 1])

# name: (codes low, high, dtype, with mins, group, fp16-exact scales)
FORMATS = {
    "q4_0": (0, 15, torch.uint8, False, 32, True),
    "q4_1": (0, 15, torch.uint8, True, 32, True),
    "q8_0": (-128, 127, torch.int8, False, 32, True),
    "q4_k": (0, 15, torch.uint8, True, 32, False),
    "q5_k": (0, 31, torch.int8, True, 32, False),
    "q6_k": (-32, 31, torch.int8, False, 16, False),
}


def logical(
    fmt: str, n: int, k: int, *, group: int | None = None, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
    """A random logical weight in the GGUF reader's form for format ``fmt``."""
    lo, hi, dtype, has_mins, g0, exact = FORMATS[fmt]
    group = group or g0
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(lo, hi + 1, (n, k), generator=gen).to(dtype)
    scales = torch.rand(n, k // group, generator=gen) * 0.02 + 1e-3
    mins = -torch.rand(n, k // group, generator=gen) * 0.1 if has_mins else None
    if exact:
        scales = scales.half().float()
        mins = None if mins is None else mins.half().float()
    else:  # K-quants: fp16 d times a 6-bit sc (not always fp16-exact)
        scales = scales.half().float() * torch.randint(1, 64, scales.shape, generator=gen) / 37
        mins = None if mins is None else mins.half().float() * 63 / 41
    return codes, scales, mins, group


def logical_dense(codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None, group: int):
    n, k = codes.shape
    w = codes.double().view(n, -1, group) * scales.double()[..., None]
    if mins is not None:
        w = w + mins.double()[..., None]
    return w.view(n, k)


def error_bound(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    """Per-output bound on |C kernel - exact| (see the module docstring)."""
    codes, scales, mins = w.unpack()
    terms = (codes.double().abs().view(w.n, -1, w.group) * scales.double().abs()[..., None]).view(
        w.n, w.k
    )
    if mins is not None:
        terms = terms + mins.double().abs().repeat_interleave(w.group, dim=1)
    return native_bound(x, logical_dense(codes, scales, mins, w.group), terms)


def assert_within(out: torch.Tensor, x: torch.Tensor, w: QuantWeight, bias=None) -> None:
    codes, scales, mins = w.unpack()
    exact = x.double() @ logical_dense(codes, scales, mins, w.group).T
    if bias is not None:
        exact = exact + bias.double()
    err = (out.double() - exact).abs()
    bound = error_bound(x, w)
    assert bool((err <= bound).all()), f"max err/bound {float((err / bound).max()):.3f}"


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("group", [None, 64, 128, 256])
def test_pack_roundtrip_and_dequantize(fmt: str, group: int | None) -> None:
    codes, scales, mins, group = logical(fmt, 37, 512, group=group)
    w = QuantWeight.pack(codes=codes, scales=scales, mins=mins, group=group)
    c2, s2, m2 = w.unpack()
    assert torch.equal(c2, codes) and torch.equal(s2, scales)
    assert (m2 is None) == (mins is None) and (mins is None or torch.equal(m2, mins))
    fp32 = codes.float().view(37, -1, group) * scales[..., None]  # the formula in fp32
    if mins is not None:
        fp32 = fp32 + mins[..., None]
    assert torch.equal(w.dequantize(), fp32.view(37, 512))
    exact = FORMATS[fmt][5]
    assert w.scales.dtype == (torch.float16 if exact else torch.float32)
    assert w.bits == (4 if codes.dtype == torch.uint8 else 8)


def test_resident_bytes_match_gguf() -> None:
    """Q4_1 and Q8_0 cost exactly their GGUF block size (20 and 34 bytes per 32 weights)."""
    n, k = 3072, 576
    w41 = QuantWeight.pack(**_kw(logical("q4_1", n, k)))
    w80 = QuantWeight.pack(**_kw(logical("q8_0", n, k)))
    assert w41.nbytes == n * k // 32 * 20
    assert w80.nbytes == n * k // 32 * 34


def _kw(t: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]) -> dict:
    codes, scales, mins, group = t
    return {"codes": codes, "scales": scales, "mins": mins, "group": group}


@pytest.mark.skipif(not ISAS, reason="no C compiler")
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("m", [1, 3, 16, 100])
def test_native_every_isa_within_bound(fmt: str, m: int) -> None:
    w = QuantWeight.pack(**_kw(logical(fmt, 50, 320 if fmt != "q6_k" else 288, seed=m)))
    x = torch.randn(m, w.k, generator=torch.Generator().manual_seed(m))
    for isa in ISAS:
        out = qn.native_quant_linear(x, native_form(w), isa=isa)
        assert out is not None
        assert_within(out, x, w)


@pytest.mark.skipif(not ISAS, reason="no C compiler")
@pytest.mark.parametrize("group", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("bits", [4, 8])
def test_native_groups_odd_n(group: int, bits: int) -> None:
    fmt = "q4_1" if bits == 4 else "q8_0"
    w = QuantWeight.pack(**_kw(logical(fmt, 33, 2 * 256, group=group, seed=group)))
    x = torch.randn(9, w.k) * torch.logspace(-3, 2, w.k)  # outlier channels
    bias = torch.randn(w.n)
    for isa in ISAS:
        out = qn.native_quant_linear(x, native_form(w), bias, isa=isa)
        assert out is not None
        assert_within(out, x, w, bias)


@pytest.mark.skipif(not ISAS, reason="no C compiler")
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_native_row_does_not_depend_on_the_batch(fmt: str) -> None:
    """fp16 and fp32 scales, with and without mins, runs of 16 and 32: a row alone gets the
    bits it gets in a batch of 21 (AMX sixteens, fours and the remainder)."""
    w = native_form(QuantWeight.pack(**_kw(logical(fmt, 35, 256, seed=7))))
    x = torch.randn(21, 256, generator=torch.Generator().manual_seed(7))
    whole = qn.native_quant_linear(x, w)
    assert whole is not None
    for i in range(21):
        assert torch.equal(qn.native_quant_linear(x[i : i + 1], w), whole[i : i + 1]), i


@pytest.mark.skipif(not ISAS, reason="no C compiler")
@pytest.mark.parametrize("threads", [2, 3, 64])
@pytest.mark.parametrize("m", [1, 13])
def test_native_threads_bit_exact(threads: int, m: int) -> None:
    """Row blocks split over the C pool's threads compute each output exactly as one thread
    does (a part is a range of whole blocks)."""
    w = QuantWeight.pack(**_kw(logical("q4_1", 16 * 64 + 3, 512)))
    x = torch.randn(m, 512)
    one = qn.native_quant_linear(x, native_form(w), threads=1)
    assert qn.last_parts == 1
    many = qn.native_quant_linear(x, native_form(w), threads=threads)
    assert qn.last_parts == min(threads, 65 * 512 * m // 8192)
    assert one is not None and many is not None and torch.equal(one, many)


@pytest.mark.skipif(not ISAS, reason="no C compiler")
def test_native_concurrent_callers() -> None:
    """Python threads calling at once: one gets the pool, the others run on their own thread."""
    w = QuantWeight.pack(**_kw(logical("q8_0", 16 * 64, 512)))
    xs = [torch.randn(4, 512) for _ in range(6)]
    want = [qn.native_quant_linear(x, native_form(w), threads=1) for x in xs]
    with ThreadPoolExecutor(3) as ex:
        for _ in range(5):
            got = list(ex.map(lambda x: qn.native_quant_linear(x, native_form(w), threads=2), xs))
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.skipif(not ISAS or sys.platform != "linux", reason="no C compiler / fork")
def test_native_pool_after_fork() -> None:
    """A forked child makes its own pool threads (the parent's are not copied)."""
    w = QuantWeight.pack(**_kw(logical("q4_1", 16 * 64, 512)))
    x = torch.randn(3, 512)
    want = qn.native_quant_linear(x, native_form(w), threads=2)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as p:
        got = p.apply(_child_linear, (x, w))
    assert torch.equal(got, want)


def _child_linear(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    out = qn.native_quant_linear(x, native_form(w), threads=2)
    assert out is not None and qn.last_parts == 2
    return out


def test_quant_linear_dispatch_dtypes_and_shapes() -> None:
    w = quantize_weight(torch.randn(40, 64), bits=4, group=32)
    x = torch.randn(2, 3, 64)
    out = quant_linear(x, w)
    assert out.shape == (2, 3, 40) and out.dtype == torch.float32
    ref = quant_linear_reference(x.reshape(6, 64), w).reshape(2, 3, 40)
    torch.testing.assert_close(out, ref, atol=2e-3, rtol=1e-3)
    xb = x.bfloat16()
    bias = torch.randn(40, dtype=torch.bfloat16)
    outb = quant_linear(xb, w, bias=bias)
    assert outb.dtype == torch.bfloat16
    refb = quant_linear_reference(xb.reshape(6, 64), w, bias=bias).reshape(2, 3, 40)
    torch.testing.assert_close(outb.float(), refb.float(), atol=5e-2, rtol=2e-2)
    assert quant_linear(torch.randn(0, 64), w).shape == (0, 40)
    strided = torch.randn(64, 5).T  # non-unit stride in K
    assert_within(quant_linear(strided, w), strided, w)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "q6_k"])
def test_fallback_without_compiler(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a C compiler the torch path dequantizes panels of rows (exact up to fp32)."""
    monkeypatch.setattr(qn, "load_native", lambda name: None)
    monkeypatch.setattr("plait.kernels.quant._PANEL_ELEMS", 16 * 64)  # several panels
    w = QuantWeight.pack(**_kw(logical(fmt, 45, 128)))
    x = torch.randn(7, 128)
    bias = torch.randn(45)
    assert qn.native_quant_linear(x, native_form(w)) is None
    out = quant_linear(x, w, bias=bias)
    torch.testing.assert_close(out, quant_linear_reference(x, w, bias=bias), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not ISAS, reason="no C compiler")
def test_portable_build_sends_large_m_to_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without AVX2 (the portable C build) only small M runs the C kernel."""
    monkeypatch.setattr(qn, "_best_isa", lambda: 0)
    w = QuantWeight.pack(**_kw(logical("q4_1", 40, 128)))
    x = torch.randn(40, 128)
    qn.last_parts = 0
    out = quant_linear(x, w)
    assert qn.last_parts == 0  # dequantized panels and F.linear: exact up to fp32
    torch.testing.assert_close(out, quant_linear_reference(x, w), atol=1e-5, rtol=1e-5)
    small = quant_linear(x[:3], w)
    assert qn.last_parts == 1
    assert_within(small, x[:3], w)


@pytest.mark.skipif(not ISAS, reason="no C compiler")
def test_native_really_runs() -> None:
    assert load_native("quant_matmul_cpu") is not None
    w = quantize_weight(torch.randn(16, 32), bits=8, group=32)
    x = torch.randn(1, 32)
    assert torch.equal(quant_linear_torch(x, w), qn.native_quant_linear(x, native_form(w)))


@pytest.mark.skipif(not ISAS, reason="no C compiler")
@pytest.mark.parametrize("bits", [4, 8])
def test_nonfinite_input_gives_nan(bits: int) -> None:
    w = quantize_weight(torch.randn(20, 64), bits=bits, group=32)
    x = torch.randn(3, 64)
    x[0, 5] = float("inf")
    x[1, 40] = float("nan")
    for isa in ISAS:
        out = qn.native_quant_linear(x, native_form(w), isa=isa)
        assert out is not None and out[:2].isnan().all() and out[2].isfinite().all()


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "q4_0", "q6_k"])
@pytest.mark.parametrize("m", [1, 5])
def test_triton_interpreter_matches_reference(fmt: str, m: int) -> None:
    w = QuantWeight.pack(**_kw(logical(fmt, 37, 64)))
    x = torch.randn(m, 64)
    bias = torch.randn(37)
    out = quant_linear(x, w, bias=bias, impl="triton")
    torch.testing.assert_close(out, quant_linear_reference(x, w, bias=bias), atol=1e-5, rtol=1e-5)
    for block_m, block_n in ((16, 16), (1, 16)):  # tl.dot tiles, and the decode path
        out2 = quant_linear_triton(x, w, block_m=block_m, block_n=block_n)
        torch.testing.assert_close(out2, quant_linear_reference(x, w), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "q6_k"])
def test_embedding_rows(fmt: str) -> None:
    w = QuantWeight.pack(**_kw(logical(fmt, 41, 96 if fmt != "q6_k" else 80)))
    ids = torch.tensor([[0, 40, 17], [16, 15, 0]])
    emb = quant_embedding(ids, w)
    assert emb.shape == (2, 3, w.k)
    assert torch.equal(emb, w.dequantize()[ids])
    assert quant_embedding(ids.int(), w, dtype=torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="ids must lie in"):
        quant_embedding(torch.tensor([41]), w)
    with pytest.raises(ValueError, match="ids must have dtype"):
        quant_embedding(torch.tensor([1.0]), w)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_quantize_weight(bits: int, group: int) -> None:
    gen = torch.Generator().manual_seed(bits + group)
    wf = torch.randn(24, 256, generator=gen) * torch.rand(24, 1, generator=gen)
    wf[3] = 0.0  # an all-zero row
    wf[5, :group] = 0.7  # a constant group
    w = quantize_weight(wf, bits=bits, group=group)
    assert w.bits == bits and w.group == group and w.scales.dtype == torch.float16
    codes, scales, mins = w.unpack()
    if bits == 8:
        assert mins is None and int(codes.abs().max()) <= 127
    else:
        assert mins is not None and int(codes.max()) <= 15
    step = scales.repeat_interleave(group, dim=1)
    err = (w.dequantize() - wf).abs()
    assert bool((err <= 0.5 * step + 1e-3 * wf.abs() + 1e-6).all())
    assert torch.equal(w.dequantize()[3], torch.zeros(256))
    tiny = quantize_weight(torch.full((16, 32), 1e-9), bits=8, group=32)  # below fp16's range
    assert tiny.scales.dtype == torch.float32
    torch.testing.assert_close(tiny.dequantize(), torch.full((16, 32), 1e-9))


def test_pack_input_checks() -> None:
    codes, scales, mins, group = logical("q4_1", 16, 64)
    with pytest.raises(ValueError, match="uint8 .* or int8"):
        QuantWeight.pack(codes=codes.int(), scales=scales, mins=mins, group=group)
    with pytest.raises(ValueError, match="0..15"):
        QuantWeight.pack(codes=codes + 16, scales=scales, mins=mins, group=group)
    with pytest.raises(ValueError, match="scales must be a float tensor"):
        QuantWeight.pack(codes=codes, scales=scales[:, :1], mins=mins, group=group)
    with pytest.raises(ValueError, match="mins must be a float tensor"):
        QuantWeight.pack(codes=codes, scales=scales, mins=mins.int(), group=group)
    with pytest.raises(ValueError, match="group must be one of"):
        QuantWeight.pack(codes=codes, scales=scales, mins=mins, group=48)
    with pytest.raises(ValueError, match="group must be one of"):
        QuantWeight.pack(codes=codes[:, :48], scales=scales, group=32)
    with pytest.raises(ValueError, match="2-D"):
        QuantWeight.pack(codes=codes[0], scales=scales, group=32)
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        quantize_weight(torch.randn(4, 32), bits=3)
    with pytest.raises(ValueError, match="group must be one of"):
        quantize_weight(torch.randn(4, 48), bits=8, group=32)


def test_linear_input_checks() -> None:
    w = quantize_weight(torch.randn(20, 64), bits=4, group=32)
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., 64\]"):
        quant_linear(torch.randn(3, 32), w)
    with pytest.raises(ValueError, match="x must have dtype"):
        quant_linear(torch.ones(3, 64, dtype=torch.int32), w)
    with pytest.raises(ValueError, match="bias must have shape"):
        quant_linear(torch.randn(3, 64), w, bias=torch.randn(21))
    with pytest.raises(ValueError, match="w must be a QuantWeight"):
        quant_linear(torch.randn(3, 64), torch.randn(20, 64))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="impl must be one of"):
        quant_linear(torch.randn(3, 64), w, impl="numpy")


def test_quant_weight_consistency_checks() -> None:
    """A QuantWeight built by hand must match its layout (the C kernel reads it directly)."""
    w = quantize_weight(torch.randn(20, 64), bits=4, group=32)
    fields = {"n": 20, "k": 64, "group": 32, "bits": 4, "codes": w.codes, "scales": w.scales}
    assert QuantWeight(**fields, mins=w.mins).n == 20
    bad = [
        {"group": 24},
        {"bits": 6},
        {"k": 96},
        {"n": 40},
        {"codes": w.codes[:, :1]},
        {"scales": w.scales.float()},  # mins stay fp16
        {"codes": w.codes.transpose(0, 1).contiguous().transpose(0, 1)},
    ]
    for change in bad:
        with pytest.raises(ValueError, match="bad QuantWeight"):
            QuantWeight(**{**fields, "mins": w.mins, **change})


@pytest.mark.skipif(not ISAS, reason="no C compiler")
def test_native_checks_what_it_reads() -> None:
    w = native_form(quantize_weight(torch.randn(20, 64), bits=8, group=32))
    with pytest.raises(ValueError, match="x must be"):
        qn.native_quant_linear(torch.randn(2, 32), w)
    with pytest.raises(ValueError, match="bias"):
        qn.native_quant_linear(torch.randn(2, 64), w, torch.randn(19))


def test_module_imports_without_triton_gpu() -> None:
    mod = importlib.import_module("plait.kernels.quant")
    assert mod.quant_linear.__doc__ and mod.QuantWeight.__doc__


COMPILE_SCRIPT = """
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import triton
from plait.kernels.quant import _quant_linear_kernel as fn

for bits, codes, scales in ((4, "*u8", "*fp16"), (8, "*i8", "*fp32")):
    ptrs = dict(x_ptr="*bf16", codes_ptr=codes, scales_ptr=scales, mins_ptr=scales,
                bias_ptr="*bf16", out_ptr="*fp32")
    for block_m in (16, 1):
        consts = dict(GROUP=32, BITS=bits, HAS_MINS=bits == 4, HAS_BIAS=True,
                      DOT_PRECISION="tf32", USE_DOT=block_m > 1, BLOCK_M=block_m, BLOCK_N=64)
        sig = {n: "constexpr" if n in consts else ptrs.get(n, "i32") for n in fn.arg_names}
        triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32))
print("compiled")
"""


def test_triton_kernel_compiles_for_sm90() -> None:
    """Lower the Triton kernel to a cubin for an H100/H200 (no GPU needed)."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", COMPILE_SCRIPT], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr:
        pytest.skip("no ptxas in this Triton install")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "compiled" in proc.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "q6_k"])
@pytest.mark.parametrize("m", [1, 16, 512])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_production_sizes(fmt: str, m: int, dtype: torch.dtype) -> None:
    """SmolLM2's gate_up and lm_head shapes through the real Triton backend."""
    for n, k in ((3072, 576), (49152, 576)):
        w = QuantWeight.pack(**_kw(logical(fmt, n, k))).to("cuda")
        x = torch.randn(m, k, device="cuda").to(dtype)
        bias = torch.randn(n, device="cuda").to(dtype)
        out = quant_linear(x, w, bias=bias)
        ref = quant_linear_reference(x, w, bias=bias)
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
        ids = torch.randint(0, n, (7,), device="cuda")
        assert torch.equal(quant_embedding(ids, w), w.dequantize()[ids])

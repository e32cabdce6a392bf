"""GGUF tensor unpacking: the logical codes/scales/mins form against gguf-py's dequantize."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter, quants
from gguf_synthetic import ALL_TYPES, write_tiny_gguf

from helpers import native_bound
from plait.backend.gguf.quants import IQ4_NL_VALUES, QuantizedTensor, read_tensor, unpack_blocks
from plait.backend.gguf.reader import GGUFFile
from plait.backend.model.gguf_loader import hf_row_order
from plait.backend.model.quantized import LogicalQuant, pack_merged
from plait.kernels import _quant_native as qn
from plait.kernels.native_weight import NativeWeight
from plait.kernels.quant import quant_linear, quant_linear_torch

# kind -> (codes dtype, lowest code, highest code, bits, group, has mins)
LAYOUT = {
    "Q4_0": (torch.uint8, 0, 15, 4, 32, True),
    "Q4_1": (torch.uint8, 0, 15, 4, 32, True),
    "Q5_0": (torch.int8, 0, 31, 5, 32, True),
    "Q5_1": (torch.int8, 0, 31, 5, 32, True),
    "Q8_0": (torch.int8, -128, 127, 8, 32, False),
    "Q4_K": (torch.uint8, 0, 15, 4, 32, True),
    "Q5_K": (torch.int8, 0, 31, 5, 32, True),
    "Q6_K": (torch.int8, -32, 31, 6, 16, False),
    "Q2_K": (torch.uint8, 0, 3, 2, 16, True),
    "Q3_K": (torch.int8, -4, 3, 3, 16, False),
    "IQ4_NL": (torch.int8, -127, 113, 4, 32, False),
    "IQ4_XS": (torch.int8, -127, 113, 4, 32, False),
}
# where each kind keeps its fp16 scales in a block: (byte offset, count)
FP16_FIELDS = {
    "Q4_0": [(0, 1)],
    "Q4_1": [(0, 2)],
    "Q5_0": [(0, 1)],
    "Q5_1": [(0, 2)],
    "Q8_0": [(0, 1)],
    "Q4_K": [(0, 2)],
    "Q5_K": [(0, 2)],
    "Q6_K": [(208, 1)],
    "Q2_K": [(80, 2)],
    "Q3_K": [(108, 1)],
    "IQ4_NL": [(0, 1)],
    "IQ4_XS": [(0, 1)],
}


def random_raw(kind: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random blocks of `kind`; fp16 scales finite (random bytes could be inf or NaN)."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    raw = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    for offset, count in FP16_FIELDS[kind]:
        vals = rng.normal(0.0, 0.05, size=(raw.shape[0], count)).astype(np.float16)
        raw[:, offset : offset + 2 * count] = vals.view(np.uint8)
    return raw.reshape(rows, -1)


def same_floats(ours: np.ndarray, ref: np.ndarray, *, signed_zero: bool) -> None:
    """Bit-exact float32; with signed_zero=False, +0 and -0 count as equal."""
    if signed_zero:
        np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))
    else:
        np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("kind", sorted(LAYOUT))
def test_unpacking_matches_gguf_dequantize(kind: str) -> None:
    raw = random_raw(kind, rows=6, cols=512)
    q = unpack_blocks(kind, raw, 512)
    ref = quants.dequantize(raw, GGMLQuantizationType[kind])
    # Q4_0's min is -8d: d*8 + (-8d) is +0 where ggml's d*(8-8) keeps the sign of d (Q5_0 alike)
    same_floats(q.dequantize().numpy(), ref, signed_zero=kind not in ("Q4_0", "Q5_0"))


@pytest.mark.parametrize("kind", sorted(LAYOUT))
def test_logical_layout(kind: str) -> None:
    dtype, low, high, bits, group, has_mins = LAYOUT[kind]
    q = unpack_blocks(kind, random_raw(kind, rows=4, cols=1024, seed=1), 1024)
    assert q.codes.dtype == dtype and q.codes.shape == (4, 1024)
    assert int(q.codes.min()) == low and int(q.codes.max()) == high
    assert (q.bits, q.group) == (bits, group)
    assert q.scales.dtype == torch.float32 and q.scales.shape == (4, 1024 // group)
    assert (q.mins is not None) == has_mins
    if q.mins is not None:
        assert q.mins.dtype == torch.float32 and q.mins.shape == q.scales.shape
    dense = q.dequantize()
    assert q.dequantize(torch.bfloat16).dtype == torch.bfloat16
    order = torch.tensor([3, 0, 2, 1])
    assert torch.equal(q.take_rows(order).dequantize(), dense[order])


def test_every_tensor_of_a_written_file_reads_like_gguf_py(tmp_path: Path) -> None:
    reader = GGUFReader(write_tiny_gguf(tmp_path / "tiny.gguf"))
    kinds = set()
    for tensor in reader.tensors:
        kinds.add(tensor.tensor_type.name)
        value = read_tensor(tensor)
        dense = value.dequantize() if isinstance(value, QuantizedTensor) else value
        ref = quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        expected_shape = tuple(int(s) for s in reversed(tensor.shape))
        assert tuple(dense.shape) == expected_shape, tensor.name
        same_floats(dense.numpy(), ref.reshape(expected_shape), signed_zero=False)
    assert kinds == set(ALL_TYPES)


@pytest.mark.parametrize("kind", ["IQ2_XXS", "IQ3_S", "IQ1_M", "TQ1_0", "MXFP4"])
def test_unsupported_type_is_named(tmp_path: Path, kind: str) -> None:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    writer = GGUFWriter(str(tmp_path / "odd.gguf"), "llama")
    raw = np.zeros((2, 256 // block * size), dtype=np.uint8)
    writer.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (tensor,) = GGUFFile(tmp_path / "odd.gguf").tensors
    with pytest.raises(NotImplementedError, match=rf"'blk.0.attn_q.weight'.*type {kind};") as err:
        read_tensor(tensor)
    assert all(name in str(err.value) for name in (*LAYOUT, "F32", "F16", "BF16"))
    with pytest.raises(NotImplementedError, match=rf"tensor type {kind}; .*'IQ4_XS'"):
        unpack_blocks(kind, raw, 256)


def test_iq4_codebook_is_ggmls() -> None:
    assert quants.IQ4_NL.kvalues == IQ4_NL_VALUES


# kind -> resident bytes per weight once packed for the kernels (docs/quantization.md)
RESIDENT = {"Q2_K": 1.0, "Q3_K": 1.25, "IQ4_NL": 1.0625, "IQ4_XS": 1.125}


@pytest.mark.parametrize("kind", sorted(RESIDENT))
def test_packed_for_the_kernels_exactly(kind: str) -> None:
    """The loader's packing keeps every value (the kernel form is exact) at the stated size."""
    q = unpack_blocks(kind, random_raw(kind, rows=32, cols=512, seed=2), 512)
    packed = pack_merged([LogicalQuant(codes=q.codes, scales=q.scales, mins=q.mins, group=q.group)])
    assert packed.bits == (4 if q.codes.dtype == torch.uint8 else 8)
    assert packed.nbytes == RESIDENT[kind] * 32 * 512
    same_floats(packed.dequantize().numpy(), q.dequantize().numpy(), signed_zero=True)


@pytest.mark.parametrize("heads", [1, 3, 9])
def test_hf_row_order_undoes_llama_cpp_permutation(heads: int) -> None:
    head_dim = 8
    hf = torch.arange(heads * head_dim * 5, dtype=torch.float32).reshape(heads * head_dim, 5)
    # llama.cpp's converter: per head, rows [2, head_dim / 2] stored as [head_dim / 2, 2]
    stored = hf.reshape(heads, 2, head_dim // 2, 5).transpose(1, 2).reshape(hf.shape)
    assert torch.equal(stored[hf_row_order(hf.shape[0], heads)], hf)


def test_plaits_reader_reads_every_field_and_tensor_like_gguf_py(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tied=True)
    ref, mine = GGUFReader(path), GGUFFile(path)
    fields = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert mine.fields == fields and "tokenizer.ggml.merges" in fields
    assert [t.name for t in mine.tensors] == [t.name for t in ref.tensors]
    for got, want in zip(mine.tensors, ref.tensors, strict=True):
        assert got.tensor_type == want.tensor_type and got.shape == tuple(map(int, want.shape))
        assert got.data.dtype == want.data.dtype and np.array_equal(got.data, want.data)


def test_plaits_reader_refuses_what_is_not_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGML" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFFile(bad)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(write_tiny_gguf(tmp_path / "whole.gguf").read_bytes()[:-64])
    with pytest.raises(ValueError, match="past the end of the file"):
        GGUFFile(cut)
    cut.write_bytes((tmp_path / "whole.gguf").read_bytes()[:100])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        GGUFFile(cut)


def kernel_terms(q: QuantizedTensor) -> torch.Tensor:
    """|s q| + |m| per weight: what fp32 rounding scales with."""
    rows, cols = q.shape
    sq = (q.codes.double().view(rows, -1, q.group) * q.scales.double()[..., None]).abs()
    terms = sq.view(rows, cols)
    if q.mins is not None:
        terms = terms + q.mins.double().abs().repeat_interleave(q.group, dim=1)
    return terms


@pytest.mark.parametrize("kind", sorted(RESIDENT))
def test_kernels_on_the_packed_weight(kind: str) -> None:
    """Every ISA of the C kernel (on the kind's native form), the Triton kernel (interpreter)
    and the dequantizing fallback against the exact product with the de-quantized weight."""
    raw = random_raw(kind, rows=20, cols=512, seed=3)
    q = unpack_blocks(kind, raw, 512)
    w = pack_merged([LogicalQuant(codes=q.codes, scales=q.scales, mins=q.mins, group=q.group)])
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(4))
    exact = x.double() @ q.dequantize().double().T
    bound = native_bound(x, q.dequantize(), kernel_terms(q))
    best = qn.native_isa()
    outs = {"triton": quant_linear(x, w, impl="triton")}
    outs["panels"] = quant_linear_torch(x, w, native=False)
    native = NativeWeight.from_gguf(kind, raw)
    for isa in [] if best is None else qn.ISAS[: qn.ISAS.index(best) + 1]:
        outs[isa] = qn.native_quant_linear(x, native, isa=isa)
    for name, out in outs.items():
        assert out is not None and out.shape == (3, 20), name
        err = (out.double() - exact).abs()
        assert bool((err <= bound).all()), f"{name}: err / bound {float((err / bound).max())}"

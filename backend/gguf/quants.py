"""GGUF tensor payloads: plain floats, or quantized blocks unpacked into a logical form.

Every quantized kind is unpacked into `QuantizedTensor` (codes, per-group scales and mins)
with value = scales * codes + mins along each row, `group` values per scale. This is the
form later kernels consume; `dequantize()` turns it into a dense matrix. Block layouts
follow ggml (llama.cpp's `ggml-common.h`); fp16 block scales become exact float32 values,
so every product and sum below is the same float32 arithmetic ggml's reference does.

| kind | codes | bits | group | scales | mins |
|---|---|---|---|---|---|
| Q4_0 | uint8 q, 0..15 | 4 | 32 | d | -8 d |
| Q4_1 | uint8 q, 0..15 | 4 | 32 | d | m |
| Q5_0 | int8 q, 0..31 | 5 | 32 | d | -16 d |
| Q5_1 | int8 q, 0..31 | 5 | 32 | d | m |
| Q8_0 | int8 q | 8 | 32 | d | None |
| Q4_K | uint8 q, 0..15 | 4 | 32 | d * sc | -dmin * m |
| Q5_K | int8 q, 0..31 | 5 | 32 | d * sc | -dmin * m |
| Q6_K | int8 q - 32, -32..31 | 6 | 16 | d * sc | None |
| Q2_K | uint8 q, 0..3 | 2 | 16 | d * sc | -dmin * m |
| Q3_K | int8 q - 4 (high bit clear) or q, -4..3 | 3 | 16 | d * (sc - 32) | None |
| IQ4_NL | int8 codebook value of q, -127..113 | 4 | 32 | d | None |
| IQ4_XS | int8 codebook value of q, -127..113 | 4 | 32 | d * (ls - 32) | None |

IQ4_NL and IQ4_XS index a non-linear 16-entry codebook (`IQ4_NL_VALUES`, ggml's
`kvalues_iq4nl`); their codes are the codebook's int8 values, so value = scale * code holds
exactly (every product here is of an fp16 scale and small integers: exact in float32).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

QK_K = 256  # values in one K-quant super-block
FLOAT_KINDS = ("F32", "F16", "BF16")
QUANT_KINDS = (
    "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ4_NL", "IQ4_XS",
)  # fmt: skip
SUPPORTED_TENSOR_TYPES = FLOAT_KINDS + QUANT_KINDS
IQ4_NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


class TensorLike(Protocol):
    """What `read_tensor` reads: a GGUF tensor's name, type, shape (fastest dimension first)
    and data (`GGUFTensor`, or the `gguf` package's `ReaderTensor`)."""

    @property
    def name(self) -> str: ...
    @property
    def tensor_type(self) -> GGMLQuantizationType: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def data(self) -> np.ndarray: ...


@dataclass(frozen=True)
class QuantizedTensor:
    """A quantized [N, K] matrix: value[n, k] = scales[n, k // group] * codes[n, k] + mins[...].

    `codes` is uint8 for the linear kinds of 4 bits or fewer (Q4_*: 0..15, Q2_K: 0..3) and
    int8 otherwise (Q5_*: 0..31, Q6_K: -32..31, Q3_K: -4..3, Q8_0: -128..127, IQ4_*: the
    codebook's values); `scales` and `mins` are float32 [N, K // group]; `mins` is None for
    the symmetric kinds (Q8_0, Q6_K, Q3_K, IQ4_*).
    """

    codes: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None
    bits: int
    group: int

    @property
    def shape(self) -> tuple[int, int]:
        rows, cols = self.codes.shape
        return rows, cols

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense [N, K] matrix (computed in float32, then cast to `dtype`)."""
        rows, cols = self.shape
        codes = self.codes.reshape(rows, cols // self.group, self.group).to(torch.float32)
        out = codes * self.scales.unsqueeze(-1)
        if self.mins is not None:
            out = out + self.mins.unsqueeze(-1)
        return out.reshape(rows, cols).to(dtype)

    def take_rows(self, index: torch.Tensor) -> QuantizedTensor:
        """The same tensor with its rows reordered (or selected) by `index`."""
        mins = None if self.mins is None else self.mins[index]
        return QuantizedTensor(
            codes=self.codes[index],
            scales=self.scales[index],
            mins=mins,
            bits=self.bits,
            group=self.group,
        )


@dataclass(frozen=True)
class QuantizedBlocks:
    """A quantized [N, K] matrix as the file stores it: `raw` uint8 [rows, bytes per row] (a
    view of the file) of kind `kind`, `cols` values a row; `rows` picks and orders its rows
    (None: all, in order). Nothing is unpacked until `unpack` or the native packer reads it."""

    kind: str
    raw: np.ndarray
    cols: int
    rows: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        n = self.raw.shape[0] if self.rows is None else self.rows.numel()
        return n, self.cols

    def take_rows(self, index: torch.Tensor) -> QuantizedBlocks:
        """The same matrix with its rows reordered (or selected) by `index`."""
        rows = index if self.rows is None else self.rows[index]
        return QuantizedBlocks(self.kind, self.raw, self.cols, rows)

    def unpack(self) -> QuantizedTensor:
        """The rows unpacked into codes, scales and mins."""
        raw = self.raw if self.rows is None else self.raw[self.rows.numpy()]
        return unpack_blocks(self.kind, raw, self.cols)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.unpack().dequantize(dtype)


def read_blocks(tensor: TensorLike) -> torch.Tensor | QuantizedBlocks:
    """A GGUF tensor as a float tensor (plain kinds, logical shape) or its quantized blocks,
    still packed (`QuantizedBlocks`); NotImplementedError for a kind plait does not read."""
    kind = tensor.tensor_type.name
    data = np.asarray(tensor.data)
    if kind in FLOAT_KINDS:
        return _read_float(kind, data, tensor)
    if kind not in _UNPACKERS:
        raise NotImplementedError(
            f"GGUF tensor {tensor.name!r} has type {kind}; plait loads {SUPPORTED_TENSOR_TYPES}"
        )
    raw = data.reshape(-1, data.shape[-1]) if data.ndim > 1 else data.reshape(1, -1)
    return QuantizedBlocks(kind, raw, int(tensor.shape[0]))


def read_tensor(tensor: TensorLike) -> torch.Tensor | QuantizedTensor:
    """A GGUF tensor as a float tensor (plain kinds, logical shape) or a QuantizedTensor."""
    kind = tensor.tensor_type.name
    data = np.asarray(tensor.data)
    if kind in FLOAT_KINDS:
        return _read_float(kind, data, tensor)
    unpack = _UNPACKERS.get(kind)
    if unpack is None:
        raise NotImplementedError(
            f"GGUF tensor {tensor.name!r} has type {kind}; plait loads {SUPPORTED_TENSOR_TYPES}"
        )
    raw = data.reshape(-1, data.shape[-1]) if data.ndim > 1 else data.reshape(1, -1)
    return unpack_blocks(kind, raw, int(tensor.shape[0]))


def unpack_blocks(kind: str, raw: np.ndarray, cols: int) -> QuantizedTensor:
    """Unpack raw uint8 rows [N, bytes per row] of quantization `kind` with `cols` values each."""
    if kind not in _UNPACKERS:
        raise NotImplementedError(f"tensor type {kind}; plait unpacks {QUANT_KINDS}")
    out = _UNPACKERS[kind](np.ascontiguousarray(raw, dtype=np.uint8))
    if out.shape[1] != cols:
        raise ValueError(f"{kind} rows hold {out.shape[1]} values, expected {cols}")
    return out


def _read_float(kind: str, data: np.ndarray, tensor: TensorLike) -> torch.Tensor:
    shape = tuple(int(s) for s in reversed(tensor.shape))
    if kind == "BF16":
        bits = data.view(np.uint16).astype(np.uint32) << 16
        return torch.from_numpy(bits.view(np.float32).reshape(shape))
    return torch.from_numpy(np.array(data, dtype=np.float32).reshape(shape))


def _blocks(raw: np.ndarray, kind: str) -> tuple[np.ndarray, int]:
    """Split rows into blocks [N * blocks per row, type size]; returns (blocks, N)."""
    block_bytes = _TYPE_SIZES[kind]
    return raw.reshape(-1, block_bytes), raw.shape[0]


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian fp16 bytes [..., 2] to float32 [...]."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return qs & np.uint8(0x0F), qs >> np.uint8(4)


def _result(
    codes: np.ndarray,
    scales: np.ndarray,
    mins: np.ndarray | None,
    rows: int,
    bits: int,
    group: int,
) -> QuantizedTensor:
    return QuantizedTensor(
        codes=torch.from_numpy(np.ascontiguousarray(codes.reshape(rows, -1))),
        scales=torch.from_numpy(np.ascontiguousarray(scales.reshape(rows, -1), np.float32)),
        mins=None
        if mins is None
        else torch.from_numpy(np.ascontiguousarray(mins.reshape(rows, -1), np.float32)),
        bits=bits,
        group=group,
    )


def _unpack_q4_0(raw: np.ndarray) -> QuantizedTensor:
    blocks, rows = _blocks(raw, "Q4_0")
    d = _f16(blocks[:, 0:2])
    low, high = _nibbles(blocks[:, 2:18])  # value j: low nibble of byte j, j + 16: high
    codes = np.concatenate([low, high], axis=1)
    return _result(codes, d, -8 * d, rows, bits=4, group=32)


def _unpack_q4_1(raw: np.ndarray) -> QuantizedTensor:
    blocks, rows = _blocks(raw, "Q4_1")
    d, m = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    low, high = _nibbles(blocks[:, 4:20])
    codes = np.concatenate([low, high], axis=1)
    return _result(codes, d, m, rows, bits=4, group=32)


def _five_bit(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1 codes: low nibbles as in Q4_0, bit j of the little-endian uint32 `qh` is
    the fifth bit of value j."""
    bits = np.ascontiguousarray(qh).view("<u4")  # [blocks, 1]
    high = ((bits >> np.arange(32, dtype=np.uint32)) & np.uint32(1)).astype(np.uint8)
    low, top = _nibbles(qs)
    return (np.concatenate([low, top], axis=1) | (high << np.uint8(4))).view(np.int8)


def _unpack_q5_0(raw: np.ndarray) -> QuantizedTensor:
    blocks, rows = _blocks(raw, "Q5_0")
    d = _f16(blocks[:, 0:2])
    codes = _five_bit(blocks[:, 2:6], blocks[:, 6:22])
    return _result(codes, d, -16 * d, rows, bits=5, group=32)


def _unpack_q5_1(raw: np.ndarray) -> QuantizedTensor:
    blocks, rows = _blocks(raw, "Q5_1")
    d, m = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    codes = _five_bit(blocks[:, 4:8], blocks[:, 8:24])
    return _result(codes, d, m, rows, bits=5, group=32)


def _unpack_q8_0(raw: np.ndarray) -> QuantizedTensor:
    blocks, rows = _blocks(raw, "Q8_0")
    d = _f16(blocks[:, 0:2])
    codes = np.ascontiguousarray(blocks[:, 2:34]).view(np.int8)
    return _result(codes, d, None, rows, bits=8, group=32)


def _k_scale_min(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit (scale, min) pairs of a Q4_K/Q5_K super-block from its 12 bytes.

    Bytes 0-3 hold scales 0-3 (low 6 bits), bytes 4-7 mins 0-3; for sub-blocks 4-7 the low
    4 bits come from bytes 8-11 (scale: low nibble, min: high nibble) and the top 2 bits
    from the top bits of bytes 0-3 (scale) and 4-7 (min).
    """
    lo_sc, lo_m, extra = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    hi_sc = (extra & np.uint8(0x0F)) | ((lo_sc >> np.uint8(6)) << np.uint8(4))
    hi_m = (extra >> np.uint8(4)) | ((lo_m >> np.uint8(6)) << np.uint8(4))
    scale = np.concatenate([lo_sc & np.uint8(0x3F), hi_sc], axis=1)
    mins = np.concatenate([lo_m & np.uint8(0x3F), hi_m], axis=1)
    return scale.astype(np.float32), mins.astype(np.float32)


def _k_low_nibbles(qs: np.ndarray) -> np.ndarray:
    """128 bytes -> 256 4-bit values: byte chunk i (32 bytes) holds sub-blocks 2i (low
    nibbles) and 2i + 1 (high nibbles)."""
    chunks = qs.reshape(-1, 4, 1, 32)
    low, high = _nibbles(chunks)
    return np.concatenate([low, high], axis=2).reshape(-1, QK_K)


def _unpack_q4_k(raw: np.ndarray) -> QuantizedTensor:
    blocks, rows = _blocks(raw, "Q4_K")
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    sc, m = _k_scale_min(blocks[:, 4:16])
    codes = _k_low_nibbles(blocks[:, 16:144])
    return _result(codes, d[:, None] * sc, -(dmin[:, None] * m), rows, bits=4, group=32)


def _unpack_q5_k(raw: np.ndarray) -> QuantizedTensor:
    blocks, rows = _blocks(raw, "Q5_K")
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    sc, m = _k_scale_min(blocks[:, 4:16])
    qh = blocks[:, 16:48]  # bit s of byte l: the fifth bit of value l of sub-block s
    shifts = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    high = ((qh[:, None, :] >> shifts) & np.uint8(1)).reshape(-1, QK_K)
    codes = (_k_low_nibbles(blocks[:, 48:176]) | (high << np.uint8(4))).view(np.int8)
    return _result(codes, d[:, None] * sc, -(dmin[:, None] * m), rows, bits=5, group=32)


def _unpack_q6_k(raw: np.ndarray) -> QuantizedTensor:
    """Per half (128 values): 64 bytes of low nibbles (values 0-63 low, 64-127 high) and
    32 bytes of 2-bit highs (bits 2k..2k+1 of byte l: value 32k + l)."""
    blocks, rows = _blocks(raw, "Q6_K")
    ql = blocks[:, 0:128].reshape(-1, 2, 1, 64)
    low = np.concatenate(_nibbles(ql), axis=2).reshape(-1, 2, 128)
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    high = ((qh >> shifts) & np.uint8(3)).reshape(-1, 2, 128)
    codes = ((low | (high << np.uint8(4))).astype(np.int16) - 32).astype(np.int8)
    sc = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)
    d = _f16(blocks[:, 208:210])
    return _result(codes, d[:, None] * sc, None, rows, bits=6, group=16)


def _two_bit(qs: np.ndarray) -> np.ndarray:
    """Q2_K/Q3_K low bits: 64 bytes -> 256 2-bit values; per half (32 bytes), value
    32 j + l is bits 2j..2j+1 of byte l."""
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    return ((qs.reshape(-1, 2, 1, 32) >> shifts) & np.uint8(3)).reshape(-1, QK_K)


def _unpack_q2_k(raw: np.ndarray) -> QuantizedTensor:
    """16 sub-blocks of 16, one byte each (scale: low nibble, min: high nibble)."""
    blocks, rows = _blocks(raw, "Q2_K")
    sc, m = _nibbles(blocks[:, 0:16])
    codes = _two_bit(blocks[:, 16:80])
    d, dmin = _f16(blocks[:, 80:82]), _f16(blocks[:, 82:84])
    scales = d[:, None] * sc.astype(np.float32)
    return _result(codes, scales, -(dmin[:, None] * m.astype(np.float32)), rows, bits=2, group=16)


def _q3_k_scales(packed: np.ndarray) -> np.ndarray:
    """The 16 signed 6-bit scales of a Q3_K super-block from its 12 bytes: the low 4 bits of
    scale i are byte i's low nibble (i < 8) or byte i - 8's high nibble, the top 2 bits are
    bits 2 (i // 4).. of byte 8 + i % 4; stored with an offset of 32."""
    low = np.concatenate(_nibbles(packed[:, 0:8]), axis=1)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)
    high = ((packed[:, None, 8:12] >> shifts) & np.uint8(3)).reshape(-1, 16)
    return (low | (high << np.uint8(4))).astype(np.float32) - 32


def _unpack_q3_k(raw: np.ndarray) -> QuantizedTensor:
    """hmask (32 bytes: bit b of byte l is the high bit of value 32 b + l; a clear bit
    subtracts 4), 2-bit lows, 12 bytes of scales, d."""
    blocks, rows = _blocks(raw, "Q3_K")
    bit = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    high = ((blocks[:, None, 0:32] >> bit) & np.uint8(1)).reshape(-1, QK_K)
    codes = _two_bit(blocks[:, 32:96]).astype(np.int8) - ((high ^ 1) << 2).astype(np.int8)
    scales = _f16(blocks[:, 108:110])[:, None] * _q3_k_scales(blocks[:, 96:108])
    return _result(codes, scales, None, rows, bits=3, group=16)


def _codebook(index: np.ndarray) -> np.ndarray:
    return np.array(IQ4_NL_VALUES, dtype=np.int8)[index]


def _unpack_iq4_nl(raw: np.ndarray) -> QuantizedTensor:
    """d, then 16 bytes of 4-bit codebook indices laid out as Q4_0's codes."""
    blocks, rows = _blocks(raw, "IQ4_NL")
    d = _f16(blocks[:, 0:2])
    codes = _codebook(np.concatenate(_nibbles(blocks[:, 2:18]), axis=1))
    return _result(codes, d, None, rows, bits=4, group=32)


def _unpack_iq4_xs(raw: np.ndarray) -> QuantizedTensor:
    """d, scales_h (uint16: bits 2i..2i+1 are the top of sub-block i's 6-bit scale),
    scales_l (4 bytes: nibble i % 2 of byte i // 2 is its low 4 bits), then per sub-block of
    32 16 bytes of codebook indices laid out as Q4_0's codes."""
    blocks, rows = _blocks(raw, "IQ4_XS")
    d = _f16(blocks[:, 0:2])
    top = np.ascontiguousarray(blocks[:, 2:4]).view("<u2")  # [blocks, 1]
    top = ((top >> np.arange(0, 16, 2, dtype=np.uint16)) & np.uint16(3)).astype(np.uint8)
    low = np.stack(_nibbles(blocks[:, 4:8]), axis=2).reshape(-1, 8)
    ls = (low | (top << np.uint8(4))).astype(np.float32) - 32
    index = np.concatenate(_nibbles(blocks[:, 8:136].reshape(-1, 8, 1, 16)), axis=2)
    codes = _codebook(index.reshape(-1, QK_K))
    return _result(codes, d[:, None] * ls, None, rows, bits=4, group=32)


_Unpacker = Callable[[np.ndarray], QuantizedTensor]
_UNPACKERS: dict[str, _Unpacker] = {
    "Q4_0": _unpack_q4_0,
    "Q4_1": _unpack_q4_1,
    "Q5_0": _unpack_q5_0,
    "Q5_1": _unpack_q5_1,
    "Q8_0": _unpack_q8_0,
    "Q4_K": _unpack_q4_k,
    "Q5_K": _unpack_q5_k,
    "Q6_K": _unpack_q6_k,
    "Q2_K": _unpack_q2_k,
    "Q3_K": _unpack_q3_k,
    "IQ4_NL": _unpack_iq4_nl,
    "IQ4_XS": _unpack_iq4_xs,
}
_TYPE_SIZES = {kind: GGML_QUANT_SIZES[GGMLQuantizationType[kind]][1] for kind in QUANT_KINDS}

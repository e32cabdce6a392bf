"""Reading a GGUF file's metadata and tensor directory in one pass.

The `gguf` package's `GGUFReader` builds a numpy view for every element of every array
field; for a tokenizer's 49,152 tokens and merges that takes seconds, twice per engine start
(tokenizer and weights). `GGUFFile` parses the same layout (GGUF v2/v3, little-endian) with
`struct` and takes numeric arrays whole with numpy; the type codes, block sizes and value
types are the `gguf` package's own definitions. Tensor data stays a read-only memory map.

    magic "GGUF" | version u32 | tensor count u64 | key-value count u64
    key-value pairs: key (u64 length + utf-8) | value type u32 | value
    tensor infos: name | n_dims u32 | dims u64 x n_dims (fastest first) | type u32 | offset u64
    padding to `general.alignment` (32) | tensor data (offsets relative to here)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

_SCALARS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}  # fmt: skip
# Tensor kinds whose data is typed elements; every other kind is blocks of bytes.
_ELEMENT_TYPES: dict[GGMLQuantizationType, type[np.generic]] = {
    GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}  # fmt: skip
DEFAULT_ALIGNMENT = 32
_LENGTH = struct.Struct("<Q")  # a string's byte count


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the directory: `shape` in GGUF order (fastest dimension first), `data`
    a read-only view of the file (elements in logical shape for plain kinds, else bytes
    [..., bytes per row])."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


class GGUFFile:
    """A GGUF file's `fields` (key -> Python value: str, int, float, bool or list) and
    `tensors` (in file order)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        self._buf = self._map.data
        self._pos = 0
        self.fields: dict[str, Any] = {}
        self.tensors: list[GGUFTensor] = []
        try:
            self._parse()
        except (struct.error, KeyError) as exc:  # KeyError: an unknown type code
            raise ValueError(
                f"{self.path.name}: truncated or corrupt GGUF header ({exc})"
            ) from None

    def _parse(self) -> None:
        if bytes(self._buf[:4]) != b"GGUF":
            raise ValueError(f"{self.path.name} is not a GGUF file (no GGUF magic)")
        self._pos = 4
        version, n_tensors, n_fields = self._unpack("<I"), self._unpack("<Q"), self._unpack("<Q")
        if version not in (2, 3):
            raise ValueError(f"{self.path.name}: GGUF version {version}; plait reads 2 and 3")
        for _ in range(n_fields):
            key = self._string()
            self.fields[key] = self._value(GGUFValueType(self._unpack("<I")))
        infos = [self._tensor_info() for _ in range(n_tensors)]
        align = int(self.fields.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-self._pos // align) * align
        self.tensors = [self._tensor(start, *info) for info in infos]

    def _unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        size = self._unpack("<Q")
        text = bytes(self._buf[self._pos : self._pos + size]).decode("utf-8", errors="replace")
        self._pos += size
        return text

    def _value(self, kind: GGUFValueType) -> Any:
        if kind == GGUFValueType.STRING:
            return self._string()
        if kind == GGUFValueType.ARRAY:
            return self._array(GGUFValueType(self._unpack("<I")), self._unpack("<Q"))
        return self._unpack(_SCALARS[kind])

    def _array(self, kind: GGUFValueType, count: int) -> list[Any]:
        if kind in _SCALARS and kind != GGUFValueType.BOOL:
            dtype = np.dtype(_SCALARS[kind])
            end = self._pos + count * dtype.itemsize
            values = np.frombuffer(self._buf[self._pos : end], dtype=dtype).tolist()
            self._pos = end
            return list(values)
        if kind == GGUFValueType.STRING:
            return self._strings(count)
        return [self._value(kind) for _ in range(count)]

    def _strings(self, count: int) -> list[str]:
        """`count` strings in a row (a vocabulary, its merges): `_string`'s reading, in one
        loop with no call per string but the decode (a 49,152-token vocabulary and its merges
        took 0.3 s a file through `_value`)."""
        buf, pos, out = self._buf, self._pos, []
        for _ in range(count):
            (size,) = _LENGTH.unpack_from(buf, pos)
            pos += 8
            out.append(bytes(buf[pos : pos + size]).decode("utf-8", errors="replace"))
            pos += size
        self._pos = pos
        return out

    def _tensor_info(self) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
        name = self._string()
        dims = tuple(self._unpack("<Q") for _ in range(self._unpack("<I")))
        return name, dims, GGMLQuantizationType(self._unpack("<I")), self._unpack("<Q")

    def _tensor(
        self, start: int, name: str, dims: tuple[int, ...], kind: GGMLQuantizationType, offset: int
    ) -> GGUFTensor:
        logical = tuple(reversed(dims))
        element = _ELEMENT_TYPES.get(kind)
        if element is not None:
            count, dtype, shape = int(np.prod(dims)), np.dtype(element), logical
        else:
            block, type_size = GGML_QUANT_SIZES[kind]
            count, dtype = int(np.prod(dims)) * type_size // block, np.dtype(np.uint8)
            shape = (*logical[:-1], logical[-1] // block * type_size)
        begin = start + offset
        end = begin + count * dtype.itemsize
        if end > len(self._map):
            raise ValueError(f"{self.path.name}: tensor {name!r} runs past the end of the file")
        data = self._map[begin:end].view(dtype).reshape(shape)
        return GGUFTensor(name, kind, dims, data)

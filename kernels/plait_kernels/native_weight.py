"""Quantized weights in the CPU kernels' native layout: :class:`NativeWeight`.

Where :class:`~plait.kernels.quant_weight.QuantWeight` widens every kind to 4- or 8-bit codes
with a float scale (and min) per group (the Triton kernel's layout), a ``NativeWeight`` keeps
each GGUF kind in its own packed form (``csrc/quant_pack_cpu.c`` lists them; the layout is
``csrc/qmm_tile.h``'s): 4-bit planes with the fifth and sixth bits beside them, 2-bit planes,
IQ4 codebook indices, and the K-quants' 6-bit sub-scales under fp16 super-block scales. A
weight therefore takes about its file's bytes, and the kernel reads no more than that.

A weight is one or more parts stacked along N (q, k, v or gate, up of different kinds), each
in its own form; the kernel quantizes x once for all of them. Every tensor is a CPU tensor the
C code reads in place.
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from ._native import load_native, pool_function
from .huge_pages import empty_huge

BLOCK_ROWS = 16
GROUP = 32  # values per group of x (one int8 scale) and per decoded group of codes
SUPER = 256  # values per K-quant super-block
P4, P8, P4H1, P4H2, P2, P2H1, IQ4 = range(7)  # code planes (plait_kernels.h QMM_P*)
SF16, SF32, SK = range(3)  # scale forms (QMM_S*)
GROUP_BYTES = {P4: 256, P8: 512, P4H1: 320, P4H2: 384, P2: 128, P2H1: 192, IQ4: 256}
SCALE_DTYPES = {SF16: torch.float16, SF32: torch.float32, SK: torch.int8}


@dataclass(frozen=True)
class Form:
    """How a kind is stored: code planes, scale form, the zero subtracted from every code,
    values per scale (16 or 32) and whether it has mins."""

    planes: int
    scale_form: int
    zero: int
    sub: int
    mins: bool


@dataclass(frozen=True, eq=False)
class NativePart:
    """Rows [n, k] of one kind (``kind``: a GGUF type name, or ``int8``/``int4`` for a float
    checkpoint quantized at load). ``codes`` [blocks, k / 32, group bytes] uint8; ``scales``
    and ``mins`` [blocks, k / sub, 16]; ``d`` and ``dmin`` (K forms) fp16 [blocks, k / 256, 16]."""

    kind: str
    form: Form
    n: int
    k: int
    codes: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None = None
    d: torch.Tensor | None = None
    dmin: torch.Tensor | None = None

    def __post_init__(self) -> None:
        f, blocks = self.form, -(-self.n // BLOCK_ROWS)
        want = {
            "codes": ((blocks, self.k // GROUP, GROUP_BYTES[f.planes]), torch.uint8),
            "scales": ((blocks, self.k // f.sub, BLOCK_ROWS), SCALE_DTYPES[f.scale_form]),
            "mins": ((blocks, self.k // f.sub, BLOCK_ROWS), SCALE_DTYPES[f.scale_form]),
            "d": ((blocks, self.k // SUPER, BLOCK_ROWS), torch.float16),
            "dmin": ((blocks, self.k // SUPER, BLOCK_ROWS), torch.float16),
        }
        needed = {"codes", "scales"} | ({"mins"} if f.mins else set())
        needed |= {"d"} | ({"dmin"} if f.mins else set()) if f.scale_form == SK else set()
        for name, (shape, dtype) in want.items():
            t = getattr(self, name)
            if (t is None) != (name not in needed):
                must = "given" if name in needed else "None"
                raise ValueError(f"bad NativePart {self.kind}: {name} must be {must}")
            if t is not None and (tuple(t.shape) != shape or t.dtype != dtype):
                raise ValueError(f"bad NativePart {self.kind}: {name} must be {dtype} {shape}")
            if t is not None and (not t.is_contiguous() or not t.is_cpu):
                raise ValueError(
                    f"bad NativePart {self.kind}: {name} must be a contiguous CPU tensor"
                )

    @property
    def arrays(self) -> tuple[torch.Tensor | None, ...]:
        """codes, scales, mins, d, dmin (absent ones None), as the C part lists them."""
        return (self.codes, self.scales, self.mins, self.d, self.dmin)

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [t for t in self.arrays if t is not None]

    def blocks(self, lo: int, hi: int) -> NativePart:
        """Row blocks [lo, hi) (rows 16 lo .. 16 hi, the last ones up to n)."""
        n = min(self.n, BLOCK_ROWS * hi) - BLOCK_ROWS * lo
        return self._cut(n, self.k, lambda t, per: t[lo:hi])

    def columns(self, a: int, b: int) -> NativePart:
        """Columns [a, b): on group boundaries (super-block ones for K forms)."""
        step = SUPER if self.form.scale_form == SK else GROUP
        if a % step or b % step:
            raise ValueError(
                f"{self.kind} weights are cut at multiples of {step} columns, not {a}:{b}"
            )
        return self._cut(self.n, b - a, lambda t, per: t[:, a // per : b // per])

    def _cut(self, n: int, k: int, cut: Callable[[torch.Tensor, int], torch.Tensor]) -> NativePart:
        """The part of n rows and k columns whose arrays are `cut(array, values per entry
        along k)`."""
        per = (GROUP, self.form.sub, self.form.sub, SUPER, SUPER)
        arrays = [
            None if t is None else cut(t, p).contiguous()
            for t, p in zip(self.arrays, per, strict=True)
        ]
        return _part(self.kind, self.form, n, k, arrays)


@dataclass(frozen=True, eq=False)
class NativeWeight:
    """A quantized [n, k] weight (``nn.Linear.weight``'s orientation) in the CPU kernels'
    native layout: ``parts`` stacked along n. Build one with :meth:`from_gguf`,
    :meth:`from_logical` or :meth:`stack`.

    ``x_bits``: what the kernel quantizes x to against this weight, 16 (two bytes a value,
    x / dx = hi + lo / 256: as close as int16, the default) or 8 (one byte, lo = 0: llama.cpp's
    Q8 activations, about 1.3x faster, x within dx / 2); :meth:`with_x_bits` makes the other."""

    n: int
    k: int
    parts: tuple[NativePart, ...]
    x_bits: int = 16

    def __post_init__(self) -> None:
        if not 1 <= len(self.parts) <= MAX_PARTS or sum(p.n for p in self.parts) != self.n:
            raise ValueError(f"a NativeWeight holds 1..{MAX_PARTS} parts adding up to n={self.n}")
        if self.x_bits not in X_BITS:
            raise ValueError(f"x_bits must be one of {X_BITS}, got {self.x_bits!r}")
        if any(p.k != self.k for p in self.parts) or self.k % GROUP:
            raise ValueError(f"every part must have k={self.k}, a multiple of {GROUP}")

    @classmethod
    def from_gguf(
        cls,
        kind: str,
        raw: np.ndarray,
        *,
        rows: torch.Tensor | None = None,
        threads: int | None = None,
    ) -> NativeWeight:
        """Rows of a GGUF tensor (`raw`: uint8 [rows, bytes per row], e.g. a view of the
        memory-mapped file) packed natively; `rows` picks and orders them (default: all)."""
        return cls.from_gguf_stack([GGUFRows(kind, raw, rows)], threads=threads)

    @classmethod
    def from_gguf_stack(
        cls, sources: Sequence[GGUFRows], *, threads: int | None = None
    ) -> NativeWeight:
        """GGUF tensors of one k stacked along n (q, k, v; gate, up), each packed once into
        its place: adjacent ones of one form whose rows fill whole blocks share a part.
        `threads` pack at once (default `torch.get_num_threads()`; a loader may use every
        core it has, whatever the kernels will run on)."""
        groups: list[list[_Source]] = []
        for src in (_Source.of(s) for s in sources):
            last = groups[-1][-1] if groups else None
            if last is not None and last.form == src.form and last.n % BLOCK_ROWS == 0:
                groups[-1].append(src)
            else:
                groups.append([src])
        n_threads = torch.get_num_threads() if threads is None else max(1, threads)
        parts = tuple(_pack_sources(group, n_threads) for group in groups)
        return cls(n=sum(p.n for p in parts), k=parts[0].k, parts=parts)

    @classmethod
    def from_logical(
        cls,
        *,
        codes: torch.Tensor,
        scales: torch.Tensor,
        mins: torch.Tensor | None,
        group: int,
        kind: str = "",
    ) -> NativeWeight:
        """value = scales * codes + mins per `group` values along k (the form
        `quantize_weight` and the GGUF reader's `QuantizedTensor` use): uint8 codes 0..15 go
        into 4-bit planes, int8 codes into 8-bit ones (stored + 128); scales and mins in fp16
        when that is exact, else fp32."""
        n, k = codes.shape
        if group not in (16, 32, 64, 128, 256) or k % max(group, GROUP):
            raise ValueError(
                f"group must be 16..256 and divide k={k} (and 32 divide k), got {group}"
            )
        four = codes.dtype == torch.uint8
        if four and codes.numel() and int(codes.max()) > 15:
            raise ValueError("uint8 codes are 4-bit and must lie in 0..15")
        unsigned = codes if four else (codes.to(torch.int16) + 128).to(torch.uint8)
        sub = 16 if group == 16 else 32
        repeat = max(group // sub, 1)
        scales = scales.float().repeat_interleave(repeat, dim=1)
        mins = None if mins is None else mins.float().repeat_interleave(repeat, dim=1)
        half = _fits_fp16(scales) and (mins is None or _fits_fp16(mins))
        form = Form(
            P4 if four else P8, SF16 if half else SF32, 0 if four else 128, sub, mins is not None
        )
        dtype = SCALE_DTYPES[form.scale_form]
        packed = empty_huge(
            (-(-n // BLOCK_ROWS), k // GROUP, GROUP_BYTES[form.planes]), dtype=torch.uint8
        )
        src = unsigned.contiguous()
        if _library().plait_pack_codes(
            src.data_ptr(), n, k, form.planes, form.zero, packed.data_ptr()
        ):
            raise ValueError(f"cannot pack codes of shape {tuple(codes.shape)}")
        part = NativePart(
            kind=kind or ("int4" if four else "int8"), form=form, n=n, k=k, codes=packed,
            scales=_per_block(scales.to(dtype)),
            mins=None if mins is None else _per_block(mins.to(dtype)),
        )  # fmt: skip
        return cls(n=n, k=k, parts=(part,))

    @classmethod
    def stack(cls, weights: Sequence[NativeWeight]) -> NativeWeight:
        """Weights of one k stacked along n (q, k, v; gate, up): adjacent parts of one form
        whose rows fill whole blocks are joined into one part."""
        bits = {w.x_bits for w in weights}
        if len(bits) != 1:
            raise ValueError(f"weights stacked must share their x_bits, got {sorted(bits)}")
        parts: list[NativePart] = []
        for p in (p for w in weights for p in w.parts):
            last = parts[-1] if parts else None
            if last is not None and last.form == p.form and last.n % BLOCK_ROWS == 0:
                parts[-1] = _joined(last, p)
            else:
                parts.append(p)
        return cls(n=sum(p.n for p in parts), k=weights[0].k, parts=tuple(parts), x_bits=bits.pop())

    def with_x_bits(self, bits: int) -> NativeWeight:
        """The same packed weight (its tensors shared) with x quantized to `bits` (8 or 16)."""
        return self if bits == self.x_bits else replace(self, x_bits=bits)

    @property
    def nbytes(self) -> int:
        """Resident bytes of the packed tensors."""
        return sum(t.numel() * t.element_size() for p in self.parts for t in p.tensors)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def column_step(self) -> int:
        """Columns can be cut at multiples of this (tensor parallelism)."""
        return SUPER if any(p.form.scale_form == SK for p in self.parts) else GROUP

    def dequantize_rows(
        self, rows: torch.Tensor, *, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """Rows `rows` (int64, in range) of the float weight: [len(rows), k]."""
        index = rows.to(torch.int64).contiguous()
        out = torch.empty(index.numel(), self.k, dtype=torch.float32)
        if _library().plait_dequant_rows(
            descriptor(self), index.data_ptr(), index.numel(), out.data_ptr()
        ):
            raise ValueError(f"rows must lie in [0, {self.n})")
        return out.to(dtype)

    def dequantize(self, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight [n, k] (the reference; the kernel never builds it)."""
        return self.dequantize_rows(torch.arange(self.n), dtype=dtype)

    def slice(
        self, *, rows: Sequence[tuple[int, int]] | None = None, cols: tuple[int, int] | None = None
    ) -> NativeWeight:
        """Rows `rows` (ranges on block boundaries, concatenated) and columns `cols`."""
        parts = list(self.parts)
        if cols is not None:
            parts = [p.columns(*cols) for p in parts]
        if rows is not None:
            parts = [piece for a, b in rows for piece in _row_range(parts, a, b)]
        return NativeWeight.stack(
            [NativeWeight(n=p.n, k=p.k, parts=(p,), x_bits=self.x_bits) for p in parts]
        )


MAX_PARTS = 4  # PLAIT_QMM_MAX_PARTS
X_BITS = (8, 16)  # plait_weight_t's x_bits


def _row_range(parts: list[NativePart], a: int, b: int) -> list[NativePart]:
    out, start = [], 0
    for p in parts:
        lo, hi = max(a, start), min(b, start + p.n)
        if lo < hi:
            if (lo - start) % BLOCK_ROWS or ((hi - start) % BLOCK_ROWS and hi - start != p.n):
                raise ValueError(
                    f"rows are cut at multiples of {BLOCK_ROWS} within a part, not {a}:{b}"
                )
            out.append(p.blocks((lo - start) // BLOCK_ROWS, -(-(hi - start) // BLOCK_ROWS)))
        start += p.n
    return out


@dataclass(frozen=True)
class GGUFRows:
    """Rows of a GGUF tensor as the file stores them: `raw` uint8 [rows, bytes per row] of
    kind `kind`, picked and ordered by `rows` (None: all, in order)."""

    kind: str
    raw: np.ndarray
    rows: torch.Tensor | None = None


@dataclass(frozen=True)
class _Source:
    """A GGUFRows checked: its form, k and the row index the packer reads."""

    kind: str
    form: Form
    raw: np.ndarray
    index: torch.Tensor | None
    n: int
    k: int

    @classmethod
    def of(cls, src: GGUFRows) -> _Source:
        form, values, nbytes = gguf_form(src.kind)
        raw = np.ascontiguousarray(src.raw, dtype=np.uint8)
        index = None if src.rows is None else src.rows.to(torch.int64).contiguous()
        n = raw.shape[0] if index is None else index.numel()
        if index is not None and n and (int(index.min()) < 0 or int(index.max()) >= raw.shape[0]):
            raise ValueError(f"rows must lie in [0, {raw.shape[0]})")
        return cls(src.kind, form, raw, index, n, raw.shape[1] // nbytes * values)


def _pack_sources(group: list[_Source], threads: int) -> NativePart:
    """One part holding every source of `group` (one form), each packed at its row blocks."""
    kinds = list(dict.fromkeys(src.kind for src in group))
    part = _empty_part("+".join(kinds), group[0].form, sum(src.n for src in group), group[0].k)
    block = 0
    for src in group:
        if src.k != part.k:
            raise ValueError(f"stacked tensors must have one k, got {src.k} and {part.k}")
        ptrs = [None if t is None else t[block].data_ptr() for t in part.arrays]
        status = _library().plait_pack_gguf(
            _kind_index(src.kind), src.raw.ctypes.data, src.raw.shape[1],
            None if src.index is None else src.index.data_ptr(), src.n, src.k, *ptrs,
            threads, pool_function(),
        )  # fmt: skip
        if status != 0:
            raise ValueError(f"cannot pack a {src.kind} tensor of {src.raw.shape[1]} bytes a row")
        block += src.n // BLOCK_ROWS
    return part


def _joined(a: NativePart, b: NativePart) -> NativePart:
    def cat(x: torch.Tensor | None, y: torch.Tensor | None) -> torch.Tensor | None:
        if x is None or y is None:
            return None
        shape = (x.shape[0] + y.shape[0], *x.shape[1:])
        return torch.cat([x, y], out=empty_huge(shape, dtype=x.dtype))

    kind = a.kind if a.kind == b.kind else f"{a.kind}+{b.kind}"
    arrays = [cat(x, y) for x, y in zip(a.arrays, b.arrays, strict=True)]
    return _part(kind, a.form, a.n + b.n, a.k, arrays)


def _part(kind: str, form: Form, n: int, k: int, arrays: list[torch.Tensor | None]) -> NativePart:
    """A part from its arrays in `NativePart.arrays` order (codes and scales always there)."""
    codes, scales, mins, d, dmin = arrays
    assert codes is not None and scales is not None
    return NativePart(kind, form, n, k, codes, scales, mins, d, dmin)


def _empty_part(kind: str, form: Form, n: int, k: int) -> NativePart:
    blocks = -(-n // BLOCK_ROWS)
    scales = (blocks, k // form.sub, BLOCK_ROWS)
    supers = (blocks, k // SUPER, BLOCK_ROWS)
    dtype = SCALE_DTYPES[form.scale_form]
    k_form = form.scale_form == SK
    return NativePart(
        kind=kind, form=form, n=n, k=k,
        codes=empty_huge((blocks, k // GROUP, GROUP_BYTES[form.planes]), dtype=torch.uint8),
        scales=empty_huge(scales, dtype=dtype),
        mins=empty_huge(scales, dtype=dtype) if form.mins else None,
        d=empty_huge(supers, dtype=torch.float16) if k_form else None,
        dmin=empty_huge(supers, dtype=torch.float16) if k_form and form.mins else None,
    )  # fmt: skip


def _per_block(t: torch.Tensor) -> torch.Tensor:
    """[n, G] -> [blocks, G, 16] (rows padded with zeros)."""
    extra = -t.shape[0] % BLOCK_ROWS
    if extra:
        t = torch.cat([t, t.new_zeros(extra, t.shape[1])])
    return t.view(-1, BLOCK_ROWS, t.shape[1]).transpose(1, 2).contiguous()


def _fits_fp16(t: torch.Tensor) -> bool:
    return bool(torch.equal(t.half().float(), t))


# --- the C side ------------------------------------------------------------------------------


class _Part(ctypes.Structure):
    """``plait_qpart_t`` (``csrc/plait_kernels.h``)."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("codes", "scales", "mins", "d", "dmin")]
    _fields_ += [(name, ctypes.c_int32) for name in ("planes", "scale_form", "zero", "sub")]
    _fields_ += [("n", ctypes.c_int64)]


class _Weight(ctypes.Structure):
    """``plait_weight_t``."""

    _fields_ = [(name, ctypes.c_int64) for name in ("n", "k", "nparts", "x_bits")]
    _fields_ += [("part", _Part * MAX_PARTS)]


# One descriptor per weight, built at its first use (the weight owns the tensors it points into).
_descriptors: weakref.WeakKeyDictionary[NativeWeight, _Weight] = weakref.WeakKeyDictionary()


def descriptor(w: NativeWeight) -> int:
    """Address of `w`'s ``plait_weight_t``, valid while `w` lives (built at its first use)."""
    desc = _descriptors.get(w)
    if desc is None:
        desc = _Weight(n=w.n, k=w.k, nparts=len(w.parts), x_bits=w.x_bits)
        for i, p in enumerate(w.parts):
            f = p.form
            ptrs = (None if t is None else t.data_ptr() for t in p.arrays)
            desc.part[i] = _Part(*ptrs, f.planes, f.scale_form, f.zero, f.sub, p.n)
        _descriptors[w] = desc
    return ctypes.addressof(desc)


_i64, _ptr, _int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "plait_pack_kind": ([ctypes.c_char_p, _ptr], _int),
    "plait_pack_gguf": ([_int, _ptr, _i64, _ptr, _i64, _i64, *[_ptr] * 5, _int, _ptr], _int),
    "plait_pack_codes": ([_ptr, _i64, _i64, _int, ctypes.c_uint8, _ptr], _int),
    "plait_dequant_rows": ([_ptr, _ptr, _i64, _ptr], _int),
}


@functools.cache
def _library() -> ctypes.CDLL:
    lib = load_native("quant_pack_cpu")
    if lib is None:
        raise RuntimeError("the native CPU weight packing needs a C compiler")
    for name, (args, result) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    return lib


def native_available() -> bool:
    """Whether weights can be packed natively here (a C compiler works)."""
    return load_native("quant_pack_cpu") is not None and load_native("quant_matmul_cpu") is not None


def gguf_form(kind: str) -> tuple[Form, int, int]:
    """The native form of GGUF kind `kind`, with its block's values and bytes; ValueError for
    a kind the packer does not take."""
    out = (ctypes.c_int32 * 7)()
    if _library().plait_pack_kind(kind.encode(), out) < 0:
        raise ValueError(f"no native form for GGUF type {kind}")
    planes, scale_form, zero, sub, mins, values, nbytes = list(out)
    return Form(planes, scale_form, zero, sub, bool(mins)), values, nbytes


def _kind_index(kind: str) -> int:
    return int(_library().plait_pack_kind(kind.encode(), (ctypes.c_int32 * 7)()))

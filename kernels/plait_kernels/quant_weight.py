"""Packed weight-only quantized weights: :class:`QuantWeight` and :func:`quantize_weight`.

A logical quantized weight W [N, K] (N output features, K input features, like
``nn.Linear.weight``) is ``codes`` [N, K] with ``scales`` (and optionally ``mins``) [N, K // group]:
``W[n, k] = scales[n, k // group] * codes[n, k] + mins[n, k // group]``. GGUF's Q4_0/Q4_1/Q8_0
and the K-quants arrive in that form from the GGUF reader; :func:`quantize_weight` makes it from a
float checkpoint (``--quantization int8|int4``).

The packed layout is the CPU kernel's (``csrc/quant_matmul_cpu.c`` documents it): rows in blocks
of 16 (N padded with zero rows), 4-bit codes two per byte and 8-bit codes as int8, interleaved so
that one 512-bit load holds a code pair of all 16 rows; scales and mins [blocks, K // group, 16].
Scales and mins are kept in fp16 when that is exact (GGUF's d and m are fp16, so Q4_0, Q4_1 and
Q8_0 cost exactly their file size), else in fp32 (K-quants' d * sc products).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

BLOCK_ROWS = 16
GROUPS = (16, 32, 64, 128, 256)


@dataclass(frozen=True, eq=False)
class QuantWeight:
    """A quantized [n, k] weight in the kernels' packed layout (see the module docstring).

    ``bits`` is the storage width: 4 (codes 0..15, two per byte) or 8 (int8 codes, which also
    hold 5- and 6-bit kinds). Build one with :meth:`pack` or :func:`quantize_weight`.
    """

    n: int
    k: int
    group: int
    bits: int
    codes: torch.Tensor  # uint8 [blocks, k // group, group * 16 * bits // 8]
    scales: torch.Tensor  # fp16 or fp32 [blocks, k // group, 16]
    mins: torch.Tensor | None  # like scales, or None (W = scales * codes)

    def __post_init__(self) -> None:
        """Every QuantWeight is consistent: the C kernel reads its tensors directly."""
        if self.bits not in (4, 8) or self.group not in GROUPS or self.n <= 0 or self.k <= 0:
            raise ValueError(f"bad QuantWeight: bits={self.bits} group={self.group} n={self.n}")
        if self.k % self.group:
            raise ValueError(f"bad QuantWeight: group {self.group} must divide k={self.k}")
        blocks, gc = -(-self.n // BLOCK_ROWS), self.k // self.group
        want = {
            "codes": ((blocks, gc, self.group * BLOCK_ROWS * self.bits // 8), (torch.uint8,)),
            "scales": ((blocks, gc, BLOCK_ROWS), (torch.float16, torch.float32)),
            "mins": ((blocks, gc, BLOCK_ROWS), (self.scales.dtype,)),
        }
        for name, (shape, dtypes) in want.items():
            t = getattr(self, name)
            if t is None and name == "mins":
                continue
            ok = isinstance(t, torch.Tensor) and tuple(t.shape) == shape and t.dtype in dtypes
            if not ok or not t.is_contiguous() or t.device != self.codes.device:
                raise ValueError(f"bad QuantWeight: {name} must be contiguous {dtypes} {shape}")

    @classmethod
    def pack(
        cls,
        *,
        codes: torch.Tensor,
        scales: torch.Tensor,
        mins: torch.Tensor | None = None,
        group: int,
    ) -> QuantWeight:
        """Pack a logical weight: ``codes`` [N, K] uint8 in 0..15 (4-bit kinds) or int8 (8-bit,
        and 5/6-bit kinds), ``scales`` and ``mins`` [N, K // group] float. Raises ValueError on
        a shape, dtype or range mismatch."""
        bits = _check_logical(codes, scales, mins, group)
        n, k = codes.shape
        half = _fits_fp16(scales) and (mins is None or _fits_fp16(mins))
        store = torch.float16 if half else torch.float32
        return cls(
            n=n,
            k=k,
            group=group,
            bits=bits,
            codes=_pack_codes(codes, group, bits),
            scales=_pack_groups(scales.to(store)),
            mins=None if mins is None else _pack_groups(mins.to(store)),
        )

    @property
    def blocks(self) -> int:
        """Row blocks of 16 (the last padded with zero rows)."""
        return self.codes.shape[0]

    @property
    def nbytes(self) -> int:
        """Resident bytes of the packed tensors."""
        parts = (self.codes, self.scales, self.mins)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def to(self, device: torch.device | str) -> QuantWeight:
        """The same weight with its tensors on ``device``."""
        mins = None if self.mins is None else self.mins.to(device)
        return replace(self, codes=self.codes.to(device), scales=self.scales.to(device), mins=mins)

    def unpack(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The logical ``(codes, scales, mins)`` again (scales and mins as fp32)."""
        codes = _unpack_codes(self.codes, self.group, self.bits)[: self.n]
        mins = None if self.mins is None else _unpack_groups(self.mins, self.n)
        return codes, _unpack_groups(self.scales, self.n), mins

    def dequantize(self, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight [n, k] (the reference; kernels never build it whole)."""
        return dequantize_rows(self, torch.arange(self.n, device=self.device), dtype=dtype)


def dequantize_rows(
    w: QuantWeight, rows: torch.Tensor, *, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Rows ``rows`` (int64 [T], in range) of the float weight: [T, k] in ``dtype``."""
    blk, r = rows // BLOCK_ROWS, rows % BLOCK_ROWS
    gc = w.k // w.group
    if w.bits == 8:
        view = w.codes.view(torch.int8).view(w.blocks, gc, w.group // 2, BLOCK_ROWS, 2)
        codes = view[blk, :, :, r, :].reshape(-1, gc, w.group)
    else:
        view = w.codes.view(w.blocks, gc, w.group // 8, BLOCK_ROWS, 2, 2)  # c, r, e, byte
        b = view[blk, :, :, r, :, :]  # [T, gc, c, e, byte]
        nib = torch.stack((b & 0xF, b >> 4), dim=-1)  # [T, gc, c, e, byte, nib], j = 2 byte + nib
        codes = nib.permute(0, 1, 2, 4, 5, 3).reshape(-1, gc, w.group)
    out = codes.to(dtype=torch.float32) * w.scales[blk, :, r].float().unsqueeze(-1)
    if w.mins is not None:
        out += w.mins[blk, :, r].float().unsqueeze(-1)
    return out.reshape(-1, w.k).to(dtype)


def quantize_weight(weight: torch.Tensor, *, bits: int, group: int = 32) -> QuantWeight:
    """Weight-only quantization of a float [N, K] weight per group of ``group`` along K.

    ``bits=8``: symmetric int8 (W = d * q, q in -127..127); ``bits=4``: asymmetric with a min
    (W = d * q + m, q in 0..15, m the group's minimum). d and m are rounded to fp16 first (and
    the codes computed from the rounded values) whenever fp16 holds them, so the weight stores
    them in fp16 like GGUF's Q8_0 / Q4_1.
    """
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    if weight.dim() != 2 or not weight.is_floating_point():
        got = f"{weight.dtype} {tuple(weight.shape)}"
        raise ValueError(f"weight must be a 2-D float tensor, got {got}")
    if group not in GROUPS or weight.shape[1] % group:
        k = weight.shape[1]
        raise ValueError(f"group must be one of {GROUPS} and divide K={k}, got {group}")
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // group, group)
    if bits == 8:
        d = _round_scale(w.abs().amax(-1) / 127)
        q = torch.round(w / _nonzero(d).unsqueeze(-1)).clamp(-127, 127)
        return QuantWeight.pack(codes=q.to(torch.int8).reshape(n, k), scales=d, group=group)
    lo, hi = w.amin(-1), w.amax(-1)
    m = _round_scale(lo)
    d = _round_scale((hi - m) / 15)
    q = torch.round((w - m.unsqueeze(-1)) / _nonzero(d).unsqueeze(-1)).clamp(0, 15)
    return QuantWeight.pack(codes=q.to(torch.uint8).reshape(n, k), scales=d, mins=m, group=group)


def _round_scale(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded to fp16 when every value survives (finite, nonzero stays nonzero), else
    ``t`` itself (the weight then keeps fp32 scales)."""
    h = t.half()
    if not torch.isfinite(h).all() or ((h == 0) & (t != 0)).any():
        return t
    return h.float()


def _nonzero(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.ones_like(d), d)


def _fits_fp16(t: torch.Tensor) -> bool:
    return bool(torch.equal(t.float().half().float(), t.float()))


def _check_logical(
    codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None, group: int
) -> int:
    """The storage bits for ``codes``; ValueError on anything the packer cannot take."""
    if not isinstance(codes, torch.Tensor) or codes.dim() != 2:
        raise ValueError("codes must be a 2-D tensor [N, K]")
    if codes.dtype not in (torch.uint8, torch.int8):
        raise ValueError(f"codes must be uint8 (4-bit) or int8 (8-bit), got {codes.dtype}")
    n, k = codes.shape
    if group not in GROUPS or k % group or n == 0:
        raise ValueError(f"group must be one of {GROUPS} dividing K={k} (N={n} > 0), got {group}")
    want = (n, k // group)
    for name, t in (("scales", scales), ("mins", mins)):
        if t is None and name == "mins":
            continue
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or tuple(t.shape) != want:
            raise ValueError(f"{name} must be a float tensor of shape {list(want)}")
        if t.device != codes.device:
            raise ValueError(f"{name} must be on {codes.device}, got {t.device}")
    if codes.dtype == torch.uint8:
        if codes.numel() and int(codes.max()) > 15:
            raise ValueError("uint8 codes are 4-bit and must lie in 0..15")
        return 4
    return 8


def _pad_rows(t: torch.Tensor) -> torch.Tensor:
    extra = -t.shape[0] % BLOCK_ROWS
    if extra == 0:
        return t
    return torch.cat([t, t.new_zeros(extra, *t.shape[1:])])


def _pack_groups(t: torch.Tensor) -> torch.Tensor:
    """[N, G] -> [blocks, G, 16]."""
    t = _pad_rows(t)
    return t.view(-1, BLOCK_ROWS, t.shape[1]).transpose(1, 2).contiguous()


def _unpack_groups(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.transpose(1, 2).reshape(-1, t.shape[1])[:n].float()


def _pack_codes(codes: torch.Tensor, group: int, bits: int) -> torch.Tensor:
    c = _pad_rows(codes)
    blocks, gc = c.shape[0] // BLOCK_ROWS, c.shape[1] // group
    if bits == 8:  # [b, r, g, p, e] -> [b, g, p, r, e]
        v = c.view(torch.uint8).view(blocks, BLOCK_ROWS, gc, group // 2, 2)
        return v.permute(0, 2, 3, 1, 4).reshape(blocks, gc, -1).contiguous()
    # k = g * group + 8 c + 2 j + e with j = 2 byte + nibble: [b, r, g, c, byte, nib, e]
    v = c.view(blocks, BLOCK_ROWS, gc, group // 8, 2, 2, 2)
    v = v.permute(0, 2, 3, 1, 6, 4, 5)  # [b, g, c, r, e, byte, nib]
    packed = v[..., 0] | (v[..., 1] << 4)
    return packed.reshape(blocks, gc, -1).contiguous()


def _unpack_codes(packed: torch.Tensor, group: int, bits: int) -> torch.Tensor:
    blocks, gc = packed.shape[:2]
    if bits == 8:
        v = packed.view(torch.int8).view(blocks, gc, group // 2, BLOCK_ROWS, 2)
        return v.permute(0, 3, 1, 2, 4).reshape(blocks * BLOCK_ROWS, gc * group)
    v = packed.view(blocks, gc, group // 8, BLOCK_ROWS, 2, 2)  # [b, g, c, r, e, byte]
    nib = torch.stack((v & 0xF, v >> 4), dim=-1)  # [b, g, c, r, e, byte, nib]
    return nib.permute(0, 3, 1, 2, 5, 6, 4).reshape(blocks * BLOCK_ROWS, gc * group)

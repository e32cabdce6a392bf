"""Weight-only quantized layers: linear layers and embeddings whose weights stay packed.

A GGUF file's quantized matrices are kept as they are (`QuantLinear`, `QuantEmbedding` over a
packed weight; the matmul dequantizes nothing), and a float checkpoint can be quantized at
load (`--quantization int8|int4`: symmetric int8 or int4 with a min, per group of 32 along the
input dimension). On the CPU the weight is a `plait.kernels.native_weight.NativeWeight` (each
GGUF kind in its own packed form, read by the C kernel); elsewhere (CUDA, or a CPU without a C
compiler) a `plait.kernels.quant_weight.QuantWeight` (the Triton kernel's layout). A tied LM
head shares the embedding's packed weight. The model code does not change: a quantized module
replaces an `nn.Linear` or `nn.Embedding` with the same call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from plait.kernels.native_weight import NativeWeight, native_available
from plait.kernels.quant import quant_embedding, quant_linear
from plait.kernels.quant_weight import QuantWeight, quantize_weight

QUANT_GROUP = 32  # `--quantization`: values per scale along the input dimension
Packed = QuantWeight | NativeWeight


def packs_natively(device: torch.device) -> bool:
    """Whether weights on `device` are packed in the CPU kernels' native layout."""
    return device.type == "cpu" and native_available()


class QuantLinear(nn.Module):
    """`y = x @ W^T + bias` with W a packed weight [out, in]; `bias` a float parameter
    (filled by the loader like any other)."""

    def __init__(self, weight: Packed, *, bias: bool = False) -> None:
        super().__init__()
        self.qweight = weight
        self.in_features, self.out_features = weight.k, weight.n
        if bias:
            self.bias = nn.Parameter(torch.empty(weight.n), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quant_linear(x, self.qweight, bias=self.bias)


class QuantEmbedding(nn.Module):
    """Rows of a packed weight [vocab, hidden], de-quantized on lookup."""

    def __init__(self, weight: Packed, *, dtype: torch.dtype) -> None:
        super().__init__()
        self.qweight = weight
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return quant_embedding(ids, self.qweight, dtype=self.dtype)


@dataclass(frozen=True)
class LogicalQuant:
    """A quantized [N, K] matrix before packing: value = scales * codes + mins per group
    (`codes` uint8 0..15 for 4-bit kinds, int8 otherwise; what the GGUF reader gives)."""

    codes: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None
    group: int


def pack_merged(parts: Sequence[LogicalQuant]) -> QuantWeight:
    """One packed weight from row blocks stacked along N (q, k, v; gate, up). Parts of
    different kinds are widened, exactly, to a common one: int8 codes (4-bit codes fit),
    the smallest group (scales repeated), zero mins where a part has none."""
    if len({(p.codes.dtype, p.group, p.mins is None) for p in parts}) == 1:
        mins = [p.mins for p in parts]
        return QuantWeight.pack(
            codes=torch.cat([p.codes for p in parts]),
            scales=torch.cat([p.scales for p in parts]),
            mins=None if mins[0] is None else torch.cat([m for m in mins if m is not None]),
            group=parts[0].group,
        )
    group = min(p.group for p in parts)
    widened = [_widen(p, group) for p in parts]
    return QuantWeight.pack(
        codes=torch.cat([w.codes for w in widened]),
        scales=torch.cat([w.scales for w in widened]),
        mins=torch.cat([w.mins for w in widened if w.mins is not None]),
        group=group,
    )


def _widen(part: LogicalQuant, group: int) -> LogicalQuant:
    repeat = part.group // group
    scales = part.scales.repeat_interleave(repeat, dim=1)
    mins = torch.zeros_like(scales) if part.mins is None else part.mins.repeat_interleave(repeat, 1)
    return LogicalQuant(part.codes.to(torch.int8), scales, mins, group)


def set_activation_bits(model: nn.Module, bits: int) -> None:
    """x quantized to `bits` (16 or 8) in the C kernel's matmul of every linear layer whose
    weight is packed natively (`NativeWeight.with_x_bits`; the packed tensors are shared). An
    embedding tied to the LM head gets the head's new weight, so they stay one object. Other
    weights (CUDA's, float ones) keep x unquantized or in fp32 whatever `bits` says."""
    made: dict[int, NativeWeight] = {}
    for module in model.modules():
        w = getattr(module, "qweight", None)
        if isinstance(module, QuantLinear | QuantEmbedding) and isinstance(w, NativeWeight):
            module.qweight = made.setdefault(id(w), w.with_x_bits(bits))


def quantize_model(model: nn.Module, *, bits: int) -> None:
    """Replace the model's float linear layers (and its embedding, when the LM head is tied
    to it: both then share one packed weight) by quantized ones of `bits` (8: symmetric per
    group of 32; 4: with a min per group). Layers already quantized stay as they are, and so
    do the routers of mixture-of-experts layers."""
    embed, head = model.get_submodule("embed_tokens"), model.get_submodule("lm_head")
    tied = isinstance(embed, nn.Embedding) and isinstance(head, nn.Linear)
    tied = tied and head.weight is embed.weight
    for name, child in list(model.named_modules()):
        router = name.endswith(".mlp.gate")  # an MoE router's scores pick experts: kept exact
        if isinstance(child, nn.Linear) and not router and not (tied and name == "lm_head"):
            model.set_submodule(name, _quantized(child, bits))
    if tied:
        assert isinstance(embed, nn.Embedding)
        packed = _quantize(embed.weight, bits)
        model.set_submodule("embed_tokens", QuantEmbedding(packed, dtype=embed.weight.dtype))
        model.set_submodule("lm_head", QuantLinear(packed))


def _quantize(weight: torch.Tensor, bits: int) -> Packed:
    packed = quantize_weight(weight.detach().float(), bits=bits, group=QUANT_GROUP)
    if not packs_natively(weight.device):
        return packed
    codes, scales, mins = packed.unpack()
    return NativeWeight.from_logical(codes=codes, scales=scales, mins=mins, group=QUANT_GROUP)


def _quantized(layer: nn.Linear, bits: int) -> QuantLinear:
    packed = _quantize(layer.weight, bits)
    out = QuantLinear(packed, bias=layer.bias is not None)
    if layer.bias is not None:
        out.bias = nn.Parameter(layer.bias.detach().clone(), requires_grad=False)
    return out


def weight_bytes(model: nn.Module) -> int:
    """Bytes the model's weights take in memory: packed weights, parameters and buffers
    (a tensor shared by two modules counted once)."""
    seen: set[int] = set()
    total = 0
    tensors: list[torch.Tensor] = [*model.parameters(), *model.buffers()]
    for module in model.modules():
        packed = getattr(module, "qweight", None)
        if isinstance(packed, QuantWeight):
            tensors += [t for t in (packed.codes, packed.scales, packed.mins) if t is not None]
        elif isinstance(packed, NativeWeight):
            tensors += [t for part in packed.parts for t in part.tensors]
    for t in tensors:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total

"""GGUF tensor names -> plait's parameters, and the model loaded from a GGUF file.

llama.cpp names tensors `blk.{i}.attn_q.weight`, `token_embd.weight`, ...; plait's model uses
Hugging Face names with merged `qkv_proj` and `gate_up_proj`. For the llama architecture
llama.cpp's converter permuted the rows of attn_q and attn_k (per head, interleaving the two
rotary halves for its rope kernel); `hf_row_order` undoes it so RoPE sees the HF layout.
Quantized matrices of linear layers and the embedding stay packed (`plait.backend.quantized`);
every other weight, or every weight with `keep_quantized=False`, is de-quantized at load to
the engine's dtype.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from plait.backend.gguf.metadata import ARCHITECTURES, GGUFMetadata, gguf_model_config
from plait.backend.gguf.quants import QuantizedTensor, read_tensor
from plait.backend.gguf.reader import GGUFFile, GGUFTensor
from plait.backend.model import LlamaForCausalLM, empty_model
from plait.backend.model_config import ModelConfig
from plait.backend.quantized import LogicalQuant, QuantEmbedding, QuantLinear, pack_merged

_GLOBAL_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}
# per-layer GGUF name -> (plait name, shard index in a merged weight or None)
_LAYER_NAMES: dict[str, tuple[str, int | None]] = {
    "attn_norm.weight": ("input_layernorm.weight", None),
    "ffn_norm.weight": ("post_attention_layernorm.weight", None),
    "attn_q.weight": ("self_attn.qkv_proj.weight", 0),
    "attn_k.weight": ("self_attn.qkv_proj.weight", 1),
    "attn_v.weight": ("self_attn.qkv_proj.weight", 2),
    "attn_q.bias": ("self_attn.qkv_proj.bias", 0),
    "attn_k.bias": ("self_attn.qkv_proj.bias", 1),
    "attn_v.bias": ("self_attn.qkv_proj.bias", 2),
    "attn_output.weight": ("self_attn.o_proj.weight", None),
    "ffn_gate.weight": ("mlp.gate_up_proj.weight", 0),
    "ffn_up.weight": ("mlp.gate_up_proj.weight", 1),
    "ffn_down.weight": ("mlp.down_proj.weight", None),
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")
_IGNORED = ("rope_freqs.weight",)  # refused earlier by the config if present
_LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@dataclass(frozen=True)
class Target:
    """Where one GGUF tensor goes: a parameter, and its shard within a merged one."""

    param: str
    shard: int | None

    @property
    def key(self) -> str:
        return self.param if self.shard is None else f"{self.param}#{self.shard}"


def map_name(name: str) -> Target:
    """The plait parameter (and shard) for GGUF tensor `name`; ValueError for unknown ones."""
    if name in _GLOBAL_NAMES:
        return Target(_GLOBAL_NAMES[name], None)
    match = _LAYER_RE.fullmatch(name)
    if match and match.group(2) in _LAYER_NAMES:
        param, shard = _LAYER_NAMES[match.group(2)]
        return Target(f"layers.{match.group(1)}.{param}", shard)
    raise ValueError(f"unexpected tensor {name!r} in GGUF file")


def hf_row_order(rows: int, num_heads: int) -> torch.Tensor:
    """Row index that turns llama.cpp's permuted attn_q/attn_k rows back into HF order.

    The converter stored HF rows grouped per head as [2, head_dim / 2] transposed to
    [head_dim / 2, 2]; GGUF row j holds HF row `stored[j]`, so HF row i is GGUF row
    `argsort(stored)[i]`.
    """
    half = rows // num_heads // 2
    stored = torch.arange(rows).reshape(num_heads, 2, half).transpose(1, 2).reshape(-1)
    return torch.argsort(stored)


def load_gguf_model(
    path: str | Path, *, dtype: torch.dtype, device: torch.device, keep_quantized: bool = True
) -> LlamaForCausalLM:
    """Build plait's model from a GGUF file. With `keep_quantized`, the quantized matrices
    of linear layers and the embedding stay packed (`QuantLinear`/`QuantEmbedding`: q, k, v
    and gate, up each merged into one); every other weight is de-quantized to `dtype`."""
    path = Path(path)
    reader = GGUFFile(path)
    meta = GGUFMetadata.from_file(reader)
    cfg = gguf_model_config(meta)
    permuted = ARCHITECTURES[meta.architecture][1]
    shards: dict[str, dict[int | None, torch.Tensor | QuantizedTensor]] = {}
    for tensor in reader.tensors:
        if tensor.name not in _IGNORED:
            target = map_name(tensor.name)
            shards.setdefault(target.param, {})[target.shard] = _oriented(
                tensor, cfg, target, permuted=permuted
            )
    packed = _packed(cfg, shards, dtype=dtype, device=device) if keep_quantized else {}
    model = empty_model(cfg, dtype=dtype, device=device, modules=packed)
    embed = packed.get("embed_tokens")
    if cfg.tie_word_embeddings and isinstance(embed, QuantEmbedding):
        model.lm_head = QuantLinear(embed.qweight)
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for param, parts in shards.items():
        module = param.rsplit(".", 1)[0]
        if module in packed and param.endswith(".weight"):
            continue
        for shard, value in parts.items():
            target = Target(param, shard)
            _copy(params, cfg, target, _dense(value), param)
            loaded.add(target.key)
    _check_complete(cfg, params, loaded, path)
    return model.eval()


def _oriented(
    tensor: GGUFTensor, cfg: ModelConfig, target: Target, *, permuted: bool
) -> torch.Tensor | QuantizedTensor:
    """The tensor as read (float, or unpacked quantized blocks), attn_q/attn_k rows in HF
    order."""
    value: torch.Tensor | QuantizedTensor = read_tensor(tensor)
    heads = _rope_heads(cfg, target) if permuted else None
    if heads is not None:
        order = hf_row_order(value.shape[0], heads)
        value = value.take_rows(order) if isinstance(value, QuantizedTensor) else value[order]
    return value


def _dense(value: torch.Tensor | QuantizedTensor) -> torch.Tensor:
    return value.dequantize() if isinstance(value, QuantizedTensor) else value


def _packed(
    cfg: ModelConfig,
    shards: dict[str, dict[int | None, torch.Tensor | QuantizedTensor]],
    *,
    dtype: torch.dtype,
    device: torch.device,
) -> dict[str, nn.Module]:
    """Quantized modules by name for every linear weight (and the embedding) whose shards
    are all quantized; the rest is loaded dense."""
    modules: dict[str, nn.Module] = {}
    for param, parts in shards.items():
        name = param.removesuffix(".weight")
        quant = [parts[k] for k in sorted(parts, key=lambda s: -1 if s is None else s)]
        if not param.endswith(".weight") or not all(isinstance(q, QuantizedTensor) for q in quant):
            continue
        weight = pack_merged([_logical(q) for q in quant if isinstance(q, QuantizedTensor)])
        weight = weight.to(device)
        if name == "embed_tokens":
            modules[name] = QuantEmbedding(weight, dtype=dtype)
        elif name == "lm_head" or name.rsplit(".", 1)[-1] in _LINEARS:
            modules[name] = QuantLinear(weight, bias=f"{name}.bias" in shards)
    return modules


def _logical(q: QuantizedTensor) -> LogicalQuant:
    return LogicalQuant(codes=q.codes, scales=q.scales, mins=q.mins, group=q.group)


def _rope_heads(cfg: ModelConfig, target: Target) -> int | None:
    """Heads of a q (0) or k (1) shard of qkv_proj, the ones RoPE rotates; else None."""
    if ".qkv_proj." not in target.param or target.shard not in (0, 1):
        return None
    return cfg.num_heads if target.shard == 0 else cfg.num_kv_heads


def _copy(
    params: dict[str, torch.nn.Parameter],
    cfg: ModelConfig,
    target: Target,
    value: torch.Tensor,
    name: str,
) -> None:
    if target.param not in params:
        raise ValueError(f"GGUF tensor {name!r} has no place in the {cfg.architecture} model")
    dest = params[target.param].data
    if target.shard is not None:
        sizes = _shard_sizes(cfg, target.param)
        start = sum(sizes[: target.shard])
        dest = dest[start : start + sizes[target.shard]]
    if tuple(dest.shape) != tuple(value.shape):
        raise ValueError(
            f"GGUF tensor {name!r} has shape {tuple(value.shape)}, "
            f"expected {tuple(dest.shape)} for {target.key}"
        )
    dest.copy_(value)


def _shard_sizes(cfg: ModelConfig, param: str) -> list[int]:
    if ".qkv_proj." in param:
        return [cfg.q_size, cfg.kv_size, cfg.kv_size]
    return [cfg.intermediate_size, cfg.intermediate_size]


def _check_complete(
    cfg: ModelConfig, params: dict[str, torch.nn.Parameter], loaded: set[str], path: Path
) -> None:
    expected = set()
    for name in params:
        shards = 3 if ".qkv_proj." in name else 2 if ".gate_up_proj." in name else 0
        expected.update([f"{name}#{i}" for i in range(shards)] if shards else [name])
    if cfg.tie_word_embeddings:
        expected.discard("lm_head.weight")
    missing = sorted(expected - loaded)
    if missing:
        raise ValueError(f"GGUF file {path.name} lacks weights for {missing[:5]}")

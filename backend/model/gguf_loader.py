"""The model loaded from a GGUF file.

llama.cpp names tensors `blk.{i}.attn_q.weight`, `token_embd.weight`, ...; `gguf_target`
turns each name into the Hugging Face-style name plait's parameters use and then into its
target through the same mapping the safetensors loader uses (weights.py: q, k, v and gate, up
are parts of merged weights). The per-layer names below hold for every family; a family adds
or overrides some (`Family.gguf_layer_names`: which norm `ffn_norm` is differs by family). For
the llama architecture llama.cpp's converter permuted the rows of attn_q and attn_k (per head,
interleaving the two rotary halves for its rope kernel); `hf_row_order` undoes it so RoPE sees
the HF layout. Quantized matrices of linear layers and the embedding stay packed
(`plait.backend.model.quantized`); every other weight, or every weight with
`keep_quantized=False`, is de-quantized at load to the engine's dtype.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from plait.backend.gguf.metadata import GGUFMetadata
from plait.backend.gguf.quants import QuantizedBlocks, QuantizedTensor, read_blocks
from plait.backend.gguf.reader import GGUFFile, GGUFTensor
from plait.backend.host import default_threads
from plait.backend.model.config import ModelConfig
from plait.backend.model.family import Family
from plait.backend.model.layers import CausalLM, empty_model
from plait.backend.model.quantized import (
    LogicalQuant,
    Packed,
    QuantEmbedding,
    QuantLinear,
    pack_merged,
    packs_natively,
)
from plait.backend.model.registry import gguf_family
from plait.backend.model.rotary import row_order
from plait.backend.model.weights import LINEARS, Target, check_complete, copy_into, hf_target
from plait.kernels.native_weight import GGUFRows, NativeWeight

GLOBAL_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}
# per-layer GGUF name -> plait's (Hugging Face-style) name in the layer
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",  # Llama's norm before the MLP
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")
# read into the config's RoPE (families/common.py, families/phi3.py)
_IGNORED = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
Value = torch.Tensor | QuantizedBlocks
Parts = dict[str, dict[int | None, Value]]


def gguf_target(name: str, family: Family) -> Target:
    """The plait parameter (and part) for GGUF tensor `name`; ValueError for unknown ones."""
    if name in GLOBAL_NAMES:
        return Target(GLOBAL_NAMES[name])
    match = _LAYER_RE.fullmatch(name)
    local = None if match is None else match.group(2)
    ours = family.gguf_layer_names.get(local or "") or LAYER_NAMES.get(local or "")
    target = None if match is None or ours is None else hf_target(f"layers.{match[1]}.{ours}")
    if target is None:
        raise ValueError(f"unexpected tensor {name!r} in a GGUF file of the {family.name} family")
    return target


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
) -> CausalLM:
    """Build plait's model from a GGUF file. With `keep_quantized`, the quantized matrices
    of linear layers and the embedding stay packed (`QuantLinear`/`QuantEmbedding`: q, k, v
    and gate, up each merged into one); every other weight is de-quantized to `dtype`."""
    path = Path(path)
    reader = GGUFFile(path)
    family = gguf_family(GGUFMetadata.from_file(reader).architecture, file=path.name)
    cfg = family.from_gguf(reader)
    parts: Parts = {}
    for tensor in reader.tensors:
        if tensor.name not in _IGNORED:
            target = gguf_target(tensor.name, family)
            parts.setdefault(target.param, {})[target.shard] = _oriented(
                tensor, cfg, target, family
            )
    packed = _packed(parts, dtype=dtype, device=device) if keep_quantized else {}
    model = empty_model(cfg, dtype=dtype, device=device, modules=packed)
    embed = packed.get("embed_tokens")
    if cfg.tie_word_embeddings and isinstance(embed, QuantEmbedding):
        model.lm_head = QuantLinear(embed.qweight)
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for param, values in parts.items():
        if param.removesuffix(".weight") in packed and param.endswith(".weight"):
            continue
        for shard, value in values.items():
            target = Target(param, shard)
            copy_into(params, cfg, target, _dense(value), source=f"{path.name}: {param}")
            loaded.update(target.keys)
    check_complete(params, cfg, loaded, f"GGUF file {path.name}")  # packed ones hold no Parameter
    return model.eval()


def _oriented(tensor: GGUFTensor, cfg: ModelConfig, target: Target, family: Family) -> Value:
    """The tensor as read (float, or its quantized blocks still packed), attn_q/attn_k rows
    in HF order, then reordered for a partial rotation."""
    value: Value = read_blocks(tensor)
    heads = _rope_heads(cfg, target) if family.gguf_permuted_qk else None
    if heads is not None:
        value = _take(value, hf_row_order(value.shape[0], heads))
    order = row_order(cfg, target, value.shape[0])
    return value if order is None else _take(value, order)


def _take(value: Value, rows: torch.Tensor) -> Value:
    return value.take_rows(rows) if isinstance(value, QuantizedBlocks) else value[rows]


def _dense(value: Value) -> torch.Tensor:
    return value.dequantize() if isinstance(value, QuantizedBlocks) else value


def _packed(parts: Parts, *, dtype: torch.dtype, device: torch.device) -> dict[str, nn.Module]:
    """Quantized modules by name for every linear weight (and the embedding) whose parts
    are all quantized; the rest is loaded dense."""
    modules: dict[str, nn.Module] = {}
    threads = _packing_threads()
    for param, values in parts.items():
        name = param.removesuffix(".weight")
        quant = [values[k] for k in sorted(values, key=lambda s: -1 if s is None else s)]
        blocks = [q for q in quant if isinstance(q, QuantizedBlocks)]
        if not param.endswith(".weight") or len(blocks) != len(quant):
            continue
        weight = _pack(blocks, device, threads=threads)
        if name == "embed_tokens":
            modules[name] = QuantEmbedding(weight, dtype=dtype)
        elif name == "lm_head" or name.rsplit(".", 1)[-1] in LINEARS:
            modules[name] = QuantLinear(weight, bias=f"{name}.bias" in parts)
    return modules


def _packing_threads() -> int:
    """Threads to pack with: at one serving thread, every core this process may use (the
    kernels' pool runs one thread inline, so the extra workers sleep for good afterwards);
    else the serving count (a pool grown past it would wake its unused workers on every
    matmul)."""
    serving = torch.get_num_threads()
    return default_threads() if serving == 1 else serving


def _pack(blocks: list[QuantizedBlocks], device: torch.device, *, threads: int) -> Packed:
    """One packed weight from a parameter's parts (q, k, v; gate, up): each GGUF kind in its
    own native form on the CPU, else unpacked and widened to a common `QuantWeight`."""
    if packs_natively(device):
        rows = [GGUFRows(b.kind, b.raw, b.rows) for b in blocks]
        return NativeWeight.from_gguf_stack(rows, threads=threads)
    return pack_merged([_logical(b.unpack()) for b in blocks]).to(device)


def _logical(q: QuantizedTensor) -> LogicalQuant:
    return LogicalQuant(codes=q.codes, scales=q.scales, mins=q.mins, group=q.group)


def _rope_heads(cfg: ModelConfig, target: Target) -> int | None:
    """Heads of a q (0) or k (1) part of qkv_proj, the ones RoPE rotates; else None."""
    if target.merged != "qkv_proj" or target.shard not in (0, 1):
        return None
    return cfg.num_heads if target.shard == 0 else cfg.num_kv_heads

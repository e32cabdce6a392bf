"""Cutting a loaded model down to one tensor-parallel rank's slice.

Every loader (safetensors, GGUF, `--quantization int8/int4`) builds the whole model; each
rank then keeps only its slices (`shard_model`), and the rest is freed. Column-parallel
layers (qkv, gate_up) keep some output rows; row-parallel layers (o, down) keep some input
columns, cut at quantization-group boundaries, and all-reduce their output; the embedding
and the LM head keep some vocabulary rows. Packed weights are cut through their logical
form (`QuantWeight.unpack` then `pack`), which is exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from plait.backend.model.config import ModelConfig
from plait.backend.model.layers import MLP, Attention, CausalLM, DecoderLayer
from plait.backend.model.quantized import Packed, QuantEmbedding, QuantLinear
from plait.backend.model.registry import family_named
from plait.backend.model.weights import merged_rows
from plait.backend.parallel.comm import TPComm
from plait.backend.parallel.layers import RowParallel, VocabParallelEmbedding, VocabParallelHead
from plait.backend.parallel.plan import ShardPlan
from plait.kernels.native_weight import NativeWeight
from plait.kernels.quant_weight import QuantWeight

Ranges = Sequence[tuple[int, int]]


def slice_quant(
    w: Packed, *, rows: Ranges | None = None, cols: tuple[int, int] | None = None
) -> Packed:
    """The rows `rows` (concatenated) and columns `cols` of a packed weight; `cols` must
    fall on group boundaries (a native weight's: `NativeWeight.slice`)."""
    if isinstance(w, NativeWeight):
        return w.slice(rows=rows, cols=cols)
    codes, scales, mins = w.unpack()
    if cols is not None:
        a, b = cols
        if a % w.group or (b % w.group and b != w.k):
            raise ValueError(f"columns {cols} do not fall on groups of {w.group}")
        g = slice(a // w.group, -(-b // w.group))
        codes, scales = codes[:, a:b], scales[:, g]
        mins = None if mins is None else mins[:, g]
    if rows is not None:
        codes, scales = _rows(codes, rows), _rows(scales, rows)
        mins = None if mins is None else _rows(mins, rows)
    return QuantWeight.pack(
        codes=codes.contiguous(),
        scales=scales.contiguous(),
        mins=None if mins is None else mins.contiguous(),
        group=w.group,
    )


def slice_dense(
    w: torch.Tensor, *, rows: Ranges | None = None, cols: tuple[int, int] | None = None
) -> torch.Tensor:
    """The rows `rows` (concatenated) and columns `cols` of a float [out, in] weight."""
    if cols is not None:
        w = w[:, cols[0] : cols[1]]
    if rows is not None:
        w = _rows(w, rows)
    return w.contiguous().clone()


def _rows(t: torch.Tensor, ranges: Ranges) -> torch.Tensor:
    return torch.cat([t[a:b] for a, b in ranges])


def slice_linear(
    layer: nn.Module,
    *,
    rows: Ranges | None = None,
    cols: tuple[int, int] | None = None,
    bias: bool = True,
) -> nn.Module:
    """A new linear layer (float or quantized) holding the given slice of `layer`; `bias`
    False drops the bias (a row-parallel layer adds it on rank 0 only)."""
    old_bias = getattr(layer, "bias", None)
    new_bias = None
    if old_bias is not None and bias:
        new_bias = old_bias.detach() if rows is None else _rows(old_bias.detach(), rows).clone()
    if isinstance(layer, QuantLinear):
        out: nn.Module = QuantLinear(
            slice_quant(layer.qweight, rows=rows, cols=cols), bias=new_bias is not None
        )
    elif isinstance(layer, nn.Linear):
        weight = slice_dense(layer.weight.detach(), rows=rows, cols=cols)
        out = nn.Linear(
            weight.shape[1],
            weight.shape[0],
            bias=new_bias is not None,
            device=weight.device,
            dtype=weight.dtype,
        )
        out.weight = nn.Parameter(weight, requires_grad=False)
    else:
        raise TypeError(f"cannot shard a {type(layer).__name__}")
    if new_bias is not None:
        out.bias = nn.Parameter(new_bias.clone(), requires_grad=False)
    return out


def qkv_rows(cfg: ModelConfig, plan: ShardPlan) -> list[tuple[int, int]]:
    """The rows of the merged q/k/v weight that belong to `plan`'s heads."""
    d = cfg.head_dim
    (h0, h1), (k0, k1) = plan.heads, plan.kv_heads
    return merged_rows(cfg, "qkv_proj", [(h0 * d, h1 * d), (k0 * d, k1 * d), (k0 * d, k1 * d)])


def gate_up_rows(cfg: ModelConfig, plan: ShardPlan) -> list[tuple[int, int]]:
    """The rows of the merged gate/up weight that belong to `plan`'s intermediate columns."""
    return merged_rows(cfg, "gate_up_proj", [plan.inter, plan.inter])


def shardable(cfg: ModelConfig) -> str | None:
    """Why `cfg`'s model cannot be cut into tensor-parallel slices (None: it can)."""
    reason = family_named(cfg.family).tensor_parallel
    if reason is None and cfg.qk_norm == "full":
        reason = "its q/k norms span every head (one rank holds only some)"
    return reason


def shard_model(model: CausalLM, *, plan: ShardPlan, comm: TPComm) -> CausalLM:
    """Cut `model` (loaded whole) down to `plan`'s slices, in place; returns it."""
    full = model.cfg
    reason = shardable(full)
    if reason is not None:
        raise NotImplementedError(
            f"tensor parallelism cannot shard a {full.family} model: {reason}"
        )
    local = plan.local_config(full)
    (h0, h1), (i0, i1), d = plan.heads, plan.inter, full.head_dim
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        assert isinstance(attn, Attention) and isinstance(mlp, MLP)
        attn.qkv_proj = slice_linear(attn.qkv_proj, rows=qkv_rows(full, plan))
        o = slice_linear(attn.o_proj, cols=(h0 * d, h1 * d), bias=plan.rank == 0)
        attn.o_proj = RowParallel(o, comm=comm)
        attn.cfg = local
        mlp.gate_up_proj = slice_linear(mlp.gate_up_proj, rows=gate_up_rows(full, plan))
        down = slice_linear(mlp.down_proj, cols=(i0, i1), bias=plan.rank == 0)
        mlp.down_proj = RowParallel(down, comm=comm)
    _shard_vocab(model, plan=plan, comm=comm)
    model.cfg = local
    return model


def _shard_vocab(model: CausalLM, *, plan: ShardPlan, comm: TPComm) -> None:
    """Vocabulary-parallel embedding and LM head (a tied pair keeps sharing one slice)."""
    embed, head = model.embed_tokens, model.lm_head
    rows = [plan.vocab]
    tied = getattr(head, "weight", None) is getattr(embed, "weight", 0) or (
        getattr(head, "qweight", None) is getattr(embed, "qweight", 0)
    )
    new_head = slice_linear(head, rows=rows)
    if isinstance(embed, QuantEmbedding):
        packed = (
            new_head.qweight
            if tied and isinstance(new_head, QuantLinear)
            else slice_quant(embed.qweight, rows=rows)
        )
        table: nn.Module = QuantEmbedding(packed, dtype=embed.dtype)
    elif isinstance(embed, nn.Embedding):
        own = slice_dense(embed.weight.detach(), rows=rows)
        weight = new_head.weight if tied and isinstance(new_head, nn.Linear) else own
        rows_, width = weight.shape
        table = nn.Embedding(rows_, width, device=weight.device, dtype=weight.dtype)
        table.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, False)
    else:
        raise TypeError(f"cannot shard a {type(embed).__name__}")
    model.embed_tokens = VocabParallelEmbedding(table, start=plan.vocab[0], comm=comm)
    model.lm_head = VocabParallelHead(new_head, sizes=plan.vocab_sizes, comm=comm)


def inter_align(model: CausalLM) -> int:
    """Where the intermediate dimension may be cut: the largest quantization group of the
    down projections (16 for float ones)."""
    groups = [16]
    for layer in model.layers:
        assert isinstance(layer, DecoderLayer)
        down = getattr(layer.mlp, "down_proj", None)  # none in a mixture of experts
        if isinstance(down, QuantLinear):
            w = down.qweight
            groups.append(w.column_step if isinstance(w, NativeWeight) else w.group)
    return max(groups)

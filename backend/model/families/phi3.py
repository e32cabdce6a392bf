"""Phi-3, Phi-3.5 and Phi-4-mini: Llama's layers with q, k and v in one weight and gate and up in
another (as plait merges them), one sliding window for every layer, LongRoPE scaling (short
factors up to the original context, long ones past it, cos and sin scaled by the attention
factor) and, in Phi-4-mini, RoPE on part of each head (`partial_rotary_factor`).

Past the original context transformers switches the whole sequence to the long factors once
it is longer; plait uses the long factors for the positions past it (as vLLM does), so the
two agree up to the original context."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from plait.backend.gguf.metadata import GGUFMetadata
from plait.backend.gguf.quants import read_tensor
from plait.backend.gguf.reader import GGUFFile
from plait.backend.model.config import ModelConfig
from plait.backend.model.families.common import (
    gguf_config,
    gguf_rope,
    head_dim_of,
    hf_config,
    hf_rope,
)
from plait.backend.model.family import Family


def phi3_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    rope = hf_rope(cfg)
    if rope.kind == "longrope":
        original = rope.scaling.get("original_max_position_embeddings")
        original = int(original or cfg.get("original_max_position_embeddings") or 4096)
        scaling = {"original_max_position_embeddings": original, **rope.scaling}
        factor = float(cfg.get("max_position_embeddings", original)) / original
        scaling.setdefault("factor", factor)
        rope = type(rope)(rope.theta, scaling, rope.freq_factors, rope.rotary_dim)
    if rope.rotary_dim is None and cfg.get("partial_rotary_factor"):
        rotary = int(head_dim_of(cfg) * float(cfg["partial_rotary_factor"]))
        rope = type(rope)(
            rope.theta, rope.scaling, None, None if rotary == head_dim_of(cfg) else rotary
        )
    return hf_config(cfg, family="phi3", rope=rope)


def phi3_from_gguf(file: GGUFFile) -> ModelConfig:
    """Phi-3 from GGUF: LongRoPE from the `rope_factors_short` / `rope_factors_long` tensors,
    `rope.scaling.original_context_length` and `rope.scaling.attn_factor`."""
    meta = GGUFMetadata.from_file(file)
    hidden, heads = (
        int(meta.required("embedding_length")),
        int(meta.required("attention.head_count")),
    )
    rope = gguf_rope(file, meta, int(meta.arch_field("attention.key_length") or hidden // heads))
    factors = {t.name: t for t in file.tensors if t.name.startswith("rope_factors_")}
    if factors:
        scaling = {
            "rope_type": "longrope",
            "short_factor": _floats(factors["rope_factors_short.weight"]),
            "long_factor": _floats(factors["rope_factors_long.weight"]),
            "original_max_position_embeddings": int(
                meta.required("rope.scaling.original_context_length")
            ),
        }
        attn = meta.arch_field("rope.scaling.attn_factor")
        if attn is not None:
            scaling["attention_factor"] = float(attn)
        rope = replace(rope, scaling=scaling)
    window = meta.arch_field("attention.sliding_window")
    return gguf_config(
        file, family="phi3", architecture="Phi3ForCausalLM", rope=rope,
        sliding_window=int(window) if window else None,
    )  # fmt: skip


def _floats(tensor: Any) -> list[float]:
    value = read_tensor(tensor)
    assert isinstance(value, torch.Tensor)
    return [float(v) for v in value.reshape(-1)]


PHI3 = Family(
    name="phi3",
    hf_architectures=("Phi3ForCausalLM",),
    gguf_architectures=("phi3",),
    from_hf=phi3_from_hf,
    from_gguf=phi3_from_gguf,
    gguf_layer_names={"ffn_up.weight": "mlp.gate_up_proj.weight"},  # gate and up, stacked
)

"""Granite (3.x): Llama's layers with four multipliers: the embedding's, the residual branches'
(each attention and MLP output is scaled before it joins the residual), the attention scores'
(in place of head_dim ** -0.5) and the logits' divisor."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plait.backend.gguf.metadata import GGUFMetadata
from plait.backend.gguf.reader import GGUFFile
from plait.backend.model.config import ModelConfig
from plait.backend.model.families.common import gguf_config, hf_config
from plait.backend.model.family import Family


def granite_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    return hf_config(
        cfg,
        family="granite",
        embedding_scale=float(cfg.get("embedding_multiplier", 1.0)),
        residual_scale=float(cfg.get("residual_multiplier", 1.0)),
        attention_scale=float(cfg.get("attention_multiplier", 1.0)),
        logit_scale=1.0 / float(cfg.get("logits_scaling", 1.0)),
    )


def granite_from_gguf(file: GGUFFile) -> ModelConfig:
    """llama.cpp's keys: `embedding_scale`, `residual_scale`, `attention.scale` and
    `logit_scale` (the divisor)."""
    meta = GGUFMetadata.from_file(file)
    scale = meta.arch_field("attention.scale")
    return gguf_config(
        file,
        family="granite",
        architecture="GraniteForCausalLM",
        embedding_scale=float(meta.arch_field("embedding_scale", 1.0)),
        residual_scale=float(meta.arch_field("residual_scale", 1.0)),
        attention_scale=None if scale is None else float(scale),
        logit_scale=1.0 / float(meta.arch_field("logit_scale", 1.0)),
    )


GRANITE = Family(
    name="granite",
    hf_architectures=("GraniteForCausalLM",),
    gguf_architectures=("granite",),
    from_hf=granite_from_hf,
    from_gguf=granite_from_gguf,
)

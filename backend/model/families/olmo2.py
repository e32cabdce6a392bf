"""OLMo 2: norms only on each branch's output (after attention, after the MLP, before the
residual add), and RMSNorms over all of q and all of k (not per head) before RoPE. Those q/k
norms span every head, so a tensor-parallel rank (holding some heads) cannot compute them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plait.backend.gguf.reader import GGUFFile
from plait.backend.model.config import ModelConfig
from plait.backend.model.families.common import gguf_config, hf_config
from plait.backend.model.family import Family

CHOICES: dict[str, Any] = {"family": "olmo2", "norm_layout": "post", "qk_norm": "full"}


def olmo2_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    return hf_config(cfg, **CHOICES)


def olmo2_from_gguf(file: GGUFFile) -> ModelConfig:
    return gguf_config(file, architecture="Olmo2ForCausalLM", **CHOICES)


OLMO2 = Family(
    name="olmo2",
    hf_architectures=("Olmo2ForCausalLM",),
    gguf_architectures=("olmo2",),
    from_hf=olmo2_from_hf,
    from_gguf=olmo2_from_gguf,
    gguf_layer_names={
        "post_attention_norm.weight": "post_attention_layernorm.weight",
        "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    },
    tensor_parallel="its q/k norms span every head (one rank holds only some)",
)

"""Gemma 2 and Gemma 3: norms before and after attention and the MLP, GeGLU (tanh GELU), the
embedding scaled by sqrt(hidden), scores scaled by `query_pre_attn_scalar`, sliding-window and
global layers alternating (Gemma 2: every other one; Gemma 3: five of six). Gemma 2 soft-caps
attention scores and the final logits; Gemma 3 normalizes each head of q and k instead and gives
its sliding layers their own RoPE base.

Hugging Face checkpoints store each RMSNorm weight as w - 1 (the norm multiplies by 1 + w);
llama.cpp's converter adds the 1, so GGUF files hold the weight itself (`norm_offset`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plait.backend.gguf.metadata import GGUFMetadata
from plait.backend.gguf.reader import GGUFFile
from plait.backend.model.config import ModelConfig, Rope
from plait.backend.model.families.common import gguf_config, hf_config, hf_rope
from plait.backend.model.family import Family

GEMMA_CHOICES: dict[str, Any] = {
    "activation": "gelu_tanh",
    "norm_layout": "sandwich",
    "tie_word_embeddings": True,
}
# llama.cpp scales a 27B model's scores by (hidden / heads) ** -0.5 (its query_pre_attn_scalar),
# every other size by head_dim ** -0.5; GGUF files carry no query_pre_attn_scalar.
LAYERS_27B = {"gemma2": 46, "gemma3": 62}
GGUF_NAMES = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}


def layer_types(hf_types: list[str] | None, num_layers: int, pattern: int) -> tuple[str, ...]:
    """Each layer "sliding" or "full": from transformers' `layer_types`, else every
    `pattern`-th layer global (layer i when (i + 1) % pattern == 0)."""
    if hf_types:
        return tuple("sliding" if t == "sliding_attention" else "full" for t in hf_types)
    return tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(num_layers))


def _hf_common(cfg: Mapping[str, Any], *, family: str, pattern: int) -> dict[str, Any]:
    scalar = float(cfg.get("query_pre_attn_scalar") or cfg.get("head_dim") or 256)
    layers = int(cfg["num_hidden_layers"])
    types = layer_types(
        cfg.get("layer_types"), layers, int(cfg.get("sliding_window_pattern") or pattern)
    )
    return {
        **GEMMA_CHOICES,
        "family": family,
        "attention_scale": scalar**-0.5,
        "embedding_scale": float(cfg["hidden_size"]) ** 0.5,
        "layer_types": types,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "attn_softcap": _cap(cfg.get("attn_logit_softcapping")),
        "final_softcap": _cap(cfg.get("final_logit_softcapping")),
    }


def _cap(value: Any) -> float | None:
    return float(value) if value else None


def gemma2_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    return hf_config(cfg, **_hf_common(cfg, family="gemma2", pattern=2))


def gemma3_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params:  # transformers 5: one RoPE per layer type
        rope = hf_rope(cfg, params["full_attention"])
        local = hf_rope(cfg, params.get("sliding_attention") or {"rope_theta": 10000.0})
    else:
        rope = hf_rope(cfg)
        local = Rope(theta=float(cfg.get("rope_local_base_freq", 10000.0)))
    common = _hf_common(cfg, family="gemma3", pattern=6)
    return hf_config(cfg, **common, qk_norm="head", rope=rope, local_rope=local)


def _gguf_common(file: GGUFFile, *, family: str, pattern: int) -> dict[str, Any]:
    meta = GGUFMetadata.from_file(file)
    hidden, heads = (
        int(meta.required("embedding_length")),
        int(meta.required("attention.head_count")),
    )
    layers = int(meta.required("block_count"))
    head_dim = int(meta.arch_field("attention.key_length") or hidden // heads)
    scalar = hidden / heads if layers == LAYERS_27B[family] else head_dim
    every = int(meta.arch_field("attention.sliding_window_pattern") or pattern)
    window = meta.arch_field("attention.sliding_window")
    return {
        **GEMMA_CHOICES,
        "family": family,
        "attention_scale": float(meta.arch_field("attention.scale") or scalar**-0.5),
        "embedding_scale": float(hidden) ** 0.5,
        "layer_types": layer_types(None, layers, every),
        "sliding_window": int(window) if window else None,
        "tie_word_embeddings": "output.weight" not in meta.tensor_names,
        "attn_softcap": _cap(meta.arch_field("attn_logit_softcapping")),
        "final_softcap": _cap(meta.arch_field("final_logit_softcapping")),
    }


def gemma2_from_gguf(file: GGUFFile) -> ModelConfig:
    common = _gguf_common(file, family="gemma2", pattern=2)
    return gguf_config(file, architecture="Gemma2ForCausalLM", **common)


def gemma3_from_gguf(file: GGUFFile) -> ModelConfig:
    """Gemma 3 from GGUF: the file's RoPE (base, linear scaling) for the global layers; the
    sliding layers rotate with `rope.freq_base_swa` (10000 where absent) and no scaling."""
    meta = GGUFMetadata.from_file(file)
    common = _gguf_common(file, family="gemma3", pattern=6)
    local = Rope(theta=float(meta.arch_field("rope.freq_base_swa", 10000.0)))
    return gguf_config(
        file, architecture="Gemma3ForCausalLM", **common, qk_norm="head", local_rope=local
    )


GEMMA2 = Family(
    name="gemma2",
    hf_architectures=("Gemma2ForCausalLM",),
    gguf_architectures=("gemma2",),
    from_hf=gemma2_from_hf,
    from_gguf=gemma2_from_gguf,
    gguf_layer_names=GGUF_NAMES,
    norm_offset=1.0,
)
GEMMA3 = Family(
    name="gemma3",
    hf_architectures=("Gemma3ForCausalLM",),
    gguf_architectures=("gemma3",),
    from_hf=gemma3_from_hf,
    from_gguf=gemma3_from_gguf,
    gguf_layer_names=GGUF_NAMES,
    norm_offset=1.0,
)

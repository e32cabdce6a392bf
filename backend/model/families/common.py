"""What every family reads the same way: the shapes and RoPE of a Hugging Face config.json and
of GGUF metadata. A family calls `hf_config` / `gguf_config` with its own choices on top."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from plait.backend.gguf.metadata import GGUFMetadata, eos_token_ids
from plait.backend.gguf.quants import read_tensor
from plait.backend.gguf.reader import GGUFFile
from plait.backend.model.config import ROPE_TYPES, ModelConfig, Rope

GGUF_ROPE_SCALINGS = ("none", "linear")


def as_ids(value: Any) -> tuple[int, ...]:
    """Token ids from a config value: one int, a list, or None."""
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def hf_rope(cfg: Mapping[str, Any], params: Mapping[str, Any] | None = None) -> Rope:
    """The RoPE of a config dict: transformers 5 `rope_parameters` (or `params`, one entry of a
    per-layer-type table) merged with older `rope_theta` / `rope_scaling`; `partial_rotary_factor`
    gives the rotated dimensions."""
    merged = dict(cfg.get("rope_parameters") or {}) if params is None else dict(params)
    if params is None:
        if "rope_theta" in cfg:
            merged.setdefault("rope_theta", cfg["rope_theta"])
        merged.update(cfg.get("rope_scaling") or {})
    if "type" in merged and "rope_type" not in merged:
        merged["rope_type"] = merged.pop("type")
    kind = merged.get("rope_type", "default")
    if kind not in ROPE_TYPES:
        raise NotImplementedError(
            f"rope_type {kind!r} is not implemented; plait supports {ROPE_TYPES}"
        )
    theta = float(merged.pop("rope_theta", 10000.0))
    factor = merged.pop("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    merged = {k: v for k, v in merged.items() if k != "rope_type" or v != "default"}
    return Rope(theta=theta, scaling=merged, rotary_dim=_rotary_dim(cfg, factor))


def _rotary_dim(cfg: Mapping[str, Any], factor: Any) -> int | None:
    if factor is None or float(factor) == 1.0:
        return None
    return int(head_dim_of(cfg) * float(factor))


def head_dim_of(cfg: Mapping[str, Any]) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def hf_config(cfg: Mapping[str, Any], *, family: str, **choices: Any) -> ModelConfig:
    """The shapes every family's config.json states, with the family's `choices` (any
    `ModelConfig` field) on top."""
    heads = int(cfg["num_attention_heads"])
    fields: dict[str, Any] = {
        "architecture": (cfg.get("architectures") or ["LlamaForCausalLM"])[0],
        "family": family,
        "vocab_size": int(cfg["vocab_size"]),
        "hidden_size": int(cfg["hidden_size"]),
        "intermediate_size": int(cfg["intermediate_size"]),
        "num_layers": int(cfg["num_hidden_layers"]),
        "num_heads": heads,
        "num_kv_heads": int(cfg.get("num_key_value_heads") or heads),
        "head_dim": head_dim_of(cfg),
        "max_position_embeddings": int(cfg.get("max_position_embeddings", 4096)),
        "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "rope": hf_rope(cfg),
        "qkv_bias": bool(cfg.get("attention_bias", False)),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "eos_token_ids": as_ids(cfg.get("eos_token_id")),
        "sliding_window": int(cfg["sliding_window"]) if cfg.get("sliding_window") else None,
    }
    return ModelConfig(**{**fields, **choices})


def gguf_config(file: GGUFFile, *, family: str, architecture: str, **choices: Any) -> ModelConfig:
    """The shapes every family's GGUF metadata states (`architecture`: the Hugging Face name
    of the family's model), with the family's `choices` on top."""
    meta = GGUFMetadata.from_file(file)
    hidden = int(meta.required("embedding_length"))
    heads = int(meta.required("attention.head_count"))
    head_dim = gguf_head_dim(meta)
    fields: dict[str, Any] = {
        "architecture": architecture,
        "family": family,
        "vocab_size": _vocab_size(meta),
        "hidden_size": hidden,
        "intermediate_size": int(meta.required("feed_forward_length")),
        "num_layers": int(meta.required("block_count")),
        "num_heads": heads,
        "num_kv_heads": int(meta.arch_field("attention.head_count_kv") or heads),
        "head_dim": head_dim,
        "max_position_embeddings": int(meta.arch_field("context_length", 4096)),
        "rms_norm_eps": float(meta.arch_field("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope": gguf_rope(file, meta, head_dim),
        "qkv_bias": "blk.0.attn_q.bias" in meta.tensor_names,
        "tie_word_embeddings": "output.weight" not in meta.tensor_names,
        "eos_token_ids": eos_token_ids(meta),
    }
    return ModelConfig(**{**fields, **choices})


def gguf_head_dim(meta: GGUFMetadata) -> int:
    """A head's size: `attention.key_length`, else hidden / heads."""
    hidden = int(meta.required("embedding_length"))
    heads = int(meta.required("attention.head_count"))
    return int(meta.arch_field("attention.key_length") or hidden // heads)


def gguf_rope(file: GGUFFile, meta: GGUFMetadata, head_dim: int) -> Rope:
    """The RoPE a GGUF file states: base, scaling, per-frequency factors (`rope_freqs.weight`,
    Llama 3.1-style scaling as llama.cpp's converter bakes it) and rotated dimensions."""
    kind = str(meta.arch_field("rope.scaling.type", "none"))
    if kind not in GGUF_ROPE_SCALINGS:
        raise NotImplementedError(
            f"GGUF file {meta.path.name} uses RoPE scaling {kind!r}; plait supports "
            f"{GGUF_ROPE_SCALINGS} and per-frequency factors (rope_freqs)"
        )
    scaling: dict[str, Any] = {}
    if kind == "linear":
        scaling = {"rope_type": "linear", "factor": float(meta.required("rope.scaling.factor"))}
    dims = meta.arch_field("rope.dimension_count")
    rotary = int(dims) if dims is not None and int(dims) != head_dim else None
    return Rope(
        theta=float(meta.arch_field("rope.freq_base", 10000.0)),
        scaling=scaling,
        freq_factors=_freq_factors(file),
        rotary_dim=rotary,
    )


def _freq_factors(file: GGUFFile) -> tuple[float, ...] | None:
    for tensor in file.tensors:
        if tensor.name == "rope_freqs.weight":
            value = read_tensor(tensor)
            assert isinstance(value, torch.Tensor)  # stored as F32
            return tuple(float(v) for v in value.reshape(-1))
    return None


def _vocab_size(meta: GGUFMetadata) -> int:
    size = meta.arch_field("vocab_size")
    if size is None:
        size = len(meta.fields.get("tokenizer.ggml.tokens", ()))
    if not size:
        raise ValueError(f"GGUF file {meta.path.name} has neither vocab_size nor a token list")
    return int(size)

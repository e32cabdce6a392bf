"""Qwen2 / Qwen2.5 (Llama's layers with q, k and v biases) and Qwen3 (no biases, an RMSNorm over
each head of q and k before RoPE); a sliding window only where the config turns it on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plait.backend.gguf.reader import GGUFFile
from plait.backend.model.config import ModelConfig
from plait.backend.model.families.common import gguf_config, hf_config
from plait.backend.model.family import Family


def _window(cfg: Mapping[str, Any]) -> int | None:
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", False) else None
    return int(window) if window else None


def qwen2_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    bias = bool(cfg.get("attention_bias", True))
    return hf_config(cfg, family="qwen2", qkv_bias=bias, sliding_window=_window(cfg))


def qwen3_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    return hf_config(cfg, family="qwen3", qk_norm="head", sliding_window=_window(cfg))


def qwen3_from_gguf(file: GGUFFile) -> ModelConfig:
    return gguf_config(file, family="qwen3", architecture="Qwen3ForCausalLM", qk_norm="head")


def qwen2_from_gguf(file: GGUFFile) -> ModelConfig:
    return gguf_config(file, family="qwen2", architecture="Qwen2ForCausalLM")


QWEN2 = Family(
    name="qwen2",
    hf_architectures=("Qwen2ForCausalLM",),
    gguf_architectures=("qwen2",),
    from_hf=qwen2_from_hf,
    from_gguf=qwen2_from_gguf,
)
QWEN3 = Family(
    name="qwen3",
    hf_architectures=("Qwen3ForCausalLM",),
    gguf_architectures=("qwen3",),
    from_hf=qwen3_from_hf,
    from_gguf=qwen3_from_gguf,
)

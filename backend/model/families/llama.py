"""Llama 1-3.3 (Llama 3's and 3.1's RoPE scaling, GGUF `rope_freqs`) and Mistral: the shared
layers as they are, SiLU, norms before attention and the MLP; Mistral with one sliding window
for every layer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plait.backend.gguf.reader import GGUFFile
from plait.backend.model.config import ModelConfig
from plait.backend.model.families.common import gguf_config, hf_config
from plait.backend.model.family import Family


def llama_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    return hf_config(cfg, family="llama", sliding_window=None)


def llama_from_gguf(file: GGUFFile) -> ModelConfig:
    return gguf_config(file, family="llama", architecture="LlamaForCausalLM")


def mistral_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    return hf_config(cfg, family="mistral")


LLAMA = Family(
    name="llama",
    hf_architectures=("LlamaForCausalLM",),
    gguf_architectures=("llama",),
    from_hf=llama_from_hf,
    from_gguf=llama_from_gguf,
    gguf_permuted_qk=True,
)
MISTRAL = Family(
    name="mistral",
    hf_architectures=("MistralForCausalLM",),
    gguf_architectures=(),  # llama.cpp writes Mistral models as `llama`
    from_hf=mistral_from_hf,
    from_gguf=llama_from_gguf,
)

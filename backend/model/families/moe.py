"""Mixture-of-experts families: Qwen3-MoE (Qwen3's attention, experts in the layers that
`decoder_sparse_step` and `mlp_only_layers` pick) and Mixtral (Mistral's attention, every layer
a mixture, top-k weights renormalized). The experts are MLPs of their own (layers.py `MoE`);
Mixtral's checkpoint names (`block_sparse_moe`, `w1`/`w3`/`w2`) are renamed onto plait's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plait.backend.gguf.reader import GGUFFile
from plait.backend.model.config import ModelConfig
from plait.backend.model.families.common import hf_config
from plait.backend.model.family import Family

NOT_SHARDED = "its experts are not sharded (mixture-of-experts layers run on one rank)"


def _moe_layers(cfg: Mapping[str, Any]) -> tuple[bool, ...]:
    dense = set(cfg.get("mlp_only_layers") or ())
    step = int(cfg.get("decoder_sparse_step") or 1)
    layers = int(cfg["num_hidden_layers"])
    return tuple(i not in dense and (i + 1) % step == 0 for i in range(layers))


def qwen3_moe_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", False) else None
    return hf_config(
        cfg,
        family="qwen3_moe",
        qk_norm="head",
        sliding_window=int(window) if window else None,
        num_experts=int(cfg.get("num_experts") or cfg["num_local_experts"]),
        experts_per_token=int(cfg["num_experts_per_tok"]),
        moe_intermediate_size=int(cfg["moe_intermediate_size"]),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        moe_layers=_moe_layers(cfg),
    )


def mixtral_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    return hf_config(
        cfg,
        family="mixtral",
        num_experts=int(cfg["num_local_experts"]),
        experts_per_token=int(cfg["num_experts_per_tok"]),
        moe_intermediate_size=int(cfg["intermediate_size"]),
        norm_topk_prob=True,
    )


def _no_gguf(file: GGUFFile) -> ModelConfig:
    raise NotImplementedError(
        f"GGUF file {file.path.name}: mixture-of-experts GGUF files (ffn_*_exps tensors) are "
        "not implemented; load the Hugging Face directory"
    )


QWEN3_MOE = Family(
    name="qwen3_moe",
    hf_architectures=("Qwen3MoeForCausalLM",),
    gguf_architectures=("qwen3moe",),
    from_hf=qwen3_moe_from_hf,
    from_gguf=_no_gguf,
    tensor_parallel=NOT_SHARDED,
)
MIXTRAL = Family(
    name="mixtral",
    hf_architectures=("MixtralForCausalLM",),
    gguf_architectures=(),  # llama.cpp writes Mixtral as `llama` with expert tensors
    from_hf=mixtral_from_hf,
    from_gguf=_no_gguf,
    hf_renames={"block_sparse_moe": "mlp", "w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"},
    tensor_parallel=NOT_SHARDED,
)

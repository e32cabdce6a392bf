"""Tiny random checkpoints of every model family: written by transformers (`save_pretrained`)
and the same weights written as GGUF with `gguf.GGUFWriter`, named and laid out the way
llama.cpp's converter does (llama q/k rows permuted, Gemma norms stored as 1 + w, Phi-3's fused
projections, the family's metadata keys). The tokenizer is the byte-level one of
gguf_synthetic.py, saved beside the Hugging Face files too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from gguf import GGUFWriter
from gguf_synthetic import add_tiny_tokenizer, tiny_vocab

from plait.backend.gguf.tokenizer import load_gguf_tokenizer

VOCAB = len(tiny_vocab()[0])
BASE: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    rms_norm_eps=1e-6, bos_token_id=VOCAB - 2, eos_token_id=VOCAB - 1, pad_token_id=VOCAB - 3,
)  # fmt: skip
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0 + 0.1 * i for i in range(8)],
    "long_factor": [1.5 + 0.5 * i for i in range(8)],
}
SHARED_GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "post_attention_layernorm": "ffn_norm",
}
SANDWICH_GGUF_NAMES = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


@dataclass(frozen=True)
class FamilyCase:
    """One family's tiny checkpoint: the transformers config, the GGUF architecture (None:
    no GGUF of its own) and what its GGUF metadata adds."""

    config: Callable[..., transformers.PretrainedConfig]
    extra: dict[str, Any]
    gguf_arch: str | None
    gguf_names: dict[str, str] = field(default_factory=dict)
    permuted: bool = False
    norm_offset: float = 0.0
    metadata: Callable[[GGUFWriter, Any], None] | None = None


def _gemma2_keys(writer: GGUFWriter, cfg: Any) -> None:
    # llama.cpp takes the scale from the model's size; plait reads attention.scale first
    writer.add_float32("gemma2.attention.scale", cfg.query_pre_attn_scalar**-0.5)
    writer.add_sliding_window(cfg.sliding_window)
    writer.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
    writer.add_final_logit_softcapping(cfg.final_logit_softcapping)


def _gemma3_keys(writer: GGUFWriter, cfg: Any) -> None:
    writer.add_sliding_window(cfg.sliding_window)
    writer.add_uint32("gemma3.attention.sliding_window_pattern", 2)
    writer.add_float32(
        "gemma3.rope.freq_base_swa", cfg.rope_parameters["sliding_attention"]["rope_theta"]
    )
    writer.add_rope_freq_base(cfg.rope_parameters["full_attention"]["rope_theta"])


def _phi3_keys(writer: GGUFWriter, cfg: Any) -> None:
    rope = cfg.rope_parameters
    if cfg.sliding_window:
        writer.add_sliding_window(cfg.sliding_window)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    writer.add_uint32(
        "phi3.rope.scaling.original_context_length", cfg.original_max_position_embeddings
    )
    factor = cfg.max_position_embeddings / cfg.original_max_position_embeddings
    attn = (1 + np.log(factor) / np.log(cfg.original_max_position_embeddings)) ** 0.5
    writer.add_float32("phi3.rope.scaling.attn_factor", float(attn))
    half = len(rope["short_factor"])
    writer.add_tensor(
        "rope_factors_short.weight", np.array(rope["short_factor"], np.float32)[:half]
    )
    writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], np.float32)[:half])


def _granite_keys(writer: GGUFWriter, cfg: Any) -> None:
    writer.add_float32("granite.embedding_scale", cfg.embedding_multiplier)
    writer.add_float32("granite.residual_scale", cfg.residual_multiplier)
    writer.add_float32("granite.attention.scale", cfg.attention_multiplier)
    writer.add_float32("granite.logit_scale", cfg.logits_scaling)


FAMILIES: dict[str, FamilyCase] = {
    "llama3": FamilyCase(
        transformers.LlamaConfig,
        dict(
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),  # fmt: skip
        None,  # llama.cpp bakes llama3 scaling into rope_freqs: tested in test_gguf_models.py
    ),
    "llama": FamilyCase(transformers.LlamaConfig, {}, "llama", permuted=True),
    "mistral": FamilyCase(transformers.MistralConfig, dict(sliding_window=12), None),
    "qwen2": FamilyCase(transformers.Qwen2Config, dict(rope_theta=1e6), "qwen2"),
    "qwen3": FamilyCase(transformers.Qwen3Config, dict(head_dim=32, rope_theta=1e6), "qwen3"),
    "gemma2": FamilyCase(
        transformers.Gemma2Config,
        dict(
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=12,
            attn_logit_softcapping=0.05,  # scores reach 0.09 here: the cap must bite
            final_logit_softcapping=3.0,
        ),  # fmt: skip
        "gemma2",
        SANDWICH_GGUF_NAMES,
        norm_offset=1.0,
        metadata=_gemma2_keys,
    ),  # fmt: skip
    "gemma3": FamilyCase(
        transformers.Gemma3TextConfig,
        dict(
            head_dim=32,
            query_pre_attn_scalar=32,
            sliding_window=12,
            architectures=["Gemma3ForCausalLM"],
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        ),
        "gemma3",
        SANDWICH_GGUF_NAMES,
        norm_offset=1.0,
        metadata=_gemma3_keys,
    ),  # fmt: skip
    "phi3": FamilyCase(
        transformers.Phi3Config,
        dict(sliding_window=40, original_max_position_embeddings=64, rope_scaling=LONGROPE),
        "phi3",
        metadata=_phi3_keys,
    ),  # fmt: skip
    "phi4-mini": FamilyCase(
        transformers.Phi3Config,
        dict(
            original_max_position_embeddings=64,
            partial_rotary_factor=0.5,
            sliding_window=None,
            rope_scaling={
                **LONGROPE,
                "short_factor": LONGROPE["short_factor"][:4],
                "long_factor": LONGROPE["long_factor"][:4],
            },
        ),
        "phi3",
        metadata=_phi3_keys,
    ),  # fmt: skip
    "olmo2": FamilyCase(
        transformers.Olmo2Config,
        {},
        "olmo2",
        {
            "post_attention_layernorm": "post_attention_norm",
            "post_feedforward_layernorm": "post_ffw_norm",
        },
    ),  # fmt: skip
    "qwen3_moe": FamilyCase(
        transformers.Qwen3MoeConfig,
        dict(
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            mlp_only_layers=[1],
            norm_topk_prob=True,
        ),
        None,  # mixture-of-experts GGUF files are refused (not implemented)
    ),  # fmt: skip
    "mixtral": FamilyCase(
        transformers.MixtralConfig, dict(num_local_experts=4, num_experts_per_tok=2), None
    ),
    "granite": FamilyCase(
        transformers.GraniteConfig,
        dict(
            embedding_multiplier=6.0,
            residual_multiplier=0.4,
            attention_multiplier=0.09,
            logits_scaling=4.0,
        ),
        "granite",
        metadata=_granite_keys,
    ),  # fmt: skip
}


def build_hf(directory: Path, name: str, *, seed: int = 0) -> transformers.PreTrainedModel:
    """The family's tiny model with random weights (norms and biases too), saved with its
    tokenizer to `directory`; returned in eval mode."""
    case = FAMILIES[name]
    torch.manual_seed(seed)
    cfg = case.config(**{**BASE, **case.extra})
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname or "bias" in pname:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(directory)
    tokenizer_gguf = directory / "tokenizer-only.gguf"
    _write_gguf(tokenizer_gguf, "llama", lambda writer: None, {})
    load_gguf_tokenizer(tokenizer_gguf).save_pretrained(directory)
    tokenizer_gguf.unlink()
    return model.eval()


def write_family_gguf(path: Path, name: str, model: transformers.PreTrainedModel) -> Path:
    """`model`'s weights (float32) as the GGUF file llama.cpp's converter would write."""
    case = FAMILIES[name]
    assert case.gguf_arch is not None, f"{name} has no GGUF architecture of its own"
    cfg = model.config
    tensors = {}
    for hf_name, value in model.state_dict().items():
        gguf_name = _gguf_name(hf_name, case)
        if gguf_name is not None and not (cfg.tie_word_embeddings and gguf_name == "output.weight"):
            tensors[gguf_name] = _gguf_value(hf_name, value.float(), case, cfg)

    def metadata(writer: GGUFWriter) -> None:
        _shapes(writer, cfg)
        if case.metadata is not None:
            case.metadata(writer, cfg)

    return _write_gguf(path, case.gguf_arch, metadata, tensors)


def _gguf_name(hf_name: str, case: FamilyCase) -> str | None:
    name = hf_name.removeprefix("model.")
    glob = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight"}
    if name in glob:
        return glob[name]
    if name == "lm_head.weight":
        return "output.weight"
    if "rotary_emb" in name:
        return None
    _, layer, rest = name.split(".", 2)
    module, kind = rest.rsplit(".", 1)
    names = {**SHARED_GGUF_NAMES, **case.gguf_names}
    return f"blk.{layer}.{names[module]}.{kind}"


def _gguf_value(hf_name: str, value: torch.Tensor, case: FamilyCase, cfg: Any) -> np.ndarray:
    if case.norm_offset and hf_name.endswith("norm.weight"):
        value = value + case.norm_offset
    if case.permuted and (".q_proj." in hf_name or ".k_proj." in hf_name):
        heads = cfg.num_attention_heads if ".q_proj." in hf_name else cfg.num_key_value_heads
        half = value.shape[0] // heads // 2
        stored = torch.arange(value.shape[0]).reshape(heads, 2, half).transpose(1, 2).reshape(-1)
        value = value[stored]
    return value.numpy()


def _shapes(writer: GGUFWriter, cfg: Any) -> None:
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta")
    if theta is not None:
        writer.add_rope_freq_base(float(theta))


def _write_gguf(
    path: Path, arch: str, metadata: Callable[[GGUFWriter], None], tensors: dict[str, np.ndarray]
) -> Path:
    tokens, merges, types = tiny_vocab()
    writer = GGUFWriter(str(path), arch)
    add_tiny_tokenizer(writer, tokens, merges, types, pre="gpt-2")
    metadata(writer)
    for name, value in tensors.items():
        writer.add_tensor(name, np.ascontiguousarray(value))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

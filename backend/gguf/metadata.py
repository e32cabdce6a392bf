"""A GGUF file's key-value metadata, and the `ModelConfig` it describes.

GGUF names hyperparameters per architecture (`llama.block_count`, `qwen2.rope.freq_base`).
`gguf_model_config` maps them onto plait's `ModelConfig`, the same dataclass a Hugging Face
config.json becomes, so the rest of the runtime does not know where a model came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plait.backend.gguf.reader import GGUFFile
from plait.backend.model_config import ModelConfig

# GGUF architecture -> (Hugging Face architecture, whether llama.cpp permuted attn_q/attn_k)
ARCHITECTURES: dict[str, tuple[str, bool]] = {
    "llama": ("LlamaForCausalLM", True),
    "qwen2": ("Qwen2ForCausalLM", False),
}
ROPE_SCALINGS = ("none", "linear")


@dataclass(frozen=True)
class GGUFMetadata:
    """The scalar and array fields of one GGUF file, and the names of its tensors."""

    path: Path
    fields: dict[str, Any]
    tensor_names: frozenset[str]

    @classmethod
    def from_file(cls, file: GGUFFile) -> GGUFMetadata:
        return cls(file.path, file.fields, frozenset(t.name for t in file.tensors))

    @property
    def architecture(self) -> str:
        """The GGUF architecture name (`general.architecture`), checked to be supported."""
        arch = str(self.fields.get("general.architecture", ""))
        if arch not in ARCHITECTURES:
            raise ValueError(
                f"GGUF file {self.path.name} has architecture {arch!r}; "
                f"plait loads {sorted(ARCHITECTURES)}"
            )
        return arch

    def arch_field(self, key: str, default: Any = None) -> Any:
        """`{architecture}.{key}`, or `default` when absent."""
        return self.fields.get(f"{self.architecture}.{key}", default)

    def required(self, key: str) -> Any:
        value = self.arch_field(key)
        if value is None:
            raise ValueError(f"GGUF file {self.path.name} lacks {self.architecture}.{key}")
        return value


def gguf_model_config(meta: GGUFMetadata) -> ModelConfig:
    """The model's shapes and constants from its GGUF metadata."""
    hf_arch, _ = ARCHITECTURES[meta.architecture]
    hidden = int(meta.required("embedding_length"))
    heads = int(meta.required("attention.head_count"))
    head_dim = int(meta.arch_field("attention.key_length") or hidden // heads)
    _check_rope_dims(meta, head_dim)
    return ModelConfig(
        architecture=hf_arch,
        vocab_size=_vocab_size(meta),
        hidden_size=hidden,
        intermediate_size=int(meta.required("feed_forward_length")),
        num_layers=int(meta.required("block_count")),
        num_heads=heads,
        num_kv_heads=int(meta.arch_field("attention.head_count_kv") or heads),
        head_dim=head_dim,
        max_position_embeddings=int(meta.arch_field("context_length", 4096)),
        rms_norm_eps=float(meta.arch_field("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(meta.arch_field("rope.freq_base", 10000.0)),
        rope_scaling=_rope_scaling(meta),
        qkv_bias="blk.0.attn_q.bias" in meta.tensor_names,
        tie_word_embeddings="output.weight" not in meta.tensor_names,
        sliding_window=None,
        eos_token_ids=eos_token_ids(meta),
    )


def eos_token_ids(meta: GGUFMetadata) -> tuple[int, ...]:
    """End-of-sequence ids: eos, and end-of-turn / end-of-message where the file names them."""
    keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
    ids = [int(meta.fields[k]) for k in (*keys, "tokenizer.ggml.eom_token_id") if k in meta.fields]
    return tuple(dict.fromkeys(ids))


def _vocab_size(meta: GGUFMetadata) -> int:
    size = meta.arch_field("vocab_size")
    if size is None:
        size = len(meta.fields.get("tokenizer.ggml.tokens", ()))
    if not size:
        raise ValueError(f"GGUF file {meta.path.name} has neither vocab_size nor a token list")
    return int(size)


def _check_rope_dims(meta: GGUFMetadata, head_dim: int) -> None:
    dims = meta.arch_field("rope.dimension_count")
    if dims is not None and int(dims) != head_dim:
        raise NotImplementedError(
            f"GGUF file {meta.path.name} rotates {dims} of {head_dim} head dimensions; "
            "plait implements full-width RoPE only"
        )
    if "rope_freqs.weight" in meta.tensor_names:
        raise NotImplementedError(
            f"GGUF file {meta.path.name} has per-frequency RoPE factors (rope_freqs.weight, "
            "Llama 3.1-style scaling); plait supports RoPE scaling types "
            f"{ROPE_SCALINGS} in GGUF files"
        )


def _rope_scaling(meta: GGUFMetadata) -> dict[str, Any]:
    kind = str(meta.arch_field("rope.scaling.type", "none"))
    if kind not in ROPE_SCALINGS:
        raise NotImplementedError(
            f"GGUF file {meta.path.name} uses RoPE scaling {kind!r}; plait supports {ROPE_SCALINGS}"
        )
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(meta.required("rope.scaling.factor"))}
    return {}

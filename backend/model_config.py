"""The architecture of a Llama-family checkpoint, read from its config.json."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of one Llama-family model (Llama 2/3, Qwen2/2.5, Mistral)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        """Build from a Hugging Face config dict (transformers 4 or 5 layout)."""
        arch = (cfg.get("architectures") or ["LlamaForCausalLM"])[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {arch!r}; plait reads {SUPPORTED_ARCHITECTURES}"
            )
        heads = int(cfg["num_attention_heads"])
        rope = _rope_parameters(cfg)
        window = cfg.get("sliding_window")
        if arch == "Qwen2ForCausalLM" and not cfg.get("use_sliding_window", False):
            window = None
        return cls(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.pop("rope_theta", 10000.0)),
            rope_scaling=rope,
            qkv_bias=bool(cfg.get("attention_bias", arch == "Qwen2ForCausalLM")),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            sliding_window=int(window) if window else None,
            eos_token_ids=_as_tuple(cfg.get("eos_token_id")),
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        """Read config.json (and generation_config.json's eos ids, if present)."""
        path = Path(path)
        cfg = json.loads((path / "config.json").read_text())
        gen_path = path / "generation_config.json"
        if gen_path.exists():
            gen_eos = json.loads(gen_path.read_text()).get("eos_token_id")
            eos = _as_tuple(cfg.get("eos_token_id")) + _as_tuple(gen_eos)
            cfg = {**cfg, "eos_token_id": list(dict.fromkeys(eos))}
        return cls.from_dict(cfg)

    def inv_freq(self) -> torch.Tensor:
        """RoPE inverse frequencies [head_dim / 2] in float64, scaling applied."""
        dim = self.head_dim
        base = torch.arange(0, dim, 2, dtype=torch.float64) / dim
        inv = 1.0 / (self.rope_theta**base)
        kind = self.rope_scaling.get("rope_type", "default")
        if kind == "linear":
            return inv / float(self.rope_scaling["factor"])
        if kind == "llama3":
            return _llama3_inv_freq(inv, self.rope_scaling)
        return inv

    def cos_sin_cache(self, max_positions: int | None = None) -> torch.Tensor:
        """[max_positions, head_dim] float32: cos of position * inv_freq, then sin."""
        n = max_positions or self.max_position_embeddings
        freqs = torch.outer(torch.arange(n, dtype=torch.float64), self.inv_freq())
        return torch.cat([freqs.cos(), freqs.sin()], dim=-1).float()


def _as_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _rope_parameters(cfg: dict[str, Any]) -> dict[str, Any]:
    """Merge transformers 5 `rope_parameters` and older `rope_theta`/`rope_scaling`."""
    params = dict(cfg.get("rope_parameters") or {})
    if "rope_theta" in cfg:
        params.setdefault("rope_theta", cfg["rope_theta"])
    params.update(cfg.get("rope_scaling") or {})
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    kind = params.get("rope_type", "default")
    if kind not in SUPPORTED_ROPE_TYPES:
        raise NotImplementedError(
            f"rope_type {kind!r} is not implemented; plait supports {SUPPORTED_ROPE_TYPES}"
        )
    return params


def _llama3_inv_freq(inv: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_ctx = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_ctx / low, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    return torch.where(medium, smoothed, scaled)

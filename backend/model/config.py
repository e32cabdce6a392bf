"""The architecture of a checkpoint: shapes, constants and the family's choices.

One `ModelConfig` describes every decoder plait runs, whatever its family and whatever file it
came from (a Hugging Face config.json or GGUF metadata: the family modules in `families/`
read both). The shared layers (layers.py) take the family's choices from it: the attention
scale, the activation, where the norms sit, q/k norms, the window and RoPE of each layer, soft
caps, and the scales of the embedding, the residual branches and the logits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

ROPE_TYPES = ("default", "linear", "llama3", "longrope")
ACTIVATIONS = ("silu", "gelu_tanh")
# pre: norm before attention and before the MLP (Llama); sandwich: also after each (Gemma 2/3);
# post: only after each, on the branch's output (OLMo 2).
NORM_LAYOUTS = ("pre", "sandwich", "post")
# head: RMSNorm over each head's q and k (Qwen3, Gemma 3); full: over all of q and of k (OLMo 2).
QK_NORMS = ("head", "full")
LAYER_TYPES = ("full", "sliding")


@dataclass(frozen=True)
class Rope:
    """One RoPE table: base `theta`, a scaling (`scaling["rope_type"]`, transformers' keys),
    per-frequency divisors (GGUF `rope_freqs`) and the dimensions it rotates (`rotary_dim`,
    None: the whole head; a partial rotation is served by reordering q/k rows at load)."""

    theta: float = 10000.0
    scaling: Mapping[str, Any] = field(default_factory=dict)
    freq_factors: tuple[float, ...] | None = None
    rotary_dim: int | None = None

    @property
    def kind(self) -> str:
        return str(self.scaling.get("rope_type", "default"))

    def inv_freq(self, head_dim: int, *, long: bool = False) -> torch.Tensor:
        """Inverse frequencies [rotary_dim / 2] in float64, scaling applied (`long`: the
        longrope factors for positions past the original context)."""
        dim = self.rotary_dim or head_dim
        inv = 1.0 / (self.theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        if self.freq_factors is not None:
            inv = inv / torch.tensor(self.freq_factors, dtype=torch.float64)
        if self.kind == "linear":
            return inv / float(self.scaling["factor"])
        if self.kind == "llama3":
            return _llama3_inv_freq(inv, self.scaling)
        if self.kind == "longrope":
            key = "long_factor" if long else "short_factor"
            return inv / torch.tensor(self.scaling[key], dtype=torch.float64)
        return inv

    def cos_sin(self, head_dim: int, positions: int) -> torch.Tensor:
        """[positions, head_dim] float32: cos of position * inv_freq, then sin (both times
        longrope's attention factor); frequencies past `rotary_dim` rotate by nothing and stay
        unscaled (cos 1, sin 0)."""
        pos = torch.arange(positions, dtype=torch.float64)
        freqs = torch.outer(pos, self.inv_freq(head_dim))
        if self.kind == "longrope":
            original = int(self.scaling["original_max_position_embeddings"])
            long = torch.outer(pos, self.inv_freq(head_dim, long=True))
            freqs = torch.where(pos[:, None] >= original, long, freqs)
        scale = self._attention_factor()
        cos, sin = freqs.cos() * scale, freqs.sin() * scale
        pad = head_dim // 2 - freqs.shape[1]  # dimensions left alone: unscaled, unrotated
        cos = torch.nn.functional.pad(cos, (0, pad), value=1.0)
        sin = torch.nn.functional.pad(sin, (0, pad), value=0.0)
        return torch.cat([cos, sin], dim=-1).float()

    def _attention_factor(self) -> float:
        """longrope's scale of cos and sin (transformers' default when the config has none)."""
        if self.kind != "longrope":
            return 1.0
        if "attention_factor" in self.scaling:
            return float(self.scaling["attention_factor"])
        factor = float(self.scaling.get("factor", 1.0))
        original = float(self.scaling["original_max_position_embeddings"])
        return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


@dataclass(frozen=True)
class ModelConfig:
    """Shapes, constants and family choices of one decoder-only model."""

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
    rope: Rope = field(default_factory=Rope)
    family: str = "llama"
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()  # () : every layer "sliding" with a window, else "full"
    local_rope: Rope | None = None  # sliding layers' RoPE (None: `rope`)
    attention_scale: float | None = None  # None: head_dim ** -0.5
    activation: str = "silu"
    norm_layout: str = "pre"
    qk_norm: str | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    embedding_scale: float = 1.0
    residual_scale: float = 1.0
    logit_scale: float = 1.0
    num_experts: int = 0  # > 0: mixture-of-experts layers (`moe_layers` says which)
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    moe_layers: tuple[bool, ...] = ()  # () : every layer, when there are experts

    def __post_init__(self) -> None:
        choices: dict[str, tuple[str | None, tuple[str | None, ...]]] = {
            "activation": (self.activation, ACTIVATIONS),
            "norm_layout": (self.norm_layout, NORM_LAYOUTS),
            "qk_norm": (self.qk_norm, (None, *QK_NORMS)),
        }
        for name, (value, allowed) in choices.items():
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries, not {self.num_layers}"
            )
        if not set(self.layer_types) <= set(LAYER_TYPES):
            raise ValueError(f"layer_types must be drawn from {LAYER_TYPES}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def scale(self) -> float:
        """The attention scores' scale."""
        return self.attention_scale if self.attention_scale is not None else self.head_dim**-0.5

    def is_moe(self, layer: int) -> bool:
        """Whether layer `layer` has experts in place of its MLP."""
        if not self.num_experts:
            return False
        return self.moe_layers[layer] if self.moe_layers else True

    def layer_type(self, layer: int) -> str:
        if self.layer_types:
            return self.layer_types[layer]
        return "sliding" if self.sliding_window else "full"

    def window(self, layer: int) -> int | None:
        """The positions layer `layer` attends to (the last `window`; None: all)."""
        return self.sliding_window if self.layer_type(layer) == "sliding" else None

    def ropes(self) -> tuple[Rope, ...]:
        """The model's distinct RoPE tables: the global one, then the sliding layers' own."""
        local = self.local_rope
        return (self.rope,) if local is None or local == self.rope else (self.rope, local)

    def rope_index(self, layer: int) -> int:
        """Which of `ropes()` layer `layer` rotates with."""
        return 1 if self.layer_type(layer) == "sliding" and len(self.ropes()) > 1 else 0

    def cos_sin_tables(self, max_positions: int | None = None) -> list[torch.Tensor]:
        """One [positions, head_dim] float32 table per entry of `ropes()`."""
        n = max_positions or self.max_position_embeddings
        return [rope.cos_sin(self.head_dim, n) for rope in self.ropes()]


def _llama3_inv_freq(inv: torch.Tensor, scaling: Mapping[str, Any]) -> torch.Tensor:
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_ctx = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_ctx / low, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    return torch.where(medium, smoothed, scaled)

"""plait's parameter names and merged weights, defined once.

Every family's model holds the same parameters (layers.py): `embed_tokens`, `norm`, `lm_head`
and per layer `self_attn.{qkv_proj, o_proj, q_norm, k_norm}`, `mlp.{gate_up_proj, down_proj}`
and up to four norms. Two of them merge several checkpoint tensors: `qkv_proj` stacks q, k and
v along its rows, `gate_up_proj` stacks gate and up. A checkpoint tensor goes to a `Target`: a
parameter and, for a merged one, its part. The safetensors loader, the GGUF loader and the
tensor-parallel shard plan all take the parts' rows from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from plait.backend.model.config import ModelConfig

# merged parameter -> the checkpoint projections it stacks, in order
MERGED: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
_PART_OF = {part: (merged, i) for merged, parts in MERGED.items() for i, part in enumerate(parts)}
LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes: a parameter, and its part within a merged one."""

    param: str
    shard: int | None = None

    @property
    def key(self) -> str:
        return self.param if self.shard is None else f"{self.param}#{self.shard}"

    @property
    def keys(self) -> set[str]:
        """The keys this target fills: its own, or every part's of a whole merged weight (a
        checkpoint that stores q, k and v as one tensor, as Phi-3 does)."""
        merged = self.merged
        if merged is None or self.shard is not None:
            return {self.key}
        return {Target(self.param, i).key for i in range(len(MERGED[merged]))}

    @property
    def merged(self) -> str | None:
        """The merged projection this parameter belongs to (`qkv_proj`, `gate_up_proj`)."""
        parts = self.param.split(".")
        return parts[-2] if len(parts) >= 2 and parts[-2] in MERGED else None


def part_sizes(cfg: ModelConfig, merged: str, *, expert: bool = False) -> list[int]:
    """Rows of each part of a merged weight (`expert`: of an expert's MLP)."""
    if merged == "qkv_proj":
        return [cfg.q_size, cfg.kv_size, cfg.kv_size]
    if merged == "gate_up_proj":
        inter = cfg.moe_intermediate_size if expert else cfg.intermediate_size
        return [inter, inter]
    raise KeyError(merged)


def part_rows(cfg: ModelConfig, merged: str, part: int, *, expert: bool = False) -> tuple[int, int]:
    """The rows [start, stop) part `part` of `merged` occupies."""
    sizes = part_sizes(cfg, merged, expert=expert)
    start = sum(sizes[:part])
    return start, start + sizes[part]


def merged_rows(
    cfg: ModelConfig, merged: str, ranges: Iterable[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Rows of `merged` that hold, in each part, the given range of that part's own rows (a
    rank's heads of q, k and v; its columns of gate and up)."""
    out = []
    for part, (a, b) in enumerate(ranges):
        start, _ = part_rows(cfg, merged, part)
        out.append((start + a, start + b))
    return out


def hf_target(name: str, renames: Mapping[str, str] | None = None) -> Target | None:
    """The target of a Hugging Face tensor name (`model.layers.0.self_attn.q_proj.weight` ->
    `layers.0.self_attn.qkv_proj.weight` part 0); None for tensors plait does not keep
    (rotary caches). `renames` maps a family's own module names onto plait's."""
    if "rotary_emb" in name:
        return None
    name = name.removeprefix("model.")
    for theirs, ours in (renames or {}).items():
        name = name.replace(f".{theirs}.", f".{ours}.")
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in _PART_OF:
        merged, shard = _PART_OF[parts[-2]]
        return Target(".".join([*parts[:-2], merged, parts[-1]]), shard)
    return Target(name)


def expected_keys(params: Iterable[str], cfg: ModelConfig) -> set[str]:
    """The target keys a complete checkpoint fills: each parameter, a merged one once per
    part (a tied LM head is the embedding's)."""
    keys = set()
    for name in params:
        merged = Target(name).merged
        if merged is None:
            keys.add(name)
        else:
            keys.update(Target(name, i).key for i in range(len(MERGED[merged])))
    if cfg.tie_word_embeddings:
        keys.discard("lm_head.weight")
    return keys


def copy_into(
    params: Mapping[str, torch.nn.Parameter],
    cfg: ModelConfig,
    target: Target,
    value: torch.Tensor,
    *,
    source: str,
) -> None:
    """Copy checkpoint tensor `source` into its target (a whole parameter, or a part's
    rows of a merged one), its shape checked; ValueError naming it otherwise."""
    if target.param not in params:
        raise ValueError(f"unexpected weight {source!r}: no place for it in the {cfg.family} model")
    dest = params[target.param].data
    if target.shard is not None:
        merged = target.merged
        assert merged is not None
        start, stop = part_rows(cfg, merged, target.shard, expert=".experts." in target.param)
        dest = dest[start:stop]
    if tuple(dest.shape) != tuple(value.shape):
        raise ValueError(
            f"weight {source!r} has shape {tuple(value.shape)}, "
            f"expected {tuple(dest.shape)} for {target.key}"
        )
    dest.copy_(value)


def check_complete(params: Iterable[str], cfg: ModelConfig, loaded: set[str], where: str) -> None:
    """ValueError naming the first missing weights of a checkpoint."""
    missing = sorted(expected_keys(params, cfg) - loaded)
    if missing:
        raise ValueError(f"{where} lacks weights for {missing[:5]}")

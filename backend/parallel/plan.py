"""Which slice of each weight a tensor-parallel rank holds.

Attention is split by KV-head groups: rank r holds some KV heads and the query heads that
read them (an uneven split when the KV heads do not divide by the ranks: SmolLM2-135M's
3 KV heads over 2 ranks give 2 groups (6 query heads) to rank 0 and 1 group (3 heads) to
rank 1). With fewer KV heads than ranks, each KV head is replicated on `tp / kv_heads` ranks
that split its query heads (as vLLM does). The MLP's intermediate dimension and the
vocabulary are split as evenly as their alignment allows: intermediate at multiples of the
quantization group (the row-parallel down projection is cut along its input), vocabulary
at multiples of 16 rows (the packed weights' row blocks).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from plait.backend.model.config import ModelConfig

VOCAB_ALIGN = 16


@dataclass(frozen=True)
class ShardPlan:
    """One rank's ranges (start, stop) of query heads, KV heads, intermediate columns and
    vocabulary rows, and every rank's vocabulary slice size (logits are gathered padded to
    the widest)."""

    rank: int
    world: int
    heads: tuple[int, int]
    kv_heads: tuple[int, int]
    inter: tuple[int, int]
    vocab: tuple[int, int]
    vocab_sizes: tuple[int, ...]

    def local_config(self, cfg: ModelConfig) -> ModelConfig:
        """The model config this rank's layers are built with (the vocabulary stays whole:
        the sampler sees gathered logits)."""
        return replace(
            cfg,
            num_heads=self.heads[1] - self.heads[0],
            num_kv_heads=self.kv_heads[1] - self.kv_heads[0],
            intermediate_size=self.inter[1] - self.inter[0],
        )


def plan_shards(cfg: ModelConfig, *, rank: int, world: int, inter_align: int = 16) -> ShardPlan:
    """Rank `rank`'s slice of `cfg`'s model over `world` ranks, the intermediate dimension
    cut at multiples of `inter_align` (the down projections' quantization group); ValueError
    when the model cannot be split that way."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside a world of {world}")
    heads, kv_heads = _attention_split(cfg, rank=rank, world=world)
    inter = _aligned_split(cfg.intermediate_size, world, inter_align, "intermediate_size")
    vocab = _aligned_split(cfg.vocab_size, world, VOCAB_ALIGN, "vocab_size")
    sizes = tuple(b - a for a, b in vocab)
    return ShardPlan(rank, world, heads, kv_heads, inter[rank], vocab[rank], sizes)


def _attention_split(
    cfg: ModelConfig, *, rank: int, world: int
) -> tuple[tuple[int, int], tuple[int, int]]:
    """(query heads, KV heads) of `rank`."""
    kv, group = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads
    if kv >= world:
        kv_range = _even(kv, world)[rank]
        return (kv_range[0] * group, kv_range[1] * group), kv_range
    if world % kv or group % (world // kv):
        raise ValueError(
            f"tp={world}: {kv} KV heads of {group} query heads each cannot be replicated evenly"
        )
    copies = world // kv
    head = rank // copies
    share = group // copies
    start = head * group + (rank % copies) * share
    return (start, start + share), (head, head + 1)


def _even(n: int, parts: int) -> list[tuple[int, int]]:
    """`n` units in `parts` contiguous ranges, the first ones one larger when uneven."""
    base, extra = divmod(n, parts)
    bounds = [0]
    for p in range(parts):
        bounds.append(bounds[-1] + base + (1 if p < extra else 0))
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _aligned_split(n: int, parts: int, align: int, name: str) -> list[tuple[int, int]]:
    """`n` split in `parts` ranges whose bounds are multiples of `align` (the last may end
    at `n`), as even as that allows."""
    units = -(-n // align)
    if units < parts:
        raise ValueError(f"{name}={n} is too small for tp={parts}")
    return [(a * align, min(b * align, n)) for a, b in _even(units, parts)]

"""A partial rotation (RoPE on the first `rotary_dim` dimensions of each head, as Phi-4-mini's
`partial_rotary_factor`) served by the full-width RoPE kernels.

The kernels rotate dimension j with j + head_dim / 2 by frequency j. A partial rotation pairs
i with i + rotary_dim / 2 for i < rotary_dim / 2 and leaves the rest alone. Reordering the
rows of q and k in each head the same way at load (`head_order`) puts every rotated pair where
the kernels rotate and the other dimensions where the table rotates by nothing (frequencies
past rotary_dim / 2 are 0: cos 1, sin 0, `Rope.cos_sin`). Scores are dot products of q and
k, so one order applied to both changes none; v and the output keep their order.
"""

from __future__ import annotations

import torch

from plait.backend.model.config import ModelConfig
from plait.backend.model.weights import Target


def head_order(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """For each dimension of a reordered head, the checkpoint dimension it holds."""
    half, rot = head_dim // 2, rotary_dim // 2
    rest = list(range(rotary_dim, head_dim))
    first = list(range(rot)) + rest[: half - rot]
    second = list(range(rot, rotary_dim)) + rest[half - rot :]
    return torch.tensor(first + second)


def row_order(cfg: ModelConfig, target: Target, rows: int) -> torch.Tensor | None:
    """The row index that reorders a q/k weight (or bias, or head-wise norm) for a partial
    rotation; None when `target` needs none (a full rotation, v, anything else)."""
    rotary = cfg.rope.rotary_dim
    if rotary is None or rotary == cfg.head_dim:
        return None
    order = head_order(cfg.head_dim, rotary)
    name = target.param.rsplit(".", 2)
    module = name[-2] if len(name) >= 2 else ""
    if module in ("q_norm", "k_norm") and cfg.qk_norm == "head":
        return order
    if module != "qkv_proj" or target.shard == 2:
        return None
    heads = rows // cfg.head_dim if target.shard is not None else cfg.num_heads + cfg.num_kv_heads
    index = torch.arange(rows)
    per_head = (torch.arange(heads)[:, None] * cfg.head_dim + order[None, :]).reshape(-1)
    index[: per_head.numel()] = per_head
    return index


def rotary_rows(cfg: ModelConfig, target: Target, value: torch.Tensor) -> torch.Tensor:
    """`value` with its rows reordered for a partial rotation (unchanged when none applies)."""
    order = row_order(cfg, target, value.shape[0])
    return value if order is None else value[order]

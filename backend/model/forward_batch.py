"""The tensors one forward pass needs, built by the scheduler and read by every layer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, cast

import torch

MIN_SHARED_PREFIX = 64  # below this, reading the prefix per request costs little
MAX_DECODE_STYLE_EXTEND = 8  # extends this short run as one decode query per token


@dataclass(frozen=True)
class ForwardBatch:
    """A mixed batch: requests that extend by many tokens first, then short extends and
    decodes, whose every token attends as one decode query (a query at position p of a
    request sees positions [0, p], all in the pool by then).

    Token tensors are packed over requests in that order. `logit_indices` picks the token
    positions whose logits are computed (each request's last token, plus prompt positions
    whose logprobs were asked for).
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_slots: torch.Tensor  # [T] int64, KV slot of each new token
    req_rows: torch.Tensor  # [B] int64, rows of the req-to-token table
    prefix_lens: torch.Tensor  # [B] int64
    extend_lens: torch.Tensor  # [B] int64
    num_extend_reqs: int  # requests [0, num_extend_reqs) extend; the rest decode
    num_extend_tokens: int
    decode_rows: torch.Tensor  # [T - num_extend_tokens] table row of each decode query
    decode_seq_lens: torch.Tensor  # [T - num_extend_tokens] positions each query attends to
    logit_indices: torch.Tensor  # [N] int64 into the token dimension
    req_to_token: torch.Tensor  # the pool's [max_reqs, max_len] int32 table (not copied)
    decode_shared_prefix: int = 0  # leading positions all decode requests share slots for

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def seq_lens(self) -> torch.Tensor:
        return self.prefix_lens + self.extend_lens

    def to(self, device: torch.device) -> ForwardBatch:
        moved = {
            name: value.to(device, non_blocking=True)
            for name in self.__dataclass_fields__
            if isinstance(value := getattr(self, name), torch.Tensor)
        }
        return dataclasses.replace(self, **cast(dict[str, Any], moved))

    @classmethod
    def build(
        cls,
        *,
        input_ids: list[int],
        out_slots: torch.Tensor,
        req_rows: list[int],
        prefix_lens: list[int],
        extend_lens: list[int],
        logit_indices: list[int],
        req_to_token: torch.Tensor,
    ) -> ForwardBatch:
        """Assemble from host lists; requests must already be ordered long extends first."""
        prefix = torch.tensor(prefix_lens, dtype=torch.int64)
        extend = torch.tensor(extend_lens, dtype=torch.int64)
        num_ext = sum(1 for n in extend_lens if not decode_style(n))
        if not all(decode_style(n) for n in extend_lens[num_ext:]):
            raise ValueError("ForwardBatch: long extends must come before decodes")
        starts = torch.repeat_interleave(prefix, extend)
        offsets = torch.arange(len(input_ids)) - torch.repeat_interleave(
            torch.cumsum(extend, 0) - extend, extend
        )
        positions = starts + offsets
        num_ext_tokens = int(extend[:num_ext].sum())
        decode_rows = torch.repeat_interleave(
            torch.tensor(req_rows[num_ext:], dtype=torch.int64), extend[num_ext:]
        )
        decode_positions = positions[num_ext_tokens:]
        return cls(
            input_ids=torch.tensor(input_ids, dtype=torch.int64),
            positions=positions,
            out_slots=out_slots.to(torch.int64),
            req_rows=torch.tensor(req_rows, dtype=torch.int64),
            prefix_lens=prefix,
            extend_lens=extend,
            num_extend_reqs=num_ext,
            num_extend_tokens=num_ext_tokens,
            decode_rows=decode_rows,
            decode_seq_lens=decode_positions + 1,
            logit_indices=torch.tensor(logit_indices, dtype=torch.int64),
            req_to_token=req_to_token,
            decode_shared_prefix=shared_prefix(
                req_to_token, decode_rows.tolist(), decode_positions.tolist()
            ),
        )


def decode_style(extend_len: int) -> bool:
    """Whether a request's new tokens attend as decode queries (one per token)."""
    return 1 <= extend_len <= MAX_DECODE_STYLE_EXTEND


def shared_prefix(table: torch.Tensor, rows: list[int], lens: list[int]) -> int:
    """How many leading positions map to the same KV slots in every one of `rows` (requests
    forked from one prompt, a few-shot batch): decode attention then reads them once."""
    limit = min(lens, default=0)
    if len(rows) < 2 or limit < MIN_SHARED_PREFIX or not table.is_cpu:
        return 0
    block = table[rows, :limit]
    same = (block == block[:1]).all(dim=0)
    return limit if bool(same.all()) else int(same.to(torch.int8).argmin())

"""The tensors one forward pass needs, built by the scheduler and read by every layer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, cast

import torch


@dataclass(frozen=True)
class ForwardBatch:
    """A mixed batch: requests that extend by several tokens first, then decodes (1 token).

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
    logit_indices: torch.Tensor  # [N] int64 into the token dimension
    req_to_token: torch.Tensor  # the pool's [max_reqs, max_len] int32 table (not copied)

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
        """Assemble from host lists; requests must already be ordered extends-first."""
        prefix = torch.tensor(prefix_lens, dtype=torch.int64)
        extend = torch.tensor(extend_lens, dtype=torch.int64)
        num_ext = sum(1 for n in extend_lens if n != 1)
        if any(n == 1 for n in extend_lens[:num_ext]) or any(n != 1 for n in extend_lens[num_ext:]):
            raise ValueError("ForwardBatch: extend requests must come before decode requests")
        starts = torch.repeat_interleave(prefix, extend)
        offsets = torch.arange(len(input_ids)) - torch.repeat_interleave(
            torch.cumsum(extend, 0) - extend, extend
        )
        return cls(
            input_ids=torch.tensor(input_ids, dtype=torch.int64),
            positions=starts + offsets,
            out_slots=out_slots.to(torch.int64),
            req_rows=torch.tensor(req_rows, dtype=torch.int64),
            prefix_lens=prefix,
            extend_lens=extend,
            num_extend_reqs=num_ext,
            num_extend_tokens=int(extend[:num_ext].sum()),
            logit_indices=torch.tensor(logit_indices, dtype=torch.int64),
            req_to_token=req_to_token,
        )

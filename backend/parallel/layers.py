"""The collectives of a tensor-parallel model, as modules wrapping each rank's slice.

`RowParallel` sums a row-parallel projection's partial outputs (o, down) over the ranks;
`VocabParallelEmbedding` looks up the ids in this rank's vocabulary rows (zeros elsewhere)
and sums, which is exact (one rank contributes each row); `VocabParallelHead` gathers each
rank's logits to rank 0, the only rank that samples.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from plait.backend.parallel.comm import TPComm


class RowParallel(nn.Module):
    """`inner(x)` summed over the ranks (each holds some input columns of the weight)."""

    def __init__(self, inner: nn.Module, *, comm: TPComm) -> None:
        super().__init__()
        self.inner = inner
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(self.inner(x).contiguous())


class VocabParallelEmbedding(nn.Module):
    """Embeddings of ids in [start, start + rows of `inner`) from this rank, summed over
    the ranks (every id's row comes from exactly one of them)."""

    def __init__(self, inner: nn.Module, *, start: int, comm: TPComm) -> None:
        super().__init__()
        self.inner, self.start, self.comm = inner, start, comm
        weight = getattr(inner, "weight", None)
        packed = getattr(inner, "qweight", None)
        self.rows = int(weight.shape[0]) if isinstance(weight, torch.Tensor) else int(packed.n)  # type: ignore[union-attr]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        mine = (local >= 0) & (local < self.rows)
        out = self.inner(torch.where(mine, local, torch.zeros_like(local)))
        out = out * mine.unsqueeze(-1).to(out.dtype)
        return self.comm.all_reduce(out.contiguous())


class VocabParallelHead(nn.Module):
    """Logits of this rank's vocabulary rows, gathered to rank 0 as [N, vocab]; the other
    ranks get an empty tensor. `sizes`: every rank's number of rows."""

    def __init__(self, inner: nn.Module, *, sizes: Sequence[int], comm: TPComm) -> None:
        super().__init__()
        self.inner, self.sizes, self.comm = inner, tuple(sizes), comm
        self.pad = max(self.sizes)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        local = self.inner(h)
        if local.shape[1] < self.pad:
            local = F.pad(local, (0, self.pad - local.shape[1]))
        full = self.comm.gather_rows(local)
        if full is None:
            return local[:0]
        if all(size == self.pad for size in self.sizes):
            return full
        return torch.cat(
            [full[:, r * self.pad : r * self.pad + n] for r, n in enumerate(self.sizes)], 1
        )

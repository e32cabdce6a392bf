"""`TPComm`: one rank's handle on the tensor-parallel process group.

Passed explicitly to everything that communicates (the sharded layers, the fused step's
reduce callback, the batch broadcast); nothing here is a module-level singleton. The group
is torch.distributed's: gloo on the CPU, NCCL on CUDA.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable

import torch
import torch.distributed as dist

log = logging.getLogger("plait.parallel")
# Followers wait for the next step as long as the server idles; a dead peer breaks the
# connection at once, so this only bounds a peer that hangs.
GROUP_TIMEOUT = datetime.timedelta(days=7)
REDUCE_FAILED = -20  # what the fused step's callback returns when the all-reduce raised


class TPComm:
    """Rank `rank` of `world` in `group` (None: torch's default group), communicating
    tensors on `device`."""

    def __init__(
        self, *, rank: int, world: int, device: torch.device, group: dist.ProcessGroup | None
    ) -> None:
        self.rank, self.world, self.device, self.group = rank, world, device, group
        self.reduce_error: BaseException | None = None
        self._gathered = torch.empty(0, device=device)

    @classmethod
    def init(cls, *, rank: int, world: int, init_method: str, device: torch.device) -> TPComm:
        """Join the group through torch's TCP rendezvous at `init_method` (tcp://host:port)."""
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend, init_method=init_method, rank=rank, world_size=world, timeout=GROUP_TIMEOUT
        )
        return cls(rank=rank, world=world, device=device, group=None)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` (contiguous) over the ranks, in place; returns it. With gloo, as one
        all-gather and a local sum in rank order (the same on every rank): one exchange
        where gloo's all-reduce of a small tensor takes two, about 1.5x faster measured."""
        if self.device.type == "cuda" or self.world == 1:
            dist.all_reduce(t, group=self.group)
            return t
        flat = t.view(-1)
        n = flat.numel()
        if self._gathered.numel() < self.world * n or self._gathered.dtype != t.dtype:
            self._gathered = torch.empty(self.world * n, dtype=t.dtype, device=t.device)
        parts = self._gathered[: self.world * n]
        dist.all_gather_single(parts, flat, group=self.group)
        rows = parts.view(self.world, n)
        torch.add(rows[0], rows[1], out=flat)
        for r in range(2, self.world):
            flat.add_(rows[r])
        return t

    def broadcast(self, t: torch.Tensor) -> torch.Tensor:
        """Rank 0's `t` on every rank (in place)."""
        dist.broadcast(t, src=0, group=self.group)
        return t

    def broadcast_object(self, obj: object) -> object:
        """Rank 0's picklable `obj` on every rank (setup only: it pickles)."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather_rows(self, t: torch.Tensor) -> torch.Tensor | None:
        """Every rank's [N, W] `t` concatenated along dim 1 on rank 0 (None elsewhere)."""
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.world)] if self.rank == 0 else None
        dist.gather(t, gather_list=parts, dst=0, group=self.group)
        return torch.cat(parts, dim=1) if parts is not None else None

    def reduce_callback(self, buffer: Callable[[], torch.Tensor]) -> Callable[[int], int]:
        """A callback for the fused C step: all-reduce the first `n` floats of `buffer()`;
        returns 0, or REDUCE_FAILED with the exception kept in `reduce_error`."""

        def reduce(n: int) -> int:
            try:
                self.all_reduce(buffer().view(-1)[:n])
            except BaseException as exc:  # noqa: BLE001 - C cannot take a Python exception
                self.reduce_error = exc
                return REDUCE_FAILED
            return 0

        return reduce

    def close(self) -> None:
        """Leave the group (best effort: a peer may be gone already)."""
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - shutting down anyway
                log.debug("destroy_process_group failed", exc_info=True)

"""What the scheduler needs from a grammar backend (implemented in grammar.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from plait.backend.req import Req

MaskWaiter = Callable[[], torch.Tensor | None]


class GrammarHooks(Protocol):
    """Constrained decoding as the scheduler sees it.

    - `submit(req)`: start compiling `req.params.constraint` off the scheduler thread.
    - `poll()`: requests whose grammar is ready (`req.grammar` set) and requests that failed
      (`req.finished` set to an error naming the problem).
    - `begin_fill(reqs)`: start filling the bitmask rows of the constrained `reqs` (row i is
      reqs[i]) while the forward runs; the returned waiter gives the int32 [len(reqs),
      ceil(V/32)] mask, or None when no request is constrained.
    - `accept(req, token)`: advance the matcher after sampling.
    - `jump_forward(req, max_rollback)`: append the tokens the grammar forces to
      `req.output_ids`, after removing up to `max_rollback` trailing tokens for
      retokenization; returns how many tokens were removed.
    - `close(req)`: when the tokens left are about to run out inside an unfinished
      structure (or `req` was just cut at its limit), make `req.output_ids` complete: remove
      trailing tokens and append a completion of the grammar; returns how many tokens were
      removed, or None when nothing was done.
    - `release(req)`: forget the request's matcher.
    """

    def submit(self, req: Req) -> None: ...

    def poll(self) -> tuple[list[Req], list[Req]]: ...

    def begin_fill(self, reqs: Sequence[Req]) -> MaskWaiter: ...

    def accept(self, req: Req, token: int) -> None: ...

    def jump_forward(self, req: Req, max_rollback: int) -> int: ...

    def close(self, req: Req) -> int | None: ...

    def release(self, req: Req) -> None: ...

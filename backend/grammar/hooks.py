"""What the scheduler needs from the grammar layer (`GrammarHooks`, implemented by
`GrammarBackend`), and what the grammar layer's parts need from a matcher of either grammar
backend (`Matcher`: xgrammar's `GrammarMatcher`, or `LlgMatcher` over llguidance)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from plait.backend.request.req import Req

MaskWaiter = Callable[[], torch.Tensor | None]


@dataclass(frozen=True)
class Rewrite:
    """The grammar rewrote the end of a request's output after a sampled token: the tokens
    from `kept` on are new (forced text, or a completion of the structure); whatever the
    output held there before is gone, and so is its KV. `closed`: the output was completed
    at its token limit (`close_on_length`) and the request ends. Tokens below `sent_len`
    are never rewritten: what may still change is held back from streaming (`hold_from`)."""

    kept: int
    closed: bool = False


class GrammarHooks(Protocol):
    """Constrained decoding as the scheduler sees it.

    - `submit(req)`: start compiling `req.params.constraint` off the scheduler thread.
    - `poll()`: requests whose grammar is ready (`req.grammar` set) and requests that failed
      (`req.finished` set to an error naming the problem).
    - `begin_fill(reqs)`: start filling the bitmask rows of the constrained `reqs` (row i is
      reqs[i]) while the forward runs; the returned waiter gives the int32 [len(reqs),
      ceil(V/32)] mask, or None when no request is constrained.
    - `accept(req, token)`: advance the matcher after sampling.
    - `after_sample(req)`: after the finish checks of a sampled token, let the grammar write
      what it forces (jump-forward) or, near the token limit, a completion; returns what it
      changed, or None. It also sets `req.hold_from`, the first output token that may still
      be rewritten (not emitted until the request ends or that changes).
    - `draft_masks(req, draft)`: for a speculative draft, how many of its tokens the grammar
      allows (n) and the masks of the positions after `draft[:i]`, i in 0..n (int32
      [n + 1, ceil(V/32)]); the matcher is left as it was.
    - `release(req)`: forget the request's matcher.
    - `warm_up()`: start the compile workers now, not at the first constrained request.
    - `close()`: stop the compile workers.
    """

    def submit(self, req: Req) -> None: ...

    def poll(self) -> tuple[list[Req], list[Req]]: ...

    def begin_fill(self, reqs: Sequence[Req]) -> MaskWaiter: ...

    def accept(self, req: Req, token: int) -> None: ...

    def after_sample(self, req: Req) -> Rewrite | None: ...

    def draft_masks(self, req: Req, draft: Sequence[int]) -> tuple[int, torch.Tensor]: ...

    def release(self, req: Req) -> None: ...

    def warm_up(self) -> None: ...

    def close(self) -> None: ...


class Matcher(Protocol):
    """What masks, rewrites, closing and drafts ask of a matcher, whichever the backend:
    `accept_token` (False and no change on a rejection), `rollback(n)` tokens,
    `fill_next_token_bitmask(mask, row)`, `is_completed` (the grammar may end here),
    `is_terminated` (a stop token ended it), `find_jump_forward_string`, `fork`."""

    def accept_token(self, token: int) -> bool: ...

    def rollback(self, n: int) -> object: ...

    def fill_next_token_bitmask(self, mask: torch.Tensor, index: int = 0) -> object: ...

    def is_completed(self) -> bool: ...

    def is_terminated(self) -> bool: ...

    def find_jump_forward_string(self) -> str: ...

    def fork(self) -> Matcher: ...

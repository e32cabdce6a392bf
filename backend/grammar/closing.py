"""Closing a constrained output before `max_new_tokens` runs out (`close_on_length`).

A JSON output cut at the token limit in the middle of a string is of no use to anyone. So
when few tokens are left, the engine looks up a short completion of the grammar from the
current state (`shortest_completion`) and, once the room left would soon be too small for
it, appends it and ends the request: finish_reason "length" with `closed`.

When to look: first when `CLOSE_WINDOW` tokens are left, then each time the room has halved.
At a look, the completion is appended if the room at the next look would be less than its
tokens plus `CLOSE_SLACK` (what the model may open in between); otherwise the model goes on
and the completion is kept as a fallback. If the model then opens more than the room can
close (one token can open an object with many required properties; jump-forward can write
a long forced key), or reaches the limit inside an unfinished structure, the tokens written
since the fallback's look are taken back and the fallback is written instead, provided none
of them was emitted: from a look with `HOLD_WINDOW` tokens left or fewer, the output after
the fallback's look is held back from streaming until the next look. An output that
is already complete (a regex like `[a-z]+`, text outside structural tags) is left to the
model; only if its last token leaves it incomplete is that token taken back.

A search that finds nothing ends the looks: each may take up to 100 ms of the scheduler
thread, and a structure whose completion is too long to find only grows. The request keeps
its fallback, if any. The shortest JSON completion may write the same short key twice
(`"":0,"":0` for `minProperties`); the grammar cannot reject duplicate keys, so such a
completion is not used (nor one for an output whose own keys repeat).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from plait.backend.grammar.completion import Completer, CompleterUnavailable
from plait.backend.grammar.hooks import Matcher
from plait.backend.grammar.jump_forward import Jump, Retokenizer

CLOSE_WINDOW = 256  # tokens left at the first look
CLOSE_SLACK = 4  # tokens kept in hand for what the model opens between two looks
TAIL = 8  # output tokens before a fallback's look that must be unchanged to use it
HOLD_WINDOW = 64  # from a look with this much room on, output after the fallback is held
NEVER = -1

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fallback:
    """A completion found at a look: the output length then, its last tokens, the tokens,
    and whether the output after it is held back from streaming (near the limit)."""

    at: int
    tail: tuple[int, ...]
    ids: tuple[int, ...]
    hold: bool = False


@dataclass
class CloseState:
    """One request's closing: the room at which to look next, and its fallback."""

    next_look: int = CLOSE_WINDOW
    fallback: Fallback | None = None


class Closer:
    """Decides when to close a request's structure and gives the tokens that close it."""

    def __init__(self, *, retokenizer: Retokenizer) -> None:
        self.retokenizer = retokenizer
        self.completer = Completer(token_bytes=retokenizer.token_bytes)
        self.unavailable = False  # set if xgrammar does not show its parser state

    def plan(
        self,
        matcher: Matcher,
        *,
        output: Sequence[int],
        room: int,
        state: CloseState,
        is_json: bool,
        cut: bool,
        sent: int = 0,
        start: int = 0,
    ) -> Jump | None:
        """How to end the output now (remove the last `removed` tokens, append `appended`)
        so that it is complete, or None to let the model go on. `room`: tokens the request
        may still write; `cut`: it has just reached its limit; `sent`: output tokens already
        emitted (never taken back); `start`: where the grammar's part of the output begins
        (after a reasoning section)."""
        if cut:
            return None if matcher.is_completed() else self._fall_back(output, state, sent)
        if room > state.next_look or room <= 0:
            return None
        ids = self._completion(matcher, output=output[start:], is_json=is_json)
        later = room // 2
        if ids is None:
            state.next_look = NEVER
            return None
        if len(ids) > room:
            state.next_look = NEVER
            return self._fall_back(output, state, sent)
        if not ids or later >= len(ids) + CLOSE_SLACK:
            at = len(output)
            tail = tuple(output[max(at - TAIL, 0) : at])
            state.fallback = Fallback(at, tail, tuple(ids), hold=room <= HOLD_WINDOW)
            state.next_look = max(later, 1) if room > 1 else NEVER
            return None
        state.next_look = NEVER
        return Jump(0, tuple(ids))

    def _fall_back(self, output: Sequence[int], state: CloseState, sent: int) -> Jump | None:
        """The fallback, if the output still begins as it did at its look and nothing
        after that was emitted."""
        fb = state.fallback
        if fb is None or not sent <= fb.at <= len(output):
            return None
        if tuple(output[max(fb.at - TAIL, 0) : fb.at]) != fb.tail:
            return None  # jump-forward retokenized the tokens before the look
        return Jump(len(output) - fb.at, fb.ids)

    def _completion(
        self, matcher: Matcher, *, output: Sequence[int], is_json: bool
    ) -> list[int] | None:
        """Tokens of a completion from the matcher's state, or None. A failure here is
        logged and never reaches the scheduler."""
        if self.unavailable:
            return None
        text = self.retokenizer.bytes_of(output)
        try:
            found = self.completer.complete(matcher, text=text, is_json=is_json)
            if found is None or is_json and has_duplicate_keys(text + found):
                return None
        except CompleterUnavailable as exc:
            log.warning("close_on_length is off: %s", exc)
            self.unavailable = True
            return None
        except Exception:  # noqa: BLE001 - closing is best effort; the request goes on
            log.exception("close_on_length: the completion search failed")
            return None
        return self._encode(found)

    def _encode(self, data: bytes) -> list[int]:
        """Canonical tokens for `data` when it is text the tokenizer round-trips, else one
        token per byte (the request ends here, so the seam is never read by the model)."""
        try:
            ids = self.retokenizer.encode(data.decode("utf-8"))
        except UnicodeDecodeError:
            ids = []
        if self.retokenizer.bytes_of(ids) == data:
            return ids
        return [self.completer.byte_tokens[b] for b in data]


def has_duplicate_keys(data: bytes) -> bool:
    """Whether some object in the JSON text `data` repeats a key (False if it does not
    parse, or nests too deep to parse: then there is nothing to say about its keys)."""
    seen_twice = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal seen_twice
        keys = [k for k, _ in items]
        seen_twice = seen_twice or len(set(keys)) < len(keys)
        return dict(items)

    try:
        json.loads(data, object_pairs_hook=pairs, strict=False)
    except (ValueError, RecursionError):
        return False
    return seen_twice

"""Closing a constrained output before `max_new_tokens` runs out (`close_on_length`).

A JSON output cut at the token limit in the middle of a string is of no use to anyone. So
when few tokens are left, the engine looks up a short completion of the grammar from the
current state (`shortest_completion`) and, once the room left would soon be too small for
it, appends it and ends the request: finish_reason "length" with `closed`, and an output
that parses.

When to look: first when `CLOSE_WINDOW` tokens are left, then each time the room has halved.
At a look, the completion is appended if the room at the next look would be less than its
tokens plus `CLOSE_SLACK` (what the model may open in between); otherwise the model goes on.
Each request looks at most about log2(CLOSE_WINDOW) times. An output that is already
complete (a regex like `[a-z]+`, free text with structural tags) is left to the model until
its last token, and closed as it is only if it is still complete then.

The shortest JSON completion may write the same short key twice (`"":0,"":0` for
`minProperties`); the grammar cannot reject duplicate keys, so such a completion is not
used.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import xgrammar as xgr

from plait.backend.jump_forward import Encoder
from plait.backend.shortest_completion import Completer, CompleterUnavailable

CLOSE_WINDOW = 256  # tokens left at the first look
CLOSE_SLACK = 4  # tokens kept in hand for what the model opens between two looks
NEVER = -1

log = logging.getLogger(__name__)


class Closer:
    """Decides when to close a request's structure and gives the tokens that close it."""

    def __init__(self, *, token_bytes: Sequence[bytes], encode: Encoder) -> None:
        self.token_bytes = token_bytes
        self.encode = encode
        self.completer = Completer(token_bytes=token_bytes)
        self.byte_tokens = {data[0]: i for i, data in enumerate(token_bytes) if len(data) == 1}
        self.unavailable = False  # set if xgrammar does not show its parser state

    def tokens(
        self,
        matcher: xgr.GrammarMatcher,
        *,
        output: Sequence[int],
        room: int,
        next_look: int,
        is_json: bool,
    ) -> tuple[list[int] | None, int]:
        """(tokens to append now or None, when to look next: the room at which to look).
        `room`: tokens the request may still write; `next_look`: the value returned last."""
        if room > next_look or room <= 0:
            return None, next_look
        if self.unavailable:
            return None, NEVER
        text = b"".join(self.token_bytes[t] for t in output)
        try:
            completion = self.completer.complete(matcher, text=text, is_json=is_json)
        except CompleterUnavailable as exc:
            log.warning("close_on_length is off: %s", exc)
            self.unavailable = True
            return None, NEVER
        later = room // 2
        if completion is None or is_json and has_duplicate_keys(text + completion):
            return None, later
        ids = self._encode(completion)
        if not ids:  # already complete: the model may go on (or stop) until its last token
            return ([], NEVER) if room <= 1 else (None, max(later, 1))
        if later >= len(ids) + CLOSE_SLACK:
            return None, later
        if len(ids) > room:
            return None, NEVER
        return ids, NEVER

    def _encode(self, data: bytes) -> list[int]:
        """Canonical tokens for `data` when it is text the tokenizer round-trips, else one
        token per byte (the request ends here, so the seam is never read by the model)."""
        try:
            ids = self.encode(data.decode("utf-8"))
        except UnicodeDecodeError:
            ids = []
        if b"".join(self.token_bytes[t] for t in ids) == data:
            return ids
        return [self.byte_tokens[b] for b in data]


def has_duplicate_keys(data: bytes) -> bool:
    """Whether some object in the JSON text `data` repeats a key (False if it does not
    parse: then there is nothing to say about its keys)."""
    seen_twice = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal seen_twice
        keys = [k for k, _ in items]
        seen_twice = seen_twice or len(set(keys)) < len(keys)
        return dict(items)

    try:
        json.loads(data, object_pairs_hook=pairs, strict=False)
    except ValueError:
        return False
    return seen_twice

"""Jump-forward decoding: turn text the grammar forces into tokens, retokenizing the boundary.

Appending the tokens of the forced text after the sampled ones would leave a seam the model
never sees in training (`"` + `name` where the tokenizer writes `"name`). So, as llguidance
does, the last few generated tokens are re-encoded together with the forced text; tokens that
come out different are removed (the scheduler truncates their KV) and the canonical ones
appended. The appended tail is cut back so that it ends on a complete UTF-8 character and
does not end in text that could still merge with what the model writes next.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from plait.backend.grammar.regex_fsm import utf8_complete_len

RETOKENIZE_WINDOW = 4
Encoder = Callable[[str], list[int]]


@dataclass(frozen=True)
class Jump:
    """Remove the last `removed` output tokens, then append `appended`."""

    removed: int
    appended: tuple[int, ...]


class Retokenizer:
    """Canonical tokens for (recent output + forced text), given the vocabulary's bytes."""

    def __init__(
        self,
        *,
        token_bytes: Sequence[bytes],
        encode: Encoder,
        window: int = RETOKENIZE_WINDOW,
    ) -> None:
        self.token_bytes = token_bytes
        self.encode = encode
        self.window = window
        self.prefixes = proper_prefixes(token_bytes)
        self.max_token_len = max((len(t) for t in token_bytes), default=1)

    def plan(self, *, tail: Sequence[int], forced: str, room: int) -> Jump | None:
        """How to append `forced` after an output ending in `tail` (the tokens that may be
        removed) when `room` more tokens fit; None when nothing would be gained."""
        window = self._window(tail)
        old = self.bytes_of(window)
        new = old + forced.encode("utf-8")
        try:
            ids = self.encode(new.decode("utf-8"))
        except UnicodeDecodeError:
            return None
        if self.bytes_of(ids) != new:
            return None  # the tokenizer does not round-trip this text
        keep = _common_prefix(ids, window)
        while 0 < keep < len(window) and _starts_mid_char(self.token_bytes[window[keep]]):
            keep -= 1
        removed = len(window) - keep
        appended = self._trim(ids[keep:][: max(room + removed, 0)])
        gained = len(self.bytes_of(appended)) - len(self.bytes_of(window[keep:]))
        return Jump(removed, tuple(appended)) if gained > 0 else None

    def _window(self, tail: Sequence[int]) -> list[int]:
        """The last tokens of `tail` (at most `window`), starting on a character boundary."""
        window = list(tail[len(tail) - min(self.window, len(tail)) :])
        while window and _starts_mid_char(self.token_bytes[window[0]]):
            window.pop(0)
        return window

    def _trim(self, ids: list[int]) -> list[int]:
        """Drop the longest run of final tokens whose text could still grow into a longer
        token, then any final tokens that end inside a UTF-8 character."""
        ids = ids[: self._mergeable_start(ids)]
        while ids and utf8_complete_len(self.bytes_of(ids[-4:])) != len(self.bytes_of(ids[-4:])):
            ids = ids[:-1]
        return ids

    def _mergeable_start(self, ids: list[int]) -> int:
        start, suffix = len(ids), b""
        for i in range(len(ids) - 1, -1, -1):
            suffix = self.token_bytes[ids[i]] + suffix
            if len(suffix) >= self.max_token_len:
                break
            if suffix in self.prefixes:
                start = i
        return start

    def bytes_of(self, ids: Sequence[int]) -> bytes:
        return b"".join(self.token_bytes[t] for t in ids)


def proper_prefixes(token_bytes: Sequence[bytes]) -> frozenset[bytes]:
    """Every non-empty proper prefix of every token's bytes."""
    return frozenset(tok[:i] for tok in token_bytes for i in range(1, len(tok)))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _starts_mid_char(data: bytes) -> bool:
    return bool(data) and data[0] & 0xC0 == 0x80

"""The grammar of a reasoning model's request applies only after its reasoning section.

While the output is inside the reasoning (`plait.backend.text.reasoning.starts_in_reasoning`), the
request's matcher is left alone: its mask row allows every token and sampled tokens are not
accepted. The gate watches the output's bytes for the end marker; once it is complete the
grammar applies from the next token. A token that completes the marker and carries text
after it (`>{` with a marker spelled in several tokens) is replaced by the encoding of its
text up to the marker's end, so the grammar sees the whole answer. With
`max_reasoning_tokens` the gate writes the end marker itself once the reasoning is that long.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from plait.backend.grammar.jump_forward import Encoder
from plait.backend.request.req import Req
from plait.backend.text.reasoning import (
    PROMPT_TAIL_TOKENS,
    ReasoningFormat,
    request_format,
    starts_in_reasoning,
)


@dataclass
class GateEdit:
    """What the gate changes in an output: the tokens from `kept` on are new."""

    kept: int
    appended: list[int]


class ReasoningGate:
    """One request's reasoning section: open until the end marker has been generated."""

    def __init__(
        self, *, fmt: ReasoningFormat, token_bytes: Sequence[bytes], limit: int | None
    ) -> None:
        self.end = fmt.end.encode()
        self.token_bytes = token_bytes
        self.limit = limit
        self.open = True
        self.tokens = 0
        self.seen = b""
        self.after = 0  # bytes of the last token that came after the marker

    def feed(self, token: int) -> None:
        """Advance over a sampled token while the section is open."""
        window = self.seen + self.token_bytes[token]
        at = window.find(self.end)
        self.tokens += 1
        if at < 0:
            self.seen = window[max(len(window) - len(self.end) + 1, 0) :]
            return
        self.open = False
        self.after = len(window) - (at + len(self.end))

    def edit(self, out: list[int], *, encode: Encoder, room: int) -> GateEdit | None:
        """After a sampled token: cut the token that closed the section at the marker's
        end, or write the marker once the section reached its limit; None if nothing.
        `room`: tokens the output may still grow by (an edit that does not fit is not made:
        a cut token stays whole, a marker is not written)."""
        if not self.open and self.after:
            return self._cut(out, encode=encode, room=room)
        if self.open and self.limit is not None and self.tokens >= self.limit:
            self.limit = None  # decided once
            marker = encode(self.end.decode())
            if len(marker) > room:
                return None
            self.open = False
            return GateEdit(len(out), marker)
        return None

    def _cut(self, out: list[int], *, encode: Encoder, room: int) -> GateEdit | None:
        data, after = self.token_bytes[out[-1]], self.after
        self.after = 0
        try:
            head = encode(data[: len(data) - after].decode())
        except UnicodeDecodeError:  # a character cut in two: the grammar starts after it
            return None
        return GateEdit(len(out) - 1, head) if len(head) - 1 <= room else None


def make_gate(
    req: Req, *, parser: str | None, token_bytes: Sequence[bytes]
) -> ReasoningGate | None:
    """The request's gate, or None when its grammar applies from the first token (no
    reasoning format, or a prompt that closed the reasoning section itself)."""
    fmt = request_format(parser, reasoning=req.params.reasoning)
    if fmt is None:
        return None
    tail = req.origin_input_ids[-PROMPT_TAIL_TOKENS:]
    prompt = b"".join(token_bytes[t] for t in tail).decode(errors="replace")
    if not starts_in_reasoning(fmt, prompt):
        return None
    return ReasoningGate(fmt=fmt, token_bytes=token_bytes, limit=req.params.max_reasoning_tokens)

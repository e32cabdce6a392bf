"""Incremental detokenization: token ids in, text increments out, UTF-8 safe, stop-trimmed.

A byte-level BPE token may hold part of a multi-byte character; decoding it alone gives
U+FFFD. Each request keeps a small window of ids (prefix_offset..read_offset) and emits new
text only once it no longer ends in a partial character. With stop strings, the last
`max(len(stop)) - 1` characters are held back until the request ends, so a stop string is
never streamed and then retracted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from plait.backend.messages import ReqOutput, ReqStrOut

REPLACEMENT = "\ufffd"
DecodeFn = Callable[[list[int], bool], str]


@dataclass
class DecodeState:
    """Per-request detokenization window."""

    ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0
    text: str = ""  # all text decoded so far (not yet trimmed)
    emitted: int = 0  # characters of `text` already sent


class Detokenizer:
    """Keeps one DecodeState per request id; `process` turns ReqOutputs into ReqStrOuts."""

    def __init__(self, *, decode: DecodeFn) -> None:
        self.decode = decode
        self.states: dict[str, DecodeState] = {}
        self.options: dict[str, tuple[bool, tuple[str, ...]]] = {}

    def process(self, outputs: list[ReqOutput]) -> list[ReqStrOut]:
        return [ReqStrOut(out=o, text_delta=self.step(o)) for o in outputs]

    def step(self, out: ReqOutput) -> str:
        """Text newly available for `out.rid` (all remaining text when it finishes)."""
        if out.detok_options is not None:
            opts = out.detok_options
            self.options[out.rid] = (opts.skip_special_tokens, opts.stop)
        skip, stop = self.options.get(out.rid, (True, ()))
        state = self.states.setdefault(out.rid, DecodeState())
        if out.rollback:
            self._rollback(state, out.rollback, skip)
        state.ids.extend(out.new_ids)
        state.text += self._advance(state, skip, final=out.finish is not None)
        if out.finish is not None:
            del self.states[out.rid]
            self.options.pop(out.rid, None)
            text = _trim_stop(state.text, out.finish.matched, stop)
            return text[state.emitted :]
        visible = len(state.text) - (max(map(len, stop)) - 1 if stop else 0)
        delta = state.text[state.emitted : max(visible, state.emitted)]
        state.emitted += len(delta)
        return delta

    def _advance(self, state: DecodeState, skip: bool, *, final: bool) -> str:
        prefix = self.decode(state.ids[state.prefix_offset : state.read_offset], skip)
        full = self.decode(state.ids[state.prefix_offset :], skip)
        if len(full) <= len(prefix) or (full.endswith(REPLACEMENT) and not final):
            return ""
        state.prefix_offset, state.read_offset = state.read_offset, len(state.ids)
        return full[len(prefix) :]

    def _rollback(self, state: DecodeState, n: int, skip: bool) -> None:
        """Jump-forward replaced the last `n` ids: re-decode from scratch (text is unchanged
        up to what was emitted, because retokenization preserves the string)."""
        state.ids = state.ids[: len(state.ids) - n]
        state.text = self.decode(state.ids, skip)
        state.prefix_offset = state.read_offset = len(state.ids)
        if not state.text.endswith(REPLACEMENT):
            return
        state.prefix_offset = state.read_offset = max(0, len(state.ids) - 4)
        state.text = self.decode(state.ids[: state.read_offset], skip)

    def forget(self, rid: str) -> None:
        self.states.pop(rid, None)
        self.options.pop(rid, None)


def _trim_stop(text: str, matched: int | str | None, stops: tuple[str, ...]) -> str:
    """Cut the text at the first stop string it contains (the stop string excluded)."""
    if not isinstance(matched, str):
        return text
    cuts = [text.find(s) for s in stops if s in text]
    return text[: min(cuts)] if cuts else text

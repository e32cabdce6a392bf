"""Incremental detokenization: token ids in, text increments out, UTF-8 safe, stop-trimmed.

A byte-level BPE token may hold part of a multi-byte character; decoding it alone gives
U+FFFD. Each request keeps a small window of ids (prefix_offset..read_offset) and emits new
text only once it no longer ends in a partial character. With stop strings or regexes, the
last characters in which a stop could begin (`hold_back_chars`) are held back until the request
ends, so a stop is never streamed and then retracted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from plait.backend.messages import DetokOptions, ReqOutput, ReqStrOut
from plait.backend.stop_conditions import StopRegexTimeout, Tail, first_stop, hold_back_chars

REPLACEMENT = "\ufffd"
DEFAULT_OPTIONS = DetokOptions(skip_special_tokens=True, stop=())
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
        self.options: dict[str, tuple[DetokOptions, int]] = {}  # with its hold-back

    def process(self, outputs: list[ReqOutput]) -> list[ReqStrOut]:
        return [ReqStrOut(out=o, text_delta=self.step(o)) for o in outputs]

    def step(self, out: ReqOutput) -> str:
        """Text newly available for `out.rid` (all remaining text when it finishes)."""
        if out.detok_options is not None:
            opts = out.detok_options
            self.options[out.rid] = (opts, hold_back_chars(opts.stop, opts.stop_regex))
        opts, hold = self.options.get(out.rid, (DEFAULT_OPTIONS, 0))
        skip = opts.skip_special_tokens
        state = self.states.setdefault(out.rid, DecodeState())
        if out.rollback:
            self._rollback(state, out.rollback, skip)
        state.ids.extend(out.new_ids)
        state.text += self._advance(state, skip, final=out.finish is not None)
        if out.finish is not None:
            del self.states[out.rid]
            self.options.pop(out.rid, None)
            text = _trim_stop(state.text, out.finish.matched, opts)
            return text[state.emitted :]
        visible = len(state.text) - hold
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


def _trim_stop(text: str, matched: int | str | None, opts: DetokOptions) -> str:
    """Cut the text before its first stop string or regex match (`no_stop_trim`: leave it
    whole, as SGLang does)."""
    if not isinstance(matched, str) or opts.no_stop_trim:
        return text
    try:
        hit = first_stop(Tail(text), opts.stop, opts.stop_regex)
    except StopRegexTimeout:  # the scheduler reported it; nothing to cut by
        return text
    return text if hit is None else text[: hit.start]

"""Incremental detokenization: token ids in, text increments out, UTF-8 safe, stop-trimmed.

A byte-level BPE token may hold part of a multi-byte character; decoding it alone gives
U+FFFD. Each request keeps a small window of ids (prefix_offset..read_offset) and emits new
text only once it no longer ends in a partial character. With stop strings or regexes, the
last characters in which a stop could begin (`DetokOptions.hold_chars`) are held back until
the request ends, so a stop is never streamed and then retracted; the scheduler, which found
the stop, says how much of the end the final text leaves out (`FinishReason.trim_chars`).
Emitted ids never change (the grammar holds back what it may still rewrite).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from plait.backend.request.messages import DetokOptions, ReqOutput, ReqStrOut
from plait.backend.text.tokenizer import DecodeFn

REPLACEMENT = "\ufffd"
DEFAULT_OPTIONS = DetokOptions(skip_special_tokens=True)

log = logging.getLogger(__name__)


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
        self.options: dict[str, DetokOptions] = {}

    def process(self, outputs: list[ReqOutput]) -> list[ReqStrOut]:
        """Text increments of a batch; a request whose text cannot be decoded gets an empty
        increment (and loses its state), the others are not affected."""
        return [ReqStrOut(out=o, text_delta=self._guarded_step(o)) for o in outputs]

    def _guarded_step(self, out: ReqOutput) -> str:
        try:
            return self.step(out)
        except Exception:  # noqa: BLE001 - one bad decode must not lose the others
            log.exception("detokenizing %s failed", out.rid)
            self.forget(out.rid)
            return ""

    def step(self, out: ReqOutput) -> str:
        """Text newly available for `out.rid` (all remaining text when it finishes)."""
        if out.detok_options is not None:
            self.options[out.rid] = out.detok_options
        opts = self.options.get(out.rid, DEFAULT_OPTIONS)
        state = self.states.setdefault(out.rid, DecodeState())
        state.ids.extend(out.new_ids)
        final = out.finish is not None
        state.text += self._advance(state, opts.skip_special_tokens, final=final)
        if out.finish is not None:
            self.forget(out.rid)
            trim = out.finish.trim_chars
            text = state.text[: max(len(state.text) - trim, 0)] if trim else state.text
            return text[state.emitted :]
        visible = len(state.text) - opts.hold_chars
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

    def forget(self, rid: str) -> None:
        self.states.pop(rid, None)
        self.options.pop(rid, None)

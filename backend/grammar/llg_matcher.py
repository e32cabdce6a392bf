"""llguidance behind the matcher interface the rest of the grammar package uses.

`LlgMatcher` wraps one `llguidance.LLMatcher` with the calls xgrammar's `GrammarMatcher`
answers (accept, rollback, fill a bitmask row, complete / terminated, forced text, fork), so
that masks, rewrites, closing and drafts drive either backend alike. Two differences are
taken care of here:

- llguidance enters a permanent error state when it consumes a token its grammar rejects;
  `accept_token` tries the token first, so a rejection leaves the matcher as it was;
- a request's stop tokens (its EOS and `stop_token_ids`) are the adapter's: allowed in the
  mask once the grammar may end, accepted as the end of the output, rolled back like any
  token. llguidance's own EOS bits are cleared from its masks.

`LlgCompiler` turns a built llguidance grammar into a template matcher (each request gets a
copy) against the model's `LLTokenizer`, with `LLParserLimits` that bound each mask.
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance as llg
import numpy as np
import torch

from plait.backend.grammar.errors import error_line
from plait.backend.grammar.regex_fsm import utf8_complete_len

# verbose_errors off: messages would carry the parser state and the whole grammar
LIMITS = llg.LLParserLimits(verbose_errors=False)
_STOP = -1  # a stop token in the history


class LlgMatcher:
    """One request's llguidance matcher with per-request stop tokens (module docstring)."""

    def __init__(
        self, matcher: llg.LLMatcher, *, stops: Sequence[int], eos: Sequence[int], words: int
    ) -> None:
        self.inner = matcher
        self.stops = tuple(stops)
        self.eos = tuple(eos)  # llguidance's own end tokens, cleared from its masks
        self.words = words
        self.terminated = False
        self.history: list[int] = []

    # --- advancing ----------------------------------------------------------------------
    def accept_token(self, token: int) -> bool:
        """Advance by `token`; False (state unchanged) when the grammar rejects it."""
        if self.terminated:
            return False
        if token in self.stops:
            if not self.inner.is_accepting():
                return False
            self.terminated = True
            self.history.append(_STOP)
            return True
        if self.inner.try_consume_tokens([token]) != 1:
            return False
        self.history.append(token)
        return True

    def rollback(self, n: int) -> None:
        """Forget the last `n` accepted tokens."""
        if n <= 0:
            return
        popped = self.history[len(self.history) - n :]
        del self.history[len(self.history) - n :]
        if _STOP in popped:
            self.terminated = False
        consumed = sum(t != _STOP for t in popped)
        if consumed and not self.inner.rollback(consumed):
            raise RuntimeError(f"llguidance could not roll back: {self.inner.get_error()}")

    def fork(self) -> LlgMatcher:
        """An independent copy (the completion search explores on forks)."""
        copy = LlgMatcher(self.inner.deep_copy(), stops=self.stops, eos=self.eos, words=self.words)
        copy.terminated = self.terminated
        copy.history = list(self.history)
        return copy

    # --- state --------------------------------------------------------------------------
    def is_completed(self) -> bool:
        """The grammar may end here (a stop token would be accepted)."""
        return self.terminated or bool(self.inner.is_accepting())

    def is_terminated(self) -> bool:
        """A stop token ended the output."""
        return self.terminated

    def find_jump_forward_string(self) -> str:
        """The text every continuation starts with (whole UTF-8 characters)."""
        forced = self.forced_bytes()
        return forced[: utf8_complete_len(forced)].decode("utf-8", errors="ignore")

    def forced_bytes(self) -> bytes:
        """The bytes every continuation starts with."""
        return b"" if self.terminated else bytes(self.inner.compute_ff_bytes())

    def state_digest(self, mask: torch.Tensor) -> int:
        """A hash of llguidance's whole next-token mask (left in `mask`'s row 0, before the
        stop tokens are set) and whether the grammar may end: it stands for the parser state
        that llguidance does not show (see `completion`; a collision could only merge two
        search states, which never makes an answer wrong)."""
        row = mask[0]
        self.inner.unsafe_compute_mask_ptr(row.data_ptr(), self.words * 4)
        return hash((row.numpy().tobytes(), self.is_completed()))

    # --- masks --------------------------------------------------------------------------
    def fill_next_token_bitmask(self, mask: torch.Tensor, index: int = 0) -> bool:
        """Fill row `index` of the int32 CPU bitmask with the allowed tokens."""
        row = mask[index]
        if self.terminated:
            row.zero_()
            return True
        self.inner.unsafe_compute_mask_ptr(row.data_ptr(), self.words * 4)
        self.fix_row(mask.numpy(), index)
        return True

    def fix_row(self, bits: np.ndarray, index: int) -> None:
        """After llguidance filled row `index` of `bits`: its own EOS out, the request's stop
        tokens in where the grammar may end and out elsewhere; raises when the matcher has
        failed (a limit was hit)."""
        if self.inner.is_error():
            raise RuntimeError(f"llguidance: {error_line(self.inner.get_error())}")
        row = bits[index].view(np.uint32)
        for token in self.eos + self.stops:  # a stop token is never text, as in xgrammar
            row[token >> 5] &= ~np.uint32(1 << (token & 31))
        if self.inner.is_accepting():
            for token in self.stops:
                row[token >> 5] |= np.uint32(1 << (token & 31))


class LlgCompiler:
    """Template matchers for built llguidance grammars, against one `LLTokenizer`."""

    def __init__(self, tokenizer: llg.LLTokenizer, *, stops: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.eos = tuple(tokenizer.eos_tokens)
        self.default_stops = tuple(stops)
        self.words = (tokenizer.vocab_size + 31) // 32

    def compile(self, grammar: str) -> llg.LLMatcher:
        """A fresh matcher of `grammar` (the template each request copies); raises ValueError
        with llguidance's message when it does not compile."""
        matcher = llg.LLMatcher(self.tokenizer, grammar, log_level=0, limits=LIMITS)
        if matcher.is_error():
            raise ValueError(error_line(matcher.get_error()))
        return matcher

    def matcher(self, template: llg.LLMatcher, stops: Sequence[int] | None) -> LlgMatcher:
        chosen = tuple(stops) if stops is not None else self.default_stops
        return LlgMatcher(template.deep_copy(), stops=chosen, eos=self.eos, words=self.words)

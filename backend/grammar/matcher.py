"""One constrained request's grammar state: its matcher (xgrammar's `GrammarMatcher`, or
llguidance's behind `LlgMatcher`, which answers the same calls: `Matcher`), the regex cursor
that finds forced text for regex constraints, and its closing state."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import xgrammar as xgr

from plait.backend.grammar.closing import CloseState
from plait.backend.grammar.compiler import CompiledConstraint
from plait.backend.grammar.hooks import Matcher
from plait.backend.grammar.jump_forward import Jump
from plait.backend.grammar.keys import LLGUIDANCE
from plait.backend.grammar.reasoning_gate import ReasoningGate
from plait.backend.grammar.regex_fsm import RegexCursor
from plait.backend.grammar.vocab import Vocab

JSON_KINDS = frozenset({"json_schema", "json_object"})


def new_matcher(compiled: CompiledConstraint, *, stops: list[int] | None, vocab: Vocab) -> Matcher:
    """A fresh matcher of `compiled` ending on `stops` (None: the vocabulary's stop tokens)."""
    if compiled.backend == LLGUIDANCE:
        return vocab.llg_compiler.matcher(compiled.grammar, stops)
    matcher: Matcher = xgr.GrammarMatcher(compiled.grammar, override_stop_tokens=stops)
    return matcher


class RequestGrammar:
    """A request's matcher (and, for regex constraints, its DFA cursor), advanced token by
    token; `token_bytes` maps token ids to their bytes. `gate`: the reasoning section the
    grammar waits out (None: it applies from the first token); `start`: the first output
    token the matcher accepted (rewrites never reach before it)."""

    def __init__(
        self,
        compiled: CompiledConstraint,
        *,
        matcher: Matcher,
        token_bytes: Sequence[bytes],
    ) -> None:
        self.compiled = compiled
        self.matcher = matcher
        self.cursor = RegexCursor(compiled.regex_fsm) if compiled.regex_fsm else None
        self.closing = CloseState()
        self.token_bytes = token_bytes
        self.gate: ReasoningGate | None = None
        self.start = 0

    @property
    def waiting(self) -> bool:
        """The output is still inside the reasoning section: no mask, no accepting."""
        return self.gate is not None and self.gate.open

    @property
    def is_json(self) -> bool:
        return self.compiled.key.kind in JSON_KINDS

    def is_terminated(self) -> bool:
        return bool(self.matcher.is_terminated())

    def accept(self, token: int) -> bool:
        """Advance by one token; False (state unchanged) if the grammar rejects it."""
        if not self.matcher.accept_token(token):
            return False
        if self.cursor is not None:
            self.cursor.advance(self.token_bytes[token])
        return True

    def rollback(self, n: int) -> None:
        if n > 0:
            self.matcher.rollback(n)
            if self.cursor is not None:
                self.cursor.rollback(n)

    def fill_draft(self, draft: Sequence[int], mask: torch.Tensor) -> int:
        """Fill mask row i with the tokens allowed after `draft[:i]`, up to the first draft
        token the grammar rejects (or the end of the grammar); returns how many draft tokens
        it allows (`mask` rows 0..that filled; all allowed after the end). The matcher ends
        where it began."""
        n = 0
        try:
            while True:
                if self.is_terminated():
                    mask[n] = -1
                    break
                self.matcher.fill_next_token_bitmask(mask, n)
                if n == len(draft) or not self.accept(draft[n]):
                    break
                n += 1
        finally:
            self.rollback(n)
        return n

    def forced_text(self) -> str:
        """The text every continuation starts with: the regex DFA's chain of single
        transitions, or the matcher's jump-forward string."""
        if self.cursor is not None and self.cursor.state is not None:
            return self.cursor.forced()
        return str(self.matcher.find_jump_forward_string())

    def apply(self, out: list[int], jump: Jump) -> bool:
        """Replace the last `jump.removed` tokens of `out` by `jump.appended`, matcher
        included; False (nothing changed) if the grammar rejects them."""
        removed = out[len(out) - jump.removed :] if jump.removed else []
        if not self._replace(removed=removed, appended=jump.appended):
            return False
        del out[len(out) - len(removed) :]
        out.extend(jump.appended)
        return True

    def _replace(self, *, removed: list[int], appended: Sequence[int]) -> bool:
        """Roll the matcher back over `removed` and accept `appended`; on a rejection
        restore the previous state and return False."""
        self.rollback(len(removed))
        for i, token in enumerate(appended):
            if not self.accept(token):
                self.rollback(i)
                for old in removed:
                    self.accept(old)
                return False
        return True

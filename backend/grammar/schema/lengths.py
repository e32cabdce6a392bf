"""`minLength`/`maxLength` beside a `pattern`, enforced through the pattern's automaton.

xgrammar applies a string's `pattern` and ignores its length bounds. The pattern's DFA
(interegular) tells which lengths it can match:

- when every match already has a length inside the bounds, the bounds are implied and are
  dropped (`^[A-Z]{2}-[0-9]{4}$` with `maxLength: 7`);
- otherwise the product of the DFA with a length counter is written back as one regular
  expression, which replaces the pattern. With a `maxLength` the product is acyclic
  (`^[a-z]+$`, 2..4 -> `^[a-z](?:[a-z](?:...)?)$`); with only a `minLength` the counter stops
  at the bound, and from there on the expression is the DFA's own language from the state
  reached, found by state elimination (`^[a-z]+$`, 3.. -> `^[a-z][a-z][a-z](?:[a-z])*$`).
  The expression may not exceed `MAX_REGEX_CHARS` (a pattern whose product branches too much
  keeps its length keywords, and their warning).
"""

from __future__ import annotations

import functools
from typing import Any

from interegular.fsm import FSM, anything_else

from plait.backend.grammar.schema.automata import (
    MAX_REGEX_CHARS,
    TooLarge,
    char_class,
    dfa,
    language,
    live_states,
    match_lengths,
    moves,
)

MAX_LENGTH_BOUND = 256  # a length bound above this is not expanded into the pattern


def lengths_into_pattern(node: dict[str, Any]) -> dict[str, Any]:
    """`node` with its length bounds folded into its pattern where that is exact; else as is."""
    pattern, lo, hi = node.get("pattern"), node.get("minLength", 0), node.get("maxLength")
    if not isinstance(pattern, str) or "format" in node or not _bounds_ok(lo, hi):
        return node
    if ("minLength" not in node and hi is None) or max(lo, hi or 0) > MAX_LENGTH_BOUND:
        return node
    folded = _folded(pattern, lo, hi)
    if folded is None:
        return node
    rest = {k: v for k, v in node.items() if k not in ("minLength", "maxLength")}
    return rest if folded == pattern else {**rest, "pattern": folded}


@functools.lru_cache(maxsize=256)  # a schema repeats its (format) patterns field after field
def _folded(pattern: str, lo: int, hi: int | None) -> str | None:
    """The pattern whose matches are `pattern`'s of length lo..hi (`pattern` itself when
    every match fits), or None where that cannot be built exactly and in bounds."""
    fsm = dfa(pattern)
    if fsm is None:
        return None
    shortest, longest = match_lengths(fsm)
    fits_above = shortest is not None and lo <= shortest
    if fits_above and (hi is None or (longest is not None and longest <= hi)):
        return pattern  # every match has an allowed length
    try:
        body = _Product(fsm, lo, hi).expression(fsm.initial, 0)
    except (TooLarge, RecursionError):
        return None
    return None if body is None else f"^{body}$"


def _bounds_ok(lo: object, hi: object) -> bool:
    """Non-negative integer bounds, lo <= hi."""
    if not isinstance(lo, int) or isinstance(lo, bool) or lo < 0:
        return False
    return hi is None or (isinstance(hi, int) and not isinstance(hi, bool) and hi >= lo)


class _Product:
    """The DFA times a length counter (lengths lo..hi; hi None: unbounded), written as a
    regular expression."""

    def __init__(self, fsm: FSM, lo: int, hi: int | None) -> None:
        self.fsm, self.lo, self.hi = fsm, lo, hi
        self.live = live_states(fsm)
        self.explicit = {c for c in fsm.alphabet if c is not anything_else}
        self.memo: dict[tuple[int, int], str | None] = {}

    def expression(self, state: Any, length: int) -> str | None:
        """The expression of what may follow from `state` after `length` characters, or
        None when nothing can."""
        key = (state, length)
        if key not in self.memo:
            self.memo[key] = self._build(state, length)
        return self.memo[key]

    def _build(self, state: Any, length: int) -> str | None:
        if self.hi is None and length == self.lo:
            return self._language(state)
        ends = state in self.fsm.finals and length >= self.lo
        parts = []
        for target, chars in self._moves(state).items():
            below = self.hi is None or length < self.hi
            rest = self.expression(target, length + 1) if below else None
            if rest is not None:
                parts.append(char_class(chars, self.explicit) + rest)
        if sum(map(len, parts)) > MAX_REGEX_CHARS:
            raise TooLarge
        if not parts:
            return "" if ends else None
        body = parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"
        return f"(?:{body}|)" if ends else body  # not `?`: see automata.py

    def _language(self, state: Any) -> str | None:
        """The DFA's own language from `state` (automata.language, by state elimination)."""
        return language(self.fsm, state)

    def _moves(self, state: Any) -> dict[int, list[Any]]:
        return moves(self.fsm, state, self.live)

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
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

import interegular
from interegular.fsm import FSM, anything_else

from plait.backend.grammar.schema.utils import pattern_shape

MAX_REGEX_CHARS = 4000
MAX_LENGTH_BOUND = 256  # a length bound above this is not expanded into the pattern
MAX_ELIMINATED_STATES = 48  # DFAs larger than this keep an unbounded minLength (warned)
LOOKAROUND = re.compile(r"\(\?<?[=!]")
_CLASS_SPECIAL = set("\\]^-[")


class _TooLarge(Exception):
    """The product expression would pass `MAX_REGEX_CHARS`."""


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
    fsm = _dfa(pattern)
    if fsm is None:
        return None
    shortest, longest = match_lengths(fsm)
    fits_above = shortest is not None and lo <= shortest
    if fits_above and (hi is None or (longest is not None and longest <= hi)):
        return pattern  # every match has an allowed length
    try:
        body = _Product(fsm, lo, hi).expression(fsm.initial, 0)
    except (_TooLarge, RecursionError):
        return None
    return None if body is None else f"^{body}$"


def _bounds_ok(lo: object, hi: object) -> bool:
    """Non-negative integer bounds, lo <= hi."""
    if not isinstance(lo, int) or isinstance(lo, bool) or lo < 0:
        return False
    return hi is None or (isinstance(hi, int) and not isinstance(hi, bool) and hi >= lo)


def _dfa(pattern: str) -> FSM | None:
    """The DFA of a pattern anchored at both ends only (as the rewrite leaves them)."""
    shape = pattern_shape(pattern)
    if shape.inner_anchors or not (shape.starts and shape.ends) or LOOKAROUND.search(pattern):
        return None
    try:
        return interegular.parse_pattern(pattern[1:-1]).to_fsm()
    except Exception:  # noqa: BLE001 - interegular raises many types for unsupported syntax
        return None


def match_lengths(fsm: FSM) -> tuple[int | None, int | None]:
    """(shortest, longest) length of a match; longest None when unbounded, both None when
    the pattern matches nothing."""
    live = _live_states(fsm)
    if fsm.initial not in live:
        return None, None
    longest: dict[int, int | None] = {}
    return _shortest(fsm, live), _longest(fsm, fsm.initial, live, longest, set())


def _live_states(fsm: FSM) -> set[int]:
    """States from which a final state can be reached."""
    live: set[int] = set(fsm.finals)
    changed = True
    while changed:
        changed = False
        for state, moves in fsm.map.items():
            if state not in live and any(t in live for t in moves.values()):
                live.add(state)
                changed = True
    return live


def _shortest(fsm: FSM, live: set[int]) -> int:
    frontier, seen, steps = {fsm.initial}, {fsm.initial}, 0
    while not frontier & set(fsm.finals):
        frontier = {
            t for s in frontier for t in (fsm.map.get(s) or {}).values() if t in live
        } - seen
        seen |= frontier
        steps += 1
    return steps


def _longest(
    fsm: FSM, state: Any, live: set[int], memo: dict[int, int | None], path: set[int]
) -> int | None:
    if state in path:
        return None  # a cycle on the way to a final state: unbounded
    if state not in memo:
        path.add(state)
        best: int | None = 0 if state in fsm.finals else -1
        for target in (fsm.map.get(state) or {}).values():
            if target in live and best is not None:
                sub = _longest(fsm, target, live, memo, path)
                best = None if sub is None else max(best, sub + 1)
        path.discard(state)
        memo[state] = best
    return memo[state]


class _Product:
    """The DFA times a length counter (lengths lo..hi; hi None: unbounded), written as a
    regular expression."""

    def __init__(self, fsm: FSM, lo: int, hi: int | None) -> None:
        self.fsm, self.lo, self.hi = fsm, lo, hi
        self.live = _live_states(fsm)
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
                parts.append(_char_class(chars, self.explicit) + rest)
        if sum(map(len, parts)) > MAX_REGEX_CHARS:
            raise _TooLarge
        if not parts:
            return "" if ends else None
        body = parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"
        return f"(?:{body})?" if ends else body

    def _language(self, state: Any) -> str | None:
        """The DFA's language from `state` by state elimination: edges between live states
        (plus a start and an end), each state removed in turn by joining its ins to its outs
        through its loop."""
        if len(self.live) > MAX_ELIMINATED_STATES:
            raise _TooLarge
        edges: dict[tuple[Any, Any], str] = {(_START, state): ""}
        for source in self.live:
            if source in self.fsm.finals:
                edges[(source, _END)] = ""
            for target, chars in self._moves(source).items():
                edges[(source, target)] = _char_class(chars, self.explicit)
        degree = Counter(end for edge in edges for end in edge)
        for k in sorted(self.live, key=degree.__getitem__):  # fewest edges first
            loop = edges.pop((k, k), None)
            star = f"(?:{loop})*" if loop else ""
            ins = [(i, r) for (i, j), r in edges.items() if j == k]
            outs = [(j, r) for (i, j), r in edges.items() if i == k]
            edges = {e: r for e, r in edges.items() if k not in e}
            for i, first in ins:
                for j, last in outs:
                    _union(edges, (i, j), first + star + last)
        return edges.get((_START, _END))

    def _moves(self, state: Any) -> dict[int, list[Any]]:
        """Target -> the characters (or anything_else) leading there."""
        by_target: dict[int, list[Any]] = {}
        moves = self.fsm.map.get(state) or {}
        for char, index in self.fsm.alphabet.items():
            target = moves.get(index)
            if target is not None and target in self.live:
                by_target.setdefault(target, []).append(char)
        return by_target


_START, _END = object(), object()  # the state-elimination graph's own ends


def _union(edges: dict[tuple[Any, Any], str], edge: tuple[Any, Any], expr: str) -> None:
    """Add `expr` as an alternative on `edge`; too long an expression ends the rewrite."""
    old = edges.get(edge)
    if old is None or old == expr:
        joined = expr
    elif "" in (old, expr):
        joined = f"(?:{old or expr})?"
    else:
        joined = f"(?:{old}|{expr})"
    if len(joined) > MAX_REGEX_CHARS:
        raise _TooLarge
    edges[edge] = joined


def _char_class(chars: Iterable[Any], explicit: set[str]) -> str:
    """A character class for `chars` (anything_else: every character not in `explicit`)."""
    chars = list(chars)
    chosen = {c for c in chars if c is not anything_else}
    if anything_else not in chars:
        return "[" + _ranges(chosen) + "]"
    excluded = explicit - chosen
    return "[^" + _ranges(excluded) + "]" if excluded else "[\\s\\S]"


def _ranges(chars: set[str]) -> str:
    """Class text for a set of characters, consecutive runs written as ranges."""
    codes, out, i = sorted(ord(c) for c in chars), [], 0
    while i < len(codes):
        j = i
        while j + 1 < len(codes) and codes[j + 1] == codes[j] + 1:
            j += 1
        first, last = _escape(chr(codes[i])), _escape(chr(codes[j]))
        out.append(first if i == j else f"{first}-{last}" if j > i + 1 else first + last)
        i = j + 1
    return "".join(out)


def _escape(char: str) -> str:
    if char in _CLASS_SPECIAL:
        return "\\" + char
    if ord(char) < 0x20 or ord(char) == 0x7F:
        return f"\\x{ord(char):02x}"
    return char

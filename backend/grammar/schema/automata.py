"""Patterns as automata and back: a pattern's DFA (interegular), the lengths it matches, its
complement, and a DFA written back as one regular expression by state elimination.

The expressions written here hold no `+` and no optional group `(?:...)?`: xgrammar's regex
drops the first element of an optional group holding a repetition (`(?:b[a-z]*)?` matches
"a"); an optional part is written `(?:...|)`. Every expression is bounded (`MAX_REGEX_CHARS`,
`MAX_ELIMINATED_STATES`, and so are the patterns read and the products built); past a bound
the caller gets None and keeps the keyword as it was (and its warning).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

import interegular
from interegular.fsm import FSM, anything_else

from plait.backend.grammar.schema.utils import pattern_shape

MAX_REGEX_CHARS = 4000
MAX_ELIMINATED_STATES = 48  # DFAs larger than this are not written back as an expression
MAX_PRODUCT_STATES = 20_000  # two DFAs whose product may pass this are not intersected
LOOKAROUND = re.compile(r"\(\?<?[=!]")
ANY = "[\\s\\S]"
NOTHING = "^[^\\s\\S]$"  # the pattern no string matches
_CLASS_SPECIAL = set("\\]^-[")


class TooLarge(Exception):
    """An expression would pass `MAX_REGEX_CHARS` or a DFA `MAX_ELIMINATED_STATES`."""


def dfa(pattern: str) -> FSM | None:
    """The DFA of a pattern anchored at both ends only (as the rewrite leaves them); None for
    one longer than `MAX_REGEX_CHARS` (its DFA's construction has no bound)."""
    if len(pattern) > MAX_REGEX_CHARS:
        return None
    shape = pattern_shape(pattern)
    if shape.inner_anchors or not (shape.starts and shape.ends) or LOOKAROUND.search(pattern):
        return None
    try:
        return interegular.parse_pattern(pattern[1:-1]).to_fsm()
    except Exception:  # noqa: BLE001 - interegular raises many types for unsupported syntax
        return None


def complement(pattern: str) -> str | None:
    """An anchored pattern matching exactly the strings `pattern` does not match (whole
    strings), or None when it cannot be built within the bounds."""
    fsm = dfa(pattern)
    if fsm is None:
        return None
    try:
        rest = fsm.everythingbut()
        body = language(rest, rest.initial)
    except (TooLarge, RecursionError):
        return None
    return NOTHING if body is None else f"^{body}$"


def intersection(first: str, second: str) -> str | None:
    """An anchored pattern matching the strings both anchored patterns match, or None."""
    one, other = dfa(first), dfa(second)
    if one is None or other is None or len(one.states) * len(other.states) > MAX_PRODUCT_STATES:
        return None
    try:
        both = one & other
        body = language(both, both.initial)
    except (TooLarge, RecursionError):
        return None
    return NOTHING if body is None else f"^{body}$"


def outside(strings: Iterable[str]) -> str:
    """An anchored pattern matching every string but those of `strings` (a trie: at each
    node the empty rest if the node ends no string, any other next character, or one of
    the next characters and what may follow it)."""
    trie: dict[str, Any] = {}
    for text in strings:
        node = trie
        for char in text:
            node = node.setdefault(char, {})
        node[""] = {}
    return f"^{_outside(trie)}$"


def _outside(node: dict[str, Any]) -> str:
    chars = sorted(c for c in node if c)
    others = f"[^{ranges(set(chars))}]" if chars else ANY
    parts = [f"{others}{ANY}*", *(escape(c) + _outside(node[c]) for c in chars)]
    if "" not in node:
        parts.append("")
    return "(?:" + "|".join(parts) + ")"


def live_states(fsm: FSM) -> set[int]:
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


def match_lengths(fsm: FSM) -> tuple[int | None, int | None]:
    """(shortest, longest) length of a match; longest None when unbounded, both None when
    the pattern matches nothing."""
    live = live_states(fsm)
    if fsm.initial not in live:
        return None, None
    longest: dict[int, int | None] = {}
    return _shortest(fsm, live), _longest(fsm, fsm.initial, live, longest, set())


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


def moves(fsm: FSM, state: Any, live: set[int]) -> dict[int, list[Any]]:
    """Target -> the characters (or anything_else) leading there from `state`."""
    by_target: dict[int, list[Any]] = {}
    out = fsm.map.get(state) or {}
    for char, index in fsm.alphabet.items():
        target = out.get(index)
        if target is not None and target in live:
            by_target.setdefault(target, []).append(char)
    return by_target


def language(fsm: FSM, state: Any) -> str | None:
    """The DFA's language from `state` by state elimination: edges between live states
    (plus a start and an end), each state removed in turn by joining its ins to its outs
    through its loop; None when nothing is matched from `state`."""
    live = live_states(fsm)
    if len(live) > MAX_ELIMINATED_STATES:
        raise TooLarge
    explicit = {c for c in fsm.alphabet if c is not anything_else}
    edges: dict[tuple[Any, Any], str] = {(_START, state): ""}
    for source in live:
        if source in fsm.finals:
            edges[(source, _END)] = ""
        for target, chars in moves(fsm, source, live).items():
            edges[(source, target)] = char_class(chars, explicit)
    degree = Counter(end for edge in edges for end in edge)
    for k in sorted(live, key=degree.__getitem__):  # fewest edges first
        loop = edges.pop((k, k), None)
        star = f"(?:{loop})*" if loop else ""
        ins = [(i, r) for (i, j), r in edges.items() if j == k]
        outs = [(j, r) for (i, j), r in edges.items() if i == k]
        edges = {e: r for e, r in edges.items() if k not in e}
        for i, first in ins:
            for j, last in outs:
                _union(edges, (i, j), first + star + last)
    return edges.get((_START, _END))


_START, _END = object(), object()  # the state-elimination graph's own ends


def _union(edges: dict[tuple[Any, Any], str], edge: tuple[Any, Any], expr: str) -> None:
    """Add `expr` as an alternative on `edge`; too long an expression ends the rewrite."""
    old = edges.get(edge)
    if old is None or old == expr:
        joined = expr
    elif "" in (old, expr):
        joined = f"(?:{old or expr}|)"
    else:
        joined = f"(?:{old}|{expr})"
    if len(joined) > MAX_REGEX_CHARS:
        raise TooLarge
    edges[edge] = joined


def char_class(chars: Iterable[Any], explicit: set[str]) -> str:
    """A character class for `chars` (anything_else: every character not in `explicit`)."""
    chars = list(chars)
    chosen = {c for c in chars if c is not anything_else}
    if anything_else not in chars:
        return "[" + ranges(chosen) + "]"
    excluded = explicit - chosen
    return "[^" + ranges(excluded) + "]" if excluded else ANY


def ranges(chars: set[str]) -> str:
    """Class text for a set of characters, consecutive runs written as ranges."""
    codes, out, i = sorted(ord(c) for c in chars), [], 0
    while i < len(codes):
        j = i
        while j + 1 < len(codes) and codes[j + 1] == codes[j] + 1:
            j += 1
        first, last = _class_char(chr(codes[i])), _class_char(chr(codes[j]))
        out.append(first if i == j else f"{first}-{last}" if j > i + 1 else first + last)
        i = j + 1
    return "".join(out)


def _class_char(char: str) -> str:
    if char in _CLASS_SPECIAL:
        return "\\" + char
    if ord(char) < 0x20 or ord(char) == 0x7F:
        return f"\\x{ord(char):02x}"
    return char


def escape(char: str) -> str:
    """One character as a regex matching it alone."""
    return f"[{_class_char(char)}]" if not char.isalnum() else char

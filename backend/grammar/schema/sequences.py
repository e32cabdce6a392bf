"""The grammar rules of moved arrays (hoist.py, arrays.py): splice.py puts them in place of
the rules xgrammar's converter wrote for them (which ignore `contains`, `minContains`,
`maxContains` and `uniqueItems`).

Each rule is an automaton over the array's items, one EBNF rule per state, in the layout's
own brackets and separators:

- `Counted`: a state is (matching items so far, items so far), each count stopping at the
  last value that matters (the upper bound, or the lower one when there is none); an item of
  the match def moves the first count, one of the other def only the second;
- `Distinct`: a state is the set of values used so far; each next item is a value not in it.

A state is accepting when its counts (its set's size) lie within the bounds; only states
that can still reach an accepting one are written, so the grammar never leads a model into
a dead end. The sizes are bounded where the schema is moved (arrays.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from plait.backend.grammar.layout import array_tokens


@dataclass(frozen=True)
class Counted:
    """Items of def `match` counted low..high (None: no bound), the others of def `other`;
    lengths shortest..longest."""

    match: str
    other: str
    low: int
    high: int | None
    shortest: int
    longest: int | None


@dataclass(frozen=True)
class Distinct:
    """No value of `values` twice; item i of the `prefix` one of the values its indices
    name, any later one of those `rest` names (None: no later item); lengths
    shortest..longest."""

    values: tuple[Any, ...]
    prefix: tuple[tuple[int, ...], ...]
    rest: tuple[int, ...] | None
    shortest: int
    longest: int | None

    def allowed(self, position: int) -> tuple[int, ...]:
        """The indices of the values item `position` may take."""
        if position < len(self.prefix):
            return self.prefix[position]
        return () if self.rest is None else self.rest


State = tuple[int, int]
Rules = dict[str, list[str]]  # rule name -> its alternatives


def satisfiable(spec: Counted | Distinct) -> bool:
    """Whether some array meets the rule."""
    return START in _live(_steps(spec))


def sequence_rules(rule: str, spec: Counted | Distinct, layout: str) -> Rules:
    opening, separator, closing, empty = array_tokens(layout)
    machine = _Machine(rule, _steps(spec), separator)
    first = [f"{opening} {item} {target} {closing}" for item, target in machine.moves(START)]
    if not first and not machine.accepting(START):
        raise RuntimeError(f"{rule}: no array is valid")  # arrays.py moves none such
    return {rule: [*first, *([empty] if machine.accepting(START) else [])], **machine.rules}


START: State = (0, 0)


def _steps(spec: Counted | Distinct) -> _Steps:
    return _CountedSteps(spec) if isinstance(spec, Counted) else _DistinctSteps(spec)


class _Steps:
    """An automaton over items: `moves(state)` (item EBNF, next state), `accepting`."""

    def moves(self, state: State) -> list[tuple[str, State]]:
        raise NotImplementedError

    def accepting(self, state: State) -> bool:
        raise NotImplementedError


class _CountedSteps(_Steps):
    def __init__(self, spec: Counted) -> None:
        self.spec = spec
        self.items = (f"defs_{spec.match}", f"defs_{spec.other}")

    def moves(self, state: State) -> list[tuple[str, State]]:
        """An other item moves the length; a matching one the match count too."""
        matches, length = state
        s = self.spec
        if s.longest is not None and length >= s.longest:
            return []
        after = length + 1 if s.longest is not None else min(length + 1, s.shortest)
        out = [(self.items[1], (matches, after))]
        if s.high is None or matches < s.high:
            counted = matches + 1 if s.high is not None else min(matches + 1, s.low)
            out.append((self.items[0], (counted, after)))
        return out

    def accepting(self, state: State) -> bool:
        return state[0] >= self.spec.low and state[1] >= self.spec.shortest


class _DistinctSteps(_Steps):
    """States are (the set of values used as a bit mask, its size: the items so far)."""

    def __init__(self, spec: Distinct) -> None:
        self.spec = spec
        self.values = [json.dumps(json.dumps(v, ensure_ascii=False), ensure_ascii=False)
                       for v in spec.values]  # fmt: skip

    def moves(self, state: State) -> list[tuple[str, State]]:
        used, size = state
        if self.spec.longest is not None and size >= self.spec.longest:
            return []
        free = (i for i in self.spec.allowed(size) if not used >> i & 1)
        return [(self.values[i], (used | 1 << i, size + 1)) for i in free]

    def accepting(self, state: State) -> bool:
        return state[1] >= self.spec.shortest


class _Machine:
    """The rules of the states reachable from the start that can still reach acceptance."""

    def __init__(self, rule: str, steps: _Steps, separator: str) -> None:
        self.rule, self.steps, self.separator = rule, steps, separator
        self.live = _live(steps)
        self.rules: Rules = {}
        for state in self._reachable():
            after = [f"{separator} {item} {target}" for item, target in self.moves(state)]
            self.rules[self.name(state)] = after + (['""'] if steps.accepting(state) else [])

    def name(self, state: State) -> str:
        return f"plait_{self.rule}_q{state[0]}_{state[1]}"  # xgrammar's helpers: <rule>_<n>

    def accepting(self, state: State) -> bool:
        return self.steps.accepting(state)

    def moves(self, state: State) -> Iterator[tuple[str, str]]:
        for item, target in self.steps.moves(state):
            if target in self.live:
                yield item, self.name(target)

    def _reachable(self) -> list[State]:
        seen, frontier = set(), [t for _, t in self.steps.moves(START) if t in self.live]
        while frontier:
            state = frontier.pop()
            if state not in seen:
                seen.add(state)
                frontier += [t for _, t in self.steps.moves(state) if t in self.live]
        return sorted(seen)


def _live(steps: _Steps) -> set[State]:
    """States from which an accepting state can be reached (the graph is a DAG but for
    the counters that stop at a bound, which loop on themselves)."""
    states, frontier = {START}, [START]
    while frontier:
        for _, target in steps.moves(frontier.pop()):
            if target not in states:
                states.add(target)
                frontier.append(target)
    live = {s for s in states if steps.accepting(s)}
    changed = True
    while changed:
        grown = {s for s in states if any(t in live for _, t in steps.moves(s))} | live
        changed, live = grown != live, grown
    return live

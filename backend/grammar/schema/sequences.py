"""The grammar rules of the arrays arrays.py moves under `$defs`, spliced into xgrammar's
grammar in place of the rules its converter wrote for them (which ignore `contains`,
`minContains`, `maxContains` and `uniqueItems`).

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
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import xgrammar as xgr

from plait.backend.grammar.layout import GAP_RULE, array_tokens, gap_rule


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


def splice_sequences(
    grammar: xgr.Grammar, moved: dict[str, Counted | Distinct], *, layout: str
) -> xgr.Grammar:
    """`grammar` (xgrammar's, of a rewritten schema) with the rule of each moved array
    (`$defs` name -> its rule, arrays.moved_arrays) replaced by its exact one; `grammar`
    itself when there is none. An array the converter wrote no rule for (under a keyword
    it ignores, like `not`) is not in the grammar at all."""
    lines = str(grammar).splitlines()
    text = "\n".join(lines)
    used = {n: rule for n, rule in moved.items() if re.search(rf"\bdefs_{n}\b", text)}
    if not used:
        return grammar
    for name, rule in used.items():
        lines = _replaced(lines, f"defs_{name}", sequence_rules(f"defs_{name}", rule, layout))
    if GAP_RULE in " ".join(lines) and not any(line.startswith(GAP_RULE) for line in lines):
        lines.append(gap_rule(layout))
    return xgr.Grammar.from_ebnf("\n".join(lines) + "\n")


def satisfiable(spec: Counted | Distinct) -> bool:
    """Whether some array meets the rule."""
    return START in _live(_steps(spec))


def _replaced(lines: list[str], rule: str, rules: Rules) -> list[str]:
    """`lines` with `rule`'s line replaced by `rules` (the first of them `rule` itself)."""
    head = f"{rule} ::= "
    found = [i for i, line in enumerate(lines) if line.startswith(head)]
    if len(found) != 1:  # the names are chosen so that this cannot happen
        raise RuntimeError(f"the converted grammar has {len(found)} rules {rule}")
    written = [f"{name} ::= {' | '.join(alts)}" for name, alts in rules.items()]
    return lines[: found[0]] + written + lines[found[0] + 1 :]


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
        return f"{self.rule}_{state[0]}_{state[1]}"

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

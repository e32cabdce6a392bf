"""Schemas that get a grammar rule of their own, moved under the root's `$defs`.

Some keywords have no JSON Schema form xgrammar enforces, but a regular language over the
value's text or items: arrays with `contains` or `uniqueItems` over a few values (arrays.py,
sequences.py), numbers with a decimal step, a step beside a range, or that are not
integers or not multiples (numbers.py). Such a schema is moved under the root's `$defs` as
`plait_rule_<letters>` (xgrammar's converter names its rule `defs_plait_rule_<letters>`:
it drops digits from `$defs` names), still a schema that means the same, and
`splice_rules` replaces the converter's rule for it by the exact one, then reads the
grammar again from its EBNF (a moved schema the converter wrote no rule for sits under a
keyword xgrammar ignores, like `not`, and is not in the grammar). `rule_of` reads a moved
schema's rule back, for the splice and for the warning walker alike; a schema with no rule
stays where it was, one no value meets is `false`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import xgrammar as xgr

from plait.backend.grammar.layout import GAP_RULE, gap_rule
from plait.backend.grammar.schema.arrays import COUNTED_KEYS, MATCH, OTHER, sequence_of
from plait.backend.grammar.schema.merge import Merger, contradicts
from plait.backend.grammar.schema.negate import Negator
from plait.backend.grammar.schema.numbers import (
    MAX_STATES,
    Numeric,
    number_rules,
    number_states,
    numeric_of,
)
from plait.backend.grammar.schema.sequences import (
    Counted,
    Distinct,
    Rules,
    satisfiable,
    sequence_rules,
)
from plait.backend.grammar.schema.utils import ANNOTATIONS, NEVER, map_children

RULE_PREFIX = "plait_rule_"
DEF_KEYS = ("$defs", "definitions")
Rule = Counted | Distinct | Numeric


def rule_of(node: Any) -> Rule | None:
    """The rule a moved schema gets, or None."""
    return sequence_of(node) or numeric_of(node)


def moved_rules(schema: Any) -> dict[str, Rule]:
    """The rule of each moved schema, by its `$defs` name."""
    defs = schema.get("$defs") if isinstance(schema, dict) else None
    out = {}
    for name, node in (defs or {}).items():
        rule = rule_of(node) if name.startswith(RULE_PREFIX) else None
        if rule is not None:
            out[name] = rule
    return out


def is_moved(path: str) -> bool:
    """Whether a walker's path is that of a moved schema itself."""
    head, _, name = path.rpartition("/")
    return head == "/$defs" and name.startswith(RULE_PREFIX)


class Hoister:
    """Moves each schema with a rule of its own under `$defs` (above); `rewrite` rewrites
    the item schemas a `contains` is split into."""

    def __init__(self, *, merger: Merger, negator: Negator, rewrite: Callable[[Any], Any]) -> None:
        self.merger, self.negator, self.rewrite = merger, negator, rewrite
        self.defs: dict[str, Any] = {}
        self.count = 0

    def hoist(self, schema: Any) -> Any:
        """`schema` with its arrays moved; unchanged when it is not an object or already
        names `plait_rule` (its own `$defs` could then meet the names)."""
        if not isinstance(schema, dict) or RULE_PREFIX.rstrip("_") in json.dumps(schema):
            return schema
        out = self._walk(schema)
        if not self.defs or not isinstance(out, dict):
            return out
        return {**out, "$defs": {**out.get("$defs", {}), **self.defs}}

    def _walk(self, node: Any) -> Any:
        """An array with `contains` first (its item schemas as written), then the children,
        then the node itself."""
        if not isinstance(node, dict):
            return node
        if node.get("type") == "array" and "contains" in node:
            done = self._contains(node)
            if done is not node:
                return done if not isinstance(done, dict) or "$ref" in done else self._walk(done)
        node = map_children(node, self._walk)
        moved = {k: v for k, v in node.items() if k not in DEF_KEYS}
        return self._moved(node, moved, {}) if rule_of(moved) is not None else node

    def _contains(self, node: dict[str, Any]) -> Any:
        condition, items = node["contains"], node.get("items", {})
        if not set(node) - ANNOTATIONS - set(DEF_KEYS) <= COUNTED_KEYS or not isinstance(
            items, dict
        ):
            return node
        match = self.merger.merge(items, condition, depth=0)
        unless = self.negator.negate(condition, depth=0)
        other: Any = items if unless is None and "maxContains" not in node else None
        if unless is not None:
            other = self.merger.merge(items, unless, depth=0)
        if match is None or other is None:
            return node
        if match is NEVER or other is NEVER:  # no item matches, or every item does
            return _as_lengths(node, every=other is NEVER)
        name = self._name()
        refs = [{"$ref": f"#/$defs/{name}{end}"} for end in (MATCH, OTHER)]
        moved = {k: v for k, v in node.items() if k not in DEF_KEYS}
        parts = {name + end: self._within(part) for end, part in ((MATCH, match), (OTHER, other))}
        return self._moved(node, {**moved, "items": {"anyOf": refs}}, parts, name=name)

    def _within(self, schema: Any) -> Any:
        """An item schema `contains` is split into, rewritten, with its own moves."""
        return self._walk(self.rewrite(schema))

    def _name(self) -> str:
        self.count += 1
        return RULE_PREFIX + _letters(self.count - 1)

    def _moved(
        self, node: dict[str, Any], schema: dict[str, Any], parts: dict[str, Any], name: str = ""
    ) -> Any:
        """`node` as a `$ref` to `schema` under a new name (with the defs `parts`), when
        `rule_of` gives it a rule within the bounds (False when no value meets it)."""
        rule = rule_of(schema)
        if rule is None:
            return node
        if isinstance(rule, Numeric):
            states = number_states(rule)  # (the array rules are bounded by sequence_of)
            if states > MAX_STATES:
                return node
            if states == 0:
                return False  # no value is valid
        elif not satisfiable(rule):
            return False
        name = name or self._name()
        self.defs.update({name: schema, **parts})
        return {"$ref": f"#/$defs/{name}", **{k: node[k] for k in DEF_KEYS if k in node}}


def _as_lengths(node: dict[str, Any], *, every: bool) -> Any:
    """`contains` when every item matches (the matches are the items) or none can."""
    low, high = node.get("minContains", 1), node.get("maxContains")
    rest = {k: v for k, v in node.items() if k not in ("contains", "minContains", "maxContains")}
    if not every:
        return rest if low == 0 else False
    rest["minItems"] = max(rest.get("minItems", 0), low)
    if high is not None:
        rest["maxItems"] = min(rest.get("maxItems", high), high)
    return False if contradicts(rest) else rest


def _letters(index: int) -> str:
    """`index` in letters (a, b, .., z, ba, ..): xgrammar keeps no digit of a `$defs` name."""
    out = ""
    while True:
        out = chr(ord("a") + index % 26) + out
        index //= 26
        if index == 0:
            return out


def splice_rules(grammar: xgr.Grammar, moved: dict[str, Rule], *, layout: str) -> xgr.Grammar:
    """`grammar` (xgrammar's, of a rewritten schema) with the rule of each moved schema
    (`$defs` name -> its rule, hoist.moved_rules) replaced by its exact one; `grammar`
    itself when there is none."""
    lines = str(grammar).splitlines()
    text = "\n".join(lines)
    used = {n: rule for n, rule in moved.items() if re.search(rf"\bdefs_{n}\b", text)}
    if not used:
        return grammar
    for name, rule in used.items():
        lines = _replaced(lines, f"defs_{name}", _rules(f"defs_{name}", rule, layout))
    if GAP_RULE in " ".join(lines) and not any(line.startswith(GAP_RULE) for line in lines):
        lines.append(gap_rule(layout))
    return xgr.Grammar.from_ebnf("\n".join(lines) + "\n")


def _rules(rule: str, spec: Rule, layout: str) -> Rules:
    if isinstance(spec, Numeric):
        return number_rules(rule, spec)
    return sequence_rules(rule, spec, layout)


def _replaced(lines: list[str], rule: str, rules: Rules) -> list[str]:
    """`lines` with `rule`'s line replaced by `rules` (the first of them `rule` itself)."""
    head = f"{rule} ::= "
    found = [i for i, line in enumerate(lines) if line.startswith(head)]
    if len(found) != 1:  # the names are chosen so that this cannot happen
        raise RuntimeError(f"the converted grammar has {len(found)} rules {rule}")
    written = [f"{name} ::= {' | '.join(alts)}" for name, alts in rules.items()]
    return lines[: found[0]] + written + lines[found[0] + 1 :]

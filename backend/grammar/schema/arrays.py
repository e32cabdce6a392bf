"""Arrays whose valid item sequences no JSON Schema xgrammar enforces can write: which rule
of its own (sequences.py) a moved array schema gets (hoist.py moves them).

No finite union of tuples holds "at least one item matches" for arrays of any length, nor
"no value twice"; but both are regular languages over the items. The moved schema still
means what the array did:

- contains C, items I: `{"type": "array", "items": {"anyOf": [{"$ref": M}, {"$ref": O}]},
  "contains": C, ...}`, M = I and C, O = I and not C (negate.py); without `maxContains`,
  O may be I itself (an item matching C may then count or not: "at least" holds either way);
- uniqueItems over the values of an `enum`/`const`, `boolean`/`null`, or a small integer
  range (per `prefixItems` position, and for the items after them), as written.

Bounded: `MAX_STATES` counter states, at most `MAX_VALUES` distinct values (their subsets);
past a bound the array has no rule, and its keyword stays warned.
"""

from __future__ import annotations

import math
from typing import Any

from plait.backend.grammar.schema.sequences import Counted, Distinct
from plait.backend.grammar.schema.utils import ANNOTATIONS, is_number, same

MATCH, OTHER = "_match", "_other"
MAX_STATES = 2048
MAX_VALUES = 10
COUNTED_KEYS = {"type", "items", "contains", "minContains", "maxContains", "minItems", "maxItems"}
DISTINCT_KEYS = {"type", "items", "prefixItems", "uniqueItems", "minItems", "maxItems"}
SCALAR_TYPES: dict[str, list[Any]] = {"boolean": [True, False], "null": [None]}
INTEGER_BOUNDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")


def sequence_of(node: Any) -> Counted | Distinct | None:
    """The rule a moved array schema gets (above), or None."""
    if not isinstance(node, dict) or node.get("type") != "array":
        return None
    keys = set(node) - ANNOTATIONS
    shortest, longest = _count(node.get("minItems", 0)), node.get("maxItems")
    if shortest is None or (longest is not None and _count(longest) is None):
        return None
    if "contains" in node and keys <= COUNTED_KEYS:
        pair = _pair(node.get("items"))
        low, high = _count(node.get("minContains", 1)), node.get("maxContains")
        if pair is None or low is None or (high is not None and _count(high) is None):
            return None
        counted = Counted(*pair, low, high, shortest, longest)
        return counted if _states(counted) <= MAX_STATES else None
    if node.get("uniqueItems") is True and keys <= DISTINCT_KEYS:
        return _distinct(node, shortest, longest)
    return None


def _distinct(node: dict[str, Any], shortest: int, longest: int | None) -> Distinct | None:
    """The values each item may take, when they are few scalars (or no item may follow the
    prefix: `maxItems` at its length)."""
    prefix = node.get("prefixItems", [])
    if not isinstance(prefix, list):
        return None
    beyond = "items" in node or longest is None or longest > len(prefix)
    domains = [domain(sub) for sub in prefix] + ([domain(node.get("items"))] if beyond else [])
    if any(d is None for d in domains):
        return None
    values: list[Any] = []
    for value in (v for d in domains for v in d or []):
        values += [] if any(same(value, v) for v in values) else [value]
    if len(values) > MAX_VALUES:
        return None
    indices = [
        tuple(i for i, v in enumerate(values) if any(same(v, w) for w in d or [])) for d in domains
    ]
    rest = indices.pop() if beyond else None
    return Distinct(tuple(values), tuple(indices), rest, shortest, longest)


def _pair(items: Any) -> tuple[str, str] | None:
    """The names of the match and other defs an items' anyOf refers to."""
    branches = items.get("anyOf") if isinstance(items, dict) and len(items) == 1 else None
    if not isinstance(branches, list) or len(branches) != 2:
        return None
    refs = [b.get("$ref", "") if isinstance(b, dict) else "" for b in branches]
    names = [r.removeprefix("#/$defs/") for r in refs]
    if not names[0].endswith(MATCH) or names[1] != names[0].removesuffix(MATCH) + OTHER:
        return None
    return names[0], names[1]


def _count(value: Any) -> int | None:
    if not is_number(value) or value < 0 or value % 1:
        return None
    return int(value)


def _states(counted: Counted) -> int:
    matches = counted.high if counted.high is not None else counted.low
    lengths = counted.longest if counted.longest is not None else counted.shortest
    return (matches + 1) * (lengths + 1)


def domain(items: Any) -> list[Any] | None:
    """The values an items' schema allows, when they are few scalars; else None."""
    if not isinstance(items, dict):
        return None
    keys = set(items) - ANNOTATIONS
    if keys == {"enum"} or keys == {"const"}:
        values = items["enum"] if "enum" in items else [items["const"]]
    elif keys == {"type"}:
        types = [items["type"]] if isinstance(items["type"], str) else items["type"]
        values = [v for t, vs in SCALAR_TYPES.items() if t in types for v in vs]
        values = values if set(types) <= set(SCALAR_TYPES) else None
    else:
        values = _integers(items)
    if not isinstance(values, list) or any(isinstance(v, (dict, list)) for v in values):
        return None
    distinct: list[Any] = []
    for value in values:
        distinct += [] if any(same(value, v) for v in distinct) else [value]
    return distinct if len(distinct) <= MAX_VALUES else None


def _integers(items: dict[str, Any]) -> list[int] | None:
    """The integers of a bounded integer type (inclusive or exclusive bounds)."""
    bounds = {k: items.get(k) for k in INTEGER_BOUNDS}
    if items.get("type") != "integer" or set(items) - ANNOTATIONS - {"type", *INTEGER_BOUNDS}:
        return None
    if not all(b is None or is_number(b) for b in bounds.values()):
        return None
    lows = [math.ceil(bounds["minimum"])] if bounds["minimum"] is not None else []
    lows += (
        [math.floor(bounds["exclusiveMinimum"]) + 1]
        if bounds["exclusiveMinimum"] is not None
        else []
    )
    highs = [math.floor(bounds["maximum"])] if bounds["maximum"] is not None else []
    highs += (
        [math.ceil(bounds["exclusiveMaximum"]) - 1]
        if bounds["exclusiveMaximum"] is not None
        else []
    )
    if not lows or not highs or min(highs) - max(lows) >= MAX_VALUES:
        return None
    return list(range(max(lows), min(highs) + 1))

"""The complement of a JSON Schema, written as a schema xgrammar enforces.

A value fails a schema when its type is not among the schema's types, or when it fails one
of the schema's keywords; a keyword only applies to its own type, so each failure is one
typed branch, and the complement is the `anyOf` of them:

    not {"type": "string", "minLength": 2}
    == {"anyOf": [{"type": ["null", "boolean", "object", "array", "number"]},
                  {"type": "string", "maxLength": 1}]}

Each keyword's failures have an exact form or none: bounds flip (`minimum` 5 fails below 5:
`exclusiveMaximum` 5); a `pattern` fails on its complement (automata.py); values outside an
`enum` are the other types, the other booleans, the strings of a trie pattern and the open
intervals between the numbers; a missing `required` name is a `false` property; `allOf`
fails where one branch fails, `anyOf` where all do (their intersection, merge.py);
`if`/`then`/`else` where the condition holds and `then` fails, or it does not and `else`
fails. The numbers that are not integers, or not multiples of a step, stay `not` of
`integer` or of `multipleOf` beside `"type": "number"`, which a rule of their own enforces
(numbers.py, hoist.py). What has no form here (`uniqueItems`; `items` after `prefixItems`;
`additionalProperties`) makes the whole complement None, and the caller keeps the keyword
(and its warning).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plait.backend.grammar.schema.automata import NOTHING, complement, outside
from plait.backend.grammar.schema.merge import Merger
from plait.backend.grammar.schema.types import JSON_TYPES
from plait.backend.grammar.schema.utils import ANNOTATIONS, NEVER, disjoint, is_number, node_types

MAX_VALUES = 32  # an enum of more values is not negated
NOT_INTEGER = {"type": "number", "not": {"type": "integer"}}
FLIPPED = {
    "minimum": ("number", "exclusiveMaximum"),
    "maximum": ("number", "exclusiveMinimum"),
    "exclusiveMinimum": ("number", "maximum"),
    "exclusiveMaximum": ("number", "minimum"),
    "minLength": ("string", "maxLength"),
    "maxLength": ("string", "minLength"),
    "minItems": ("array", "maxItems"),
    "maxItems": ("array", "minItems"),
    "minProperties": ("object", "maxProperties"),
    "maxProperties": ("object", "minProperties"),
}
# Keywords that change nothing when alone, or that another keyword's failure accounts for.
INERT = frozenset({"then", "else", "minContains", "maxContains"})
Branches = list[Any]


class Negator:
    """Complements of (rewritten) schemas; `inline` resolves a pure `$ref` (None: no)."""

    def __init__(self, *, merger: Merger, inline: Callable[[Any, int], Any], root: Any) -> None:
        self.merger = merger
        self.inline = inline
        self.root = root

    def negate(self, schema: Any, *, depth: int) -> Any:
        """The schema of exactly the values `schema` rejects; NEVER when it rejects none;
        None when that has no exact form here."""
        if schema is False:
            return {}
        schema = {} if schema is True else self.inline(schema, depth)
        if not isinstance(schema, dict) or _unknown_format(schema):
            return None
        branches: Branches = []
        if "type" in schema:
            branches += other_types(node_types(schema))
        for key in sorted(set(schema) - ANNOTATIONS - INERT - {"type"}):
            failing = self._failing(key, schema, depth)
            if failing is None:
                return None
            branches += failing
        return any_of(branches)

    def _failing(self, key: str, schema: dict[str, Any], depth: int) -> Branches | None:
        """The typed branches of the values that fail `key` of `schema`."""
        value = schema[key]
        if key in FLIPPED:
            return _flipped(key, value)
        handlers: dict[str, Callable[[Any, dict[str, Any], int], Branches | None]] = {
            "enum": lambda v, s, d: outside_values(v),
            "const": lambda v, s, d: outside_values([v]),
            "pattern": lambda v, s, d: _outside_pattern(v),
            "required": lambda v, s, d: _missing(v),
            "properties": self._properties,
            "dependentRequired": lambda v, s, d: _dependents_missing(v),
            "dependentSchemas": self._dependent_schemas,
            "prefixItems": self._prefix_items,
            "contains": self._contains,
            "not": lambda v, s, d: [v],
            "allOf": self._all_of,
            "anyOf": self._any_of,
            "oneOf": self._one_of,
            "if": self._conditional,
            "uniqueItems": lambda v, s, d: [] if v is False else None,
            "multipleOf": lambda v, s, d: [{"type": "number", "not": {"multipleOf": v}}],
            "items": lambda v, s, d: [] if v in ({}, True) and "prefixItems" not in s else None,
            "additionalProperties": lambda v, s, d: [] if v in ({}, True) else None,
            "patternProperties": lambda v, s, d: [] if v == {} else None,
        }
        handler = handlers.get(key)
        return None if handler is None else handler(value, schema, depth)

    def _sub(self, schema: Any, depth: int) -> Branches | None:
        """`negate` as a list of branches (none for NEVER)."""
        negated = self.negate(schema, depth=depth + 1)
        if negated is None or negated is NEVER:
            return None if negated is None else []
        return negated["anyOf"] if _bare_any_of(negated) else [negated]

    def _properties(self, value: Any, schema: dict[str, Any], depth: int) -> Branches | None:
        if not isinstance(value, dict):
            return None
        out: Branches = []
        for name, sub in value.items():
            failing = self.negate(sub, depth=depth + 1)
            if failing is None:
                return None
            if failing is not NEVER:
                out.append({"type": "object", "required": [name], "properties": {name: failing}})
        return out

    def _dependent_schemas(self, value: Any, schema: dict[str, Any], depth: int) -> Branches | None:
        if not isinstance(value, dict):
            return None
        out: Branches = []
        for name, sub in value.items():
            failing = self._sub(sub, depth)
            if failing is None:
                return None
            present = {"type": "object", "required": [name]}
            merged = self.merger.merge(present, any_of(failing), depth=depth)
            if merged is None:
                return None
            out += [] if merged is NEVER else [merged]
        return out

    def _prefix_items(self, value: Any, schema: dict[str, Any], depth: int) -> Branches | None:
        """An array fails position i when it has one there that fails its schema."""
        if not isinstance(value, list):
            return None
        out: Branches = []
        for i, sub in enumerate(value):
            failing = self.negate(sub, depth=depth + 1)
            if failing is None:
                return None
            if failing is not NEVER:
                prefix = [*([{}] * i), failing]
                out.append({"type": "array", "minItems": i + 1, "prefixItems": prefix})
        return out

    def _contains(self, value: Any, schema: dict[str, Any], depth: int) -> Branches | None:
        """Without minContains/maxContains: the arrays none of whose items match."""
        if schema.get("maxContains") is not None or schema.get("minContains", 1) != 1:
            return [] if schema.get("minContains") == 0 and "maxContains" not in schema else None
        failing = self.negate(value, depth=depth + 1)
        if failing is None:
            return None
        items = {"maxItems": 0} if failing is NEVER else {"items": failing}
        return [{"type": "array", **items}]

    def _all_of(self, value: Any, schema: dict[str, Any], depth: int) -> Branches | None:
        if not isinstance(value, list):
            return None
        out: Branches = []
        for sub in value:
            failing = self._sub(sub, depth)
            if failing is None:
                return None
            out += failing
        return out

    def _any_of(self, value: Any, schema: dict[str, Any], depth: int) -> Branches | None:
        """Values that fail every branch: the intersection of the complements."""
        if not isinstance(value, list):
            return None
        negated = [self.negate(sub, depth=depth + 1) for sub in value]
        if any(n is None for n in negated):
            return None
        both = self.merger.merge_all(negated, depth=depth)
        if both is None or both is NEVER:
            return None if both is None else []
        return both["anyOf"] if _bare_any_of(both) else [both]

    def _one_of(self, value: Any, schema: dict[str, Any], depth: int) -> Branches | None:
        """Disjoint branches fail together as anyOf's do; overlapping ones have no form."""
        if not isinstance(value, list) or not disjoint(self.root, value):
            return None
        return self._any_of(value, schema, depth)

    def _conditional(self, value: Any, schema: dict[str, Any], depth: int) -> Branches | None:
        """(if and not then) or (not if and not else)."""
        out: Branches = []
        for condition, branch in ((value, "then"), ({"not": value}, "else")):
            if branch not in schema:
                continue
            holds = value if condition is value else self.negate(value, depth=depth + 1)
            failing = self.negate(schema[branch], depth=depth + 1)
            if holds is None or failing is None:
                return None
            merged = self.merger.merge(holds, failing, depth=depth)
            if merged is None:
                return None
            out += [] if merged is NEVER else [merged]
        return out


def other_types(types: set[str]) -> Branches:
    """The values of the JSON types not in `types` ("number" covering integers): when
    `types` has `integer` without `number`, the numbers that are not integers are a branch
    of their own (which only a rule of its own enforces, numbers.py)."""
    fractional = "integer" in types and "number" not in types
    others = [t for t in JSON_TYPES if t not in types and not (t == "number" and fractional)]
    return [*([{"type": _one(others)}] if others else []), *([NOT_INTEGER] if fractional else [])]


def outside_values(values: Any) -> Branches | None:
    """Typed branches of every JSON value not among `values`."""
    if not isinstance(values, list) or len(values) > MAX_VALUES:
        return None
    if any(isinstance(v, (dict, list)) for v in values):
        return None  # objects and arrays outside a set have no form here
    out: Branches = []
    if None not in values:
        out.append({"type": "null"})
    booleans = [b for b in (True, False) if not any(v is b for v in values)]
    out += [{"enum": booleans}] if booleans else []
    strings = [v for v in values if isinstance(v, str)]
    out.append({"type": "string", **({"pattern": outside(strings)} if strings else {})})
    out += _outside_numbers([v for v in values if is_number(v)])
    return [*out, {"type": ["object", "array"]}]


def _outside_numbers(numbers: list[Any]) -> Branches:
    """The open intervals around and between `numbers`."""
    points = sorted({float(n): n for n in numbers}.values())
    if not points:
        return [{"type": "number"}]
    out: Branches = [{"type": "number", "exclusiveMaximum": points[0]}]
    for low, high in zip(points, points[1:], strict=False):
        out.append({"type": "number", "exclusiveMinimum": low, "exclusiveMaximum": high})
    return [*out, {"type": "number", "exclusiveMinimum": points[-1]}]


def _flipped(key: str, value: Any) -> Branches | None:
    type_name, opposite = FLIPPED[key]
    if not is_number(value):
        return None
    if type_name == "number":
        return [{"type": "number", opposite: value}]
    if value % 1:
        return None
    count = int(value) - 1 if key.startswith("min") else int(value) + 1
    return [] if count < 0 else [{"type": type_name, opposite: count}]


def _outside_pattern(pattern: Any) -> Branches | None:
    other = complement(pattern) if isinstance(pattern, str) else None
    if other is None or other == NOTHING:  # (every string matches: none fails)
        return None if other is None else []
    return [{"type": "string", "pattern": other}]


def _missing(names: Any) -> Branches | None:
    if not isinstance(names, list):
        return None
    return [{"type": "object", "properties": {name: False}} for name in dict.fromkeys(names)]


def _dependents_missing(value: Any) -> Branches | None:
    """An object has a property and lacks one that property requires."""
    if not isinstance(value, dict):
        return None
    out: Branches = []
    for name, needed in value.items():
        for other in needed if isinstance(needed, list) else [None]:
            if other is None:
                return None
            out.append({"type": "object", "required": [name], "properties": {other: False}})
    return out


def _unknown_format(schema: dict[str, Any]) -> bool:
    """A `format` the rewrite left (not a pattern): its failures have no form."""
    return "format" in schema


def any_of(branches: Branches) -> Any:
    """One schema for the union of `branches` (NEVER for none)."""
    if not branches:
        return NEVER
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def _bare_any_of(node: Any) -> bool:
    return isinstance(node, dict) and set(node) - ANNOTATIONS == {"anyOf"}


def _one(types: list[str]) -> Any:
    return types[0] if len(types) == 1 else types

"""The intersection of two JSON Schemas, where it has an exact form.

`Merger.merge(a, b)` is the schema of the values valid under both `a` and `b`: keyword by
keyword (types, required, bounds, enum/const, properties, integral steps, ...); a schema
with an `anyOf` distributes over the other (`(A1 | A2) & B == (A1 & B) | (A2 & B)`, at most
`MAX_BRANCHES` branches); `NEVER` when no value is valid under both; None when some keyword
has no exact intersection here (the caller then leaves the schemas as they were).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from plait.backend.grammar.schema.automata import NOTHING, intersection
from plait.backend.grammar.schema.objects import value_schema
from plait.backend.grammar.schema.utils import ANNOTATIONS, NEVER, is_number, node_types, same
from plait.backend.grammar.schema.values import narrowed

LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
# Keywords read together within one schema object: merging two objects that each hold some
# of a group would make one's keyword apply to the other's (`if` of one, `then` of another).
SIBLING_GROUPS = (("if", "then", "else"), ("contains", "minContains", "maxContains"))
TUPLE_KEYS = ("prefixItems", "items", "additionalItems", "unevaluatedItems")
OBJECT_PARTS = ("properties", "additionalProperties")
MAX_BRANCHES = 64  # an anyOf the distribution writes has at most this many branches

Inline = Callable[[Any, int], Any]


class Merger:
    """Intersections; `inline` replaces a pure `$ref` by its (rewritten) target, or None."""

    def __init__(self, *, inline: Inline) -> None:
        self.inline = inline

    def merge(self, a: Any, b: Any, *, depth: int) -> Any:
        """The schema of values matching both `a` and `b`; None when that has no exact
        form here, NEVER when no value matches both."""
        if a is False or b is False or a is NEVER or b is NEVER:
            return NEVER
        if _empty(a) or _empty(b):
            kept = b if _empty(a) else a
            return {} if kept is True else kept
        a = {} if a is True else self.inline(a, depth)
        b = {} if b is True else self.inline(b, depth)
        if not isinstance(a, dict) or not isinstance(b, dict):
            return None
        for one, other in ((a, b), (b, a)):
            if _sole_any_of(one):
                return self._distribute(one, other, depth=depth)
        if _conflicts(a, b):
            return None
        if _closes(a) or _closes(b):
            return self._closed(a, b, depth=depth)
        return self._keywords(a, b, depth=depth)

    def merge_all(self, schemas: list[Any], *, depth: int) -> Any:
        """The intersection of every schema of `schemas` (None, NEVER as `merge`)."""
        out: Any = {}
        for schema in schemas:
            out = self.merge(out, schema, depth=depth)
            if out is None or out is NEVER:
                return out
        return out

    def _keywords(self, a: dict[str, Any], b: dict[str, Any], *, depth: int) -> Any:
        out = dict(a)
        for key, value in b.items():
            if key in ANNOTATIONS or (key in out and same(out[key], value)):
                continue
            if key not in out:
                out[key] = value  # (a `const` may be null)
                continue
            merged = self._value(key, x=out[key], y=value, depth=depth)
            if merged is None or merged is NEVER:
                return merged
            out[key] = merged
        out = narrowed(out)
        return NEVER if out is NEVER or contradicts(out) else out

    def _closed(self, a: dict[str, Any], b: dict[str, Any], *, depth: int) -> Any:
        """Two objects, one limiting additional properties: a name one side declares meets
        the schema the other side gives it (its declaration, the one pattern matching it, or
        its `additionalProperties`); the other names meet both sides' `additionalProperties`.
        A side's patterns keep applying; so that the other side's `additionalProperties`
        need not follow names they match, it must then be open."""
        for one, other in ((a, b), (b, a)):
            if one.get("patternProperties") and _closes(other):
                return None
        split = [{k: v for k, v in s.items() if k not in OBJECT_PARTS} for s in (a, b)]
        out = self._keywords(*split, depth=depth)
        if out is None or out is NEVER:
            return out
        names = dict.fromkeys([*(a.get("properties") or {}), *(b.get("properties") or {})])
        properties = {}
        for name in names:
            pair = (value_schema(a, name), value_schema(b, name))
            merged = None if None in pair else self.merge(*pair, depth=depth + 1)
            if merged is None:
                return None
            properties[name] = False if merged is NEVER else merged
        extra_a, extra_b = (s.get("additionalProperties", {}) for s in (a, b))
        extra = self.merge(extra_a, extra_b, depth=depth + 1)
        if extra is None:
            return None
        out.update({"properties": properties} if properties else {})
        return {**out, "additionalProperties": False if extra is NEVER else extra}

    def _distribute(self, choice: dict[str, Any], other: Any, *, depth: int) -> Any:
        """(rest & (B1 | .. | Bn)) & other, as one anyOf without nesting."""
        rest = {k: v for k, v in choice.items() if k != "anyOf" and k not in ANNOTATIONS}
        branches: list[Any] = []
        for branch in choice["anyOf"]:
            merged = self.merge_all([rest, branch, other], depth=depth)
            if merged is None:
                return None
            if merged is not NEVER:
                branches.extend(merged["anyOf"] if _bare_any_of(merged) else [merged])
            if len(branches) > MAX_BRANCHES:
                return None
        if not branches:
            return NEVER
        return branches[0] if len(branches) == 1 else {"anyOf": branches}

    def _value(self, key: str, *, x: Any, y: Any, depth: int) -> Any:
        both_dicts = isinstance(x, dict) and isinstance(y, dict)
        if key in ("properties", "patternProperties") and both_dicts:
            return self._properties(x, y, depth=depth)
        if key == "items" and both_dicts:
            return self.merge(x, y, depth=depth + 1)
        return merge_scalar(key, x=x, y=y)

    def _properties(self, x: dict[str, Any], y: dict[str, Any], *, depth: int) -> Any:
        """Properties of both; a property no value can match is `false` (it may not
        appear)."""
        out = dict(x)
        for name, sub in y.items():
            merged = sub if name not in out else self.merge(out[name], sub, depth=depth + 1)
            if merged is None:
                return None
            out[name] = False if merged is NEVER else merged
        return out


def _sole_any_of(node: dict[str, Any]) -> bool:
    """An `anyOf` with no other combinator beside it."""
    return isinstance(node.get("anyOf"), list) and not any(k in node for k in ("allOf", "oneOf"))


def _bare_any_of(node: Any) -> bool:
    return isinstance(node, dict) and set(node) - ANNOTATIONS == {"anyOf"}


# Per JSON type, the pairs of bounds no value of that type can meet both of when low > high.
BOUND_PAIRS = {
    "string": (("minLength", "maxLength"),),
    "array": (("minItems", "maxItems"),),
    "object": (("minProperties", "maxProperties"),),
}


def contradicts(node: dict[str, Any]) -> bool:
    """Whether the bounds of a typed schema exclude every value of its types (xgrammar
    refuses such schemas rather than matching nothing)."""
    types = node_types(node)
    if not types:
        return False
    if types == {"integer"} and node.get("not") == {"type": "integer"}:
        return True
    return all(_empty_type(node, t) for t in types)


def _empty_type(node: dict[str, Any], type_name: str) -> bool:
    if type_name in ("number", "integer"):
        return _empty_range(node)
    lows = dict(BOUND_PAIRS.get(type_name, ()))
    for low, high in lows.items():
        if is_number(node.get(low)) and is_number(node.get(high)) and node[low] > node[high]:
            return True
    required = node.get("required") if type_name == "object" else None
    if not isinstance(required, list):
        return False
    properties = node.get("properties")
    if isinstance(properties, dict) and any(properties.get(n) is False for n in required):
        return True  # a required name that may not appear
    return is_number(node.get("maxProperties")) and len(set(required)) > node["maxProperties"]


def _empty_range(node: dict[str, Any]) -> bool:
    lows = [(node[k], k != "minimum") for k in ("minimum", "exclusiveMinimum") if k in node]
    highs = [(node[k], k != "maximum") for k in ("maximum", "exclusiveMaximum") if k in node]
    if not all(is_number(v) for v, _ in lows + highs) or not lows or not highs:
        return False
    low, high = max(lows, key=lambda p: (p[0], p[1])), min(highs, key=lambda p: (p[0], not p[1]))
    return low[0] > high[0] or (low[0] == high[0] and (low[1] or high[1]))


def _empty(node: Any) -> bool:
    """A schema without constraints."""
    return node is True or (isinstance(node, dict) and not set(node) - ANNOTATIONS)


def _conflicts(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Keywords whose meaning depends on sibling keywords of the same schema object."""
    for group in SIBLING_GROUPS:
        if any(k in a for k in group) and any(k in b for k in group):
            return True
    if any(k in s for s in (a, b) for k in ("unevaluatedProperties", "unevaluatedItems")):
        return True
    tuples = [k for k in TUPLE_KEYS if k in a or k in b]
    both = any(k in a for k in TUPLE_KEYS) and any(k in b for k in TUPLE_KEYS)
    return both and (tuples != ["items"] or not all(isinstance(s["items"], dict) for s in (a, b)))


def _closes(node: dict[str, Any]) -> bool:
    """`node` limits its additional properties."""
    return node.get("additionalProperties") not in (None, True, {})


def merge_scalar(key: str, *, x: Any, y: Any) -> Any:
    """Intersect two values of one non-schema keyword (None: no exact form)."""
    if key == "type":
        return _merge_types(x, y)
    if key == "required" and isinstance(x, list) and isinstance(y, list):
        return list(dict.fromkeys(x + y))
    if key in ("enum", "const"):
        return _merge_enum(key, x=x, y=y)
    if key in LOWER_BOUNDS + UPPER_BOUNDS and is_number(x) and is_number(y):
        return max(x, y) if key in LOWER_BOUNDS else min(x, y)
    steps = is_number(x) and is_number(y) and 0 < min(x, y) <= max(x, y) < math.inf
    if key == "multipleOf" and steps:
        return _common_multiple(x, y)
    if key == "pattern" and isinstance(x, str) and isinstance(y, str):
        both = intersection(x, y)  # None for a pattern without a DFA (or unanchored)
        return NEVER if both == NOTHING else both
    if key == "allOf" and isinstance(x, list) and isinstance(y, list):
        return x + y
    if key == "not":
        return {"anyOf": [x, y]}
    return None


def _common_multiple(x: Any, y: Any) -> Any:
    """The least common multiple of two steps, decimals too (lcm(1.5, 2) = 6): a multiple of
    both is one of it."""
    a, b = Fraction(repr(x)), Fraction(repr(y))
    both = Fraction(math.lcm(a.numerator, b.numerator), math.gcd(a.denominator, b.denominator))
    return both.numerator if both.denominator == 1 else float(both)


def _merge_types(x: Any, y: Any) -> Any:
    xs, ys = _type_set(x), _type_set(y)
    if xs is None or ys is None:
        return None
    both = xs & ys
    if ("integer" in xs and "number" in ys) or ("integer" in ys and "number" in xs):
        both.add("integer")
    ordered = sorted(both)
    return NEVER if not ordered else ordered[0] if len(ordered) == 1 else ordered


def _type_set(t: Any) -> set[str] | None:
    return {t} if isinstance(t, str) else set(t) if isinstance(t, list) else None


def _merge_enum(key: str, *, x: Any, y: Any) -> Any:
    xs = [x] if key == "const" else x
    ys = [y] if key == "const" else y
    if not isinstance(xs, list) or not isinstance(ys, list):
        return None
    keep = [v for v in xs if any(same(v, w) for w in ys)]
    if not keep:
        return NEVER
    return keep[0] if key == "const" else keep

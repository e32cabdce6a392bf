"""Type-specific keywords on a schema without `type`, split by JSON type.

JSON Schema applies `maxLength` to strings only, `properties` to objects only, and so on; a
value of another type passes them. xgrammar reads such a schema otherwise: it ignores string,
number and array keywords (`{"maxLength": 2}` accepts `"abc"`) and takes object keywords to
mean an object (`{"properties": ...}` rejects `1`). The exact form is an `anyOf` with one
branch per type that has keywords (the keywords under their own type) and one branch for the
other types:

    {"maxLength": 2, "minimum": 1}
    == {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "number", "minimum": 1},
                  {"type": ["null", "boolean", "object", "array"]}]}

The branches are disjoint by type. Nodes with `enum`/`const` (their values already fix the
types), a `$ref` or a combinator keep their form (the warning walker reports them).
"""

from __future__ import annotations

import math
from typing import Any

from plait.backend.grammar.schema.utils import ANNOTATIONS, same

# The keywords that apply to one JSON type only ("number" covers integers).
TYPE_ONLY = {
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "array": (
        "items",
        "prefixItems",
        "additionalItems",
        "minItems",
        "maxItems",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "unevaluatedItems",
    ),
    "object": (
        "properties",
        "patternProperties",
        "additionalProperties",
        "required",
        "minProperties",
        "maxProperties",
        "dependentRequired",
        "dependentSchemas",
        "propertyNames",
        "unevaluatedProperties",
    ),
}
JSON_TYPES = ("null", "boolean", "object", "array", "number", "string")
_OWNER = {keyword: type_name for type_name, ks in TYPE_ONLY.items() for keyword in ks}


def split_by_type(node: dict[str, Any]) -> dict[str, Any]:
    """`node` as an anyOf over JSON types when it has type-specific keywords and no `type`
    (above); else `node` itself."""
    keywords = set(node) - ANNOTATIONS
    if "type" in node or not keywords or not keywords <= set(_OWNER):
        return node
    branches: dict[str, dict[str, Any]] = {}
    for keyword in node:
        if keyword in _OWNER:
            branches.setdefault(_OWNER[keyword], {"type": _OWNER[keyword]})[keyword] = node[keyword]
    others = [t for t in JSON_TYPES if t not in branches]
    rest = [{"type": others if len(others) > 1 else others[0]}] if others else []
    annotations = {k: v for k, v in node.items() if k in ANNOTATIONS}
    return {**annotations, "anyOf": [*branches.values(), *rest]}


COUNTS = (
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
)


def whole_counts(node: dict[str, Any]) -> None:
    """Counts written as whole floats (`maxItems: 2.0`, which JSON Schema allows and
    xgrammar refuses) as integers; `minContains`/`maxContains` without `contains` (which
    mean nothing, and xgrammar reads as item counts) dropped (in place)."""
    for key in COUNTS:
        value = node.get(key)
        if isinstance(value, float) and value.is_integer():
            node[key] = int(value)
    if "contains" not in node:
        node.pop("minContains", None)
        node.pop("maxContains", None)


def whole_bounds(node: dict[str, Any]) -> None:
    """An integer's fractional bounds as whole ones (`minimum: 0.5` is `minimum: 1`), which
    JSON Schema allows and xgrammar refuses (in place)."""
    if node.get("type") != "integer":
        return
    rounded = {
        "minimum": ("minimum", math.ceil),
        "exclusiveMinimum": ("minimum", lambda b: math.floor(b) + 1),
        "maximum": ("maximum", math.floor),
        "exclusiveMaximum": ("maximum", lambda b: math.ceil(b) - 1),
    }
    for key, (whole, rounding) in rounded.items():
        bound = node.get(key)
        if isinstance(bound, float) and math.isfinite(bound) and not bound.is_integer():
            del node[key]
            value = rounding(bound)
            node[whole] = (
                max(node.get(whole, value), value)
                if whole == "minimum"
                else min(node.get(whole, value), value)
            )


def drop_inapplicable(node: dict[str, Any]) -> None:
    """Keywords of types the node's `type` excludes (`multipleOf` beside `"type": "null"`)
    dropped: they constrain no value it allows (in place)."""
    types = node.get("type")
    names = {types} if isinstance(types, str) else set(types) if isinstance(types, list) else None
    if names is None:
        return
    if "integer" in names:
        names.add("number")
    for keyword in [k for k in node if k in _OWNER and _OWNER[k] not in names]:
        del node[keyword]


def negations(node: dict[str, Any]) -> None:
    """`not` of a bare `type` as the complement types, `not` of `enum`/`const` as fewer
    `enum` values, where that is exact (in place). Left as is: a negated `integer` without
    `number` (the numbers that are not integers have no type), or nothing left."""
    negated = node.get("not")
    if not isinstance(negated, dict) or set(negated) - ANNOTATIONS - {"type", "enum", "const"}:
        return
    keys = set(negated) - ANNOTATIONS
    if keys == {"type"}:
        _negate_type(node, negated["type"])
    elif len(keys) == 1 and isinstance(node.get("enum"), list):
        banned = negated["enum"] if "enum" in keys else [negated.get("const")]
        if isinstance(banned, list):
            kept = [v for v in node["enum"] if not any(same(v, b) for b in banned)]
            if kept:
                node["enum"] = kept
                del node["not"]


def _negate_type(node: dict[str, Any], negated: Any) -> None:
    banned = {negated} if isinstance(negated, str) else set(negated or [])
    if not banned <= set(JSON_TYPES) | {"integer"} or ("integer" in banned) > ("number" in banned):
        return
    allowed = [t for t in JSON_TYPES if t not in banned]
    own = node.get("type", list(JSON_TYPES))
    own_set = {own} if isinstance(own, str) else set(own) if isinstance(own, list) else None
    if own_set is None:
        return
    if "number" in allowed:
        allowed.append("integer")
    kept = [t for t in (own if isinstance(own, list) else [own]) if t in allowed]
    if kept:
        node["type"] = kept[0] if len(kept) == 1 else kept
        del node["not"]

"""Boolean subschemas (`true`, `false`) written as objects xgrammar compiles.

xgrammar refuses `false` anywhere ("cannot accept any value") and `true` in some places
(`prefixItems: [true]`). Exact rewrites, bottom-up:

- `true` as a subschema is `{}`; `not: true` is `false`, `not: false` is dropped;
- `false` in `allOf` makes the schema `false`; `false` branches of `anyOf`/`oneOf` are
  dropped (no branch left: `false`);
- a property whose schema is `false` may not appear: an object schema that requires it is
  `false`; otherwise it is removed from `properties` and kept out of the other names
  (objects.ban_names); where that has no form (see there; a required name on a schema
  without a type) it becomes `{"not": {}}`, which the warning walker reports (`not` is not
  enforced);
- `propertyNames: false` is `maxProperties: 0`; a `false` pattern schema is `{"not": {}}`;
- `prefixItems` up to the first `false` item, with `maxItems` at that index; `items: false`
  is `maxItems` at the length of `prefixItems`.

A `false` left elsewhere (the whole schema, `contains: false`) stays, and compiling it fails
with xgrammar's message.
"""

from __future__ import annotations

import math
from typing import Any

from plait.backend.grammar.schema.objects import ObjectForm, ban_names
from plait.backend.grammar.schema.utils import (
    SUBSCHEMA_LISTS,
    SUBSCHEMA_MAPS,
    SUBSCHEMA_ONES,
    is_number,
)

OPEN = ObjectForm()
KEEP_BOOLEAN = (
    "additionalProperties",
    "unevaluatedProperties",
    "unevaluatedItems",
    "if",
    "propertyNames",
)


def booleans_as_objects(node: Any, *, form: ObjectForm = OPEN) -> Any:
    """`node` with its boolean subschemas rewritten (above); True/False for a boolean node
    left as it is (its parent decides); `form`: what keeping names out may assume."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        out[key] = _child(key, value, form=form)
    for rule in (_combinators, _not, _names, _items):
        out = rule(out)
        if out is False:
            return False
    return _properties(out, form=form)


def _child(key: str, value: Any, *, form: ObjectForm) -> Any:
    if key in SUBSCHEMA_LISTS and isinstance(value, list):
        return [booleans_as_objects(v, form=form) for v in value]
    if key in SUBSCHEMA_MAPS and isinstance(value, dict):
        return {name: booleans_as_objects(v, form=form) for name, v in value.items()}
    if key in SUBSCHEMA_ONES:
        sub = booleans_as_objects(value, form=form)
        return {} if sub is True and key not in KEEP_BOOLEAN else sub
    return value


def _combinators(node: dict[str, Any]) -> Any:
    if isinstance(node.get("allOf"), list):
        if any(b is False for b in node["allOf"]):
            return False
        node["allOf"] = [{} if b is True else b for b in node["allOf"]]
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            branches = [{} if b is True else b for b in node[key] if b is not False]
            if not branches:
                return False
            node[key] = branches
    return node


def _not(node: dict[str, Any]) -> Any:
    if node.get("not") == {}:
        return False
    if node.get("not") is False:
        del node["not"]
    return node


def _names(node: dict[str, Any]) -> Any:
    """`propertyNames: false` allows only `{}`; `false` pattern schemas become `not: {}`."""
    names = node.get("propertyNames")
    if names is False or names is True:
        del node["propertyNames"]
        if names is False:
            node["maxProperties"] = 0
    patterns = node.get("patternProperties")
    if isinstance(patterns, dict):
        node["patternProperties"] = {
            k: {"not": {}} if v is False else {} if v is True else v for k, v in patterns.items()
        }
    return node


def _properties(node: dict[str, Any], *, form: ObjectForm) -> Any:
    properties = node.get("properties")
    if not isinstance(properties, dict):
        return node
    # `{"not": {}}`: a `false` an earlier pass could not keep out (patterns not yet anchored)
    banned = [name for name, sub in properties.items() if sub is False or sub == {"not": {}}]
    required = node.get("required") or []
    # an object needing a banned name cannot exist; other types are untouched by `properties`
    if node.get("type") == "object" and any(n in required for n in banned):
        return False
    bannable = banned and not set(banned) & set(required)
    kept_out = ban_names(node, banned, form=form) if bannable else None
    node = node if kept_out is None else kept_out
    if isinstance(node.get("properties"), dict):
        node["properties"] = {
            name: ({"not": {}} if sub is False else {} if sub is True else sub)
            for name, sub in node["properties"].items()
        }
    return node


def _items(node: dict[str, Any]) -> Any:
    prefix = node.get("prefixItems")
    if isinstance(prefix, list):
        cut = next((i for i, sub in enumerate(prefix) if sub is False), None)
        if cut is not None:
            node["prefixItems"] = prefix[:cut]
            node["maxItems"] = min(cut, node.get("maxItems", cut))
            node.pop("items", None)
        node["prefixItems"] = [{} if sub is True else sub for sub in node["prefixItems"]]
    if node.get("items") is False:
        del node["items"]
        count = len(node.get("prefixItems") or [])
        node["maxItems"] = min(count, node.get("maxItems", count))
    if node.get("prefixItems") == []:
        del node["prefixItems"]
    low, high = node.get("minItems", 0), node.get("maxItems", math.inf)
    if node.get("type") == "array" and is_number(low) and is_number(high) and low > high:
        return False  # fewer items may be written than are needed
    return node

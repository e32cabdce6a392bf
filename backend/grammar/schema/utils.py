"""Small JSON Schema helpers shared by the rewrite and the warning walker: local `$ref`
resolution, regex anchor analysis, JSON types, and whether `oneOf` branches are disjoint."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeGuard

MAX_INTEGER_STEP = 1024  # xgrammar ignores a larger integer multipleOf
# Where a schema holds subschemas: lists of them, maps of name -> subschema, and single ones
# (`items` is both: one schema, or draft 4's list).
SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SUBSCHEMA_ONES = (
    "items",
    "additionalProperties",
    "additionalItems",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
)
ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "id",
        "$comment",
        "$defs",
        "definitions",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$anchor",
    }
)


class Never:
    """The schema no value satisfies, as the rewrites' intersections and negations find it."""

    def __repr__(self) -> str:
        return "NEVER"


NEVER = Never()


def map_subschemas(node: Any, rule: Callable[[dict[str, Any]], Any]) -> Any:
    """`node` with `rule` applied bottom-up to every schema object in it (a copy)."""
    if not isinstance(node, dict):
        return node
    return rule(map_children(node, lambda child: map_subschemas(child, rule)))


def map_children(node: dict[str, Any], change: Callable[[Any], Any]) -> dict[str, Any]:
    """A copy of `node` with `change` applied to each of its direct subschemas."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if (key in SUBSCHEMA_LISTS or key == "items") and isinstance(value, list):
            out[key] = [change(v) for v in value]
        elif key in SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: change(v) for name, v in value.items()}
        elif key in SUBSCHEMA_ONES:
            out[key] = change(value)
        else:
            out[key] = value
    return out


def needs_escape(name: str) -> bool:
    """Whether JSON writes `name` with escape sequences (which xgrammar does not match in
    property names and patterns)."""
    return any(ch in '"\\' or ord(ch) < 0x20 for ch in name)


def searches(pattern: str, text: str) -> bool | None:
    """Whether `pattern` finds a match in `text`; None for a pattern Python cannot read."""
    try:
        return re.search(pattern, text) is not None
    except re.error:
        return None


def resolve_ref(root: Any, ref: str) -> Any:
    """The subschema a local `$ref` ("#/a/b") points at, or None."""
    node = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


@dataclass(frozen=True)
class PatternShape:
    """Where a regex has unescaped ^/$ (outside classes) and whether it has a top-level |."""

    anchors: tuple[int, ...]
    top_level_bar: bool
    length: int

    @property
    def starts(self) -> bool:
        return 0 in self.anchors

    @property
    def ends(self) -> bool:
        return self.length > 0 and self.length - 1 in self.anchors

    @property
    def inner_anchors(self) -> bool:
        """Anchors that do not simply bound the whole pattern."""
        inner = any(a not in (0, self.length - 1) for a in self.anchors)
        return inner or (self.top_level_bar and bool(self.anchors))


def pattern_shape(pattern: str) -> PatternShape:
    anchors, bar = [], False
    escaped, in_class, depth = False, False, 0
    for i, ch in enumerate(pattern):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch in "()":
            depth += 1 if ch == "(" else -1
        elif ch in "^$":
            anchors.append(i)
        elif ch == "|" and depth == 0:
            bar = True
    return PatternShape(tuple(anchors), bar, len(pattern))


def has_type(value: Any, types: set[str]) -> bool:
    kinds = {
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "null": value is None,
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
    }
    return any(kinds.get(t, False) for t in types)


def node_types(node: dict[str, Any]) -> set[str]:
    t = node.get("type")
    return {t} if isinstance(t, str) else set(t) if isinstance(t, list) else set()


def disjoint(root: Any, branches: list[Any]) -> bool:
    """Whether no value can match two branches (so anyOf == oneOf): distinct types, distinct
    constants, or a required discriminator property with distinct constants."""
    nodes = [_deref(root, b) for b in branches]
    if not all(isinstance(n, dict) for n in nodes):
        return False
    return (
        _distinct(_type_sig(n) for n in nodes)
        or _distinct(_const_sig(n) for n in nodes)
        or (_discriminated(root, nodes))
    )


def _deref(root: Any, node: Any) -> Any:
    for _ in range(8):
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            node = resolve_ref(root, node["$ref"])
    return node


def _type_sig(node: dict[str, Any]) -> frozenset[str] | None:
    types = node_types(node)
    if not types or "enum" in node or "const" in node:
        return None if not types else frozenset(types)
    numeric = {"integer", "number"} if types & {"integer", "number"} else set()
    return frozenset(types | numeric)


def _const_sig(node: dict[str, Any]) -> frozenset[str] | None:
    if "const" in node:
        return frozenset([json.dumps(node["const"], sort_keys=True)])
    if isinstance(node.get("enum"), list):
        return frozenset(json.dumps(v, sort_keys=True) for v in node["enum"])
    return None


def _distinct(sigs: Iterator[frozenset[str] | None]) -> bool:
    seen: set[str] = set()
    for sig in sigs:
        if sig is None or sig & seen:
            return False
        seen |= sig
    return True


def _discriminated(root: Any, nodes: list[dict[str, Any]]) -> bool:
    shared = set.intersection(*(set(n.get("required") or []) for n in nodes))
    for name in sorted(shared):
        props = [_deref(root, (n.get("properties") or {}).get(name)) for n in nodes]
        sigs = (_const_sig(p) if isinstance(p, dict) else None for p in props)
        if _distinct(sigs):
            return True
    return False


def same(x: Any, y: Any) -> bool:
    """JSON equality (1 and 1.0 are one number; key order does not matter)."""
    return json.dumps(whole(x), sort_keys=True) == json.dumps(whole(y), sort_keys=True)


def whole(value: Any) -> Any:
    """`value` with every whole float written as an int."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [whole(v) for v in value]
    if isinstance(value, dict):
        return {k: whole(v) for k, v in value.items()}
    return value


def is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)

"""Rewrite a JSON Schema into an equivalent one that xgrammar enforces more of.

xgrammar's converter drops every keyword that sits beside `allOf`/`anyOf`/`oneOf` and drops
multi-branch `allOf` altogether. Both have exact rewrites:

    S and allOf[B1..Bn]  ==  merge(S, B1, .., Bn)
    S and anyOf[B1..Bn]  ==  anyOf[merge(S, B1), .., merge(S, Bn)]      (oneOf alike)

`merge` intersects two schemas only where it can do so exactly (types, required, bounds, enum,
properties, ...); anything else leaves the node as it was, and the warning walker reports what
the grammar cannot enforce there. Branches that are pure `$ref`s are inlined for the merge.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from plait.backend.grammar.schema.booleans import booleans_as_objects
from plait.backend.grammar.schema.formats import format_patterns
from plait.backend.grammar.schema.lengths import lengths_into_pattern
from plait.backend.grammar.schema.refs import resolve_refs
from plait.backend.grammar.schema.types import negations, split_by_type, whole_counts
from plait.backend.grammar.schema.utils import (
    ANNOTATIONS,
    MAX_INTEGER_STEP,
    SUBSCHEMA_LISTS,
    SUBSCHEMA_MAPS,
    SUBSCHEMA_ONES,
    pattern_shape,
    resolve_ref,
)

COMBINATORS = ("allOf", "anyOf", "oneOf")
LIST_KEYS = (*SUBSCHEMA_LISTS, "items")  # draft 4: `items` as a list
LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
# Keywords read together within one schema object: merging two objects that each hold some
# of a group would make one's keyword apply to the other's (`if` of one, `then` of another).
SIBLING_GROUPS = (("if", "then", "else"), ("contains", "minContains", "maxContains"))
TUPLE_KEYS = ("prefixItems", "items", "additionalItems", "unevaluatedItems")
MAX_DEPTH = 4
MAX_STEPS = 5000
MAX_COPIED_CHARS = 2_000_000  # JSON the merges may copy, in all (a small schema can ask more)


class _Never:
    """The result of merging schemas no value can satisfy."""


NEVER = _Never()
ANY_TEXT = "[\\s\\S]*"


def _integral_steps(node: dict[str, Any]) -> None:
    """A number with a whole `multipleOf` (5, 2.0) is an integer (JSON Schema counts 10.0 as
    one): the type becomes integer, which xgrammar steps exactly up to MAX_INTEGER_STEP (in
    place)."""
    step, types = node.get("multipleOf"), node.get("type")
    if not isinstance(step, (int, float)) or isinstance(step, bool):
        return
    if not 1 <= step <= MAX_INTEGER_STEP or step % 1 or "number" not in str(types):
        return
    node["multipleOf"] = int(step)
    if types == "number":
        node["type"] = "integer"
    elif isinstance(types, list):
        node["type"] = list(dict.fromkeys("integer" if t == "number" else t for t in types))


def rewrite_schema(schema: Any) -> Any:
    """An equivalent schema with combinators merged with their sibling keywords."""
    if not isinstance(schema, dict):
        return schema
    resolved = resolve_refs(schema)
    # refs left as they were may point anywhere in the tree: then no node may move
    movable = resolved is not schema or '"$ref"' not in json.dumps(schema)
    schema = booleans_as_objects(resolved)
    if not isinstance(schema, dict):
        return schema
    rewriter = _Rewriter(schema, split_types=movable)
    return rewriter.node(copy.deepcopy(schema), 0)


class _Rewriter:
    """Bottom-up rewrite; `steps` bounds the work on huge or deeply recursive schemas;
    `split_types`: whether an untyped node may become an anyOf over types (which moves it)."""

    def __init__(self, root: dict[str, Any], *, split_types: bool = True) -> None:
        self.root = root
        self.steps = 0
        self.split_types = split_types
        self.copied = 0

    def _spend(self, value: Any) -> bool:
        """Count `value`'s JSON against MAX_COPIED_CHARS; False once past it."""
        self.copied += len(json.dumps(value))
        return self.copied <= MAX_COPIED_CHARS

    def node(self, node: Any, depth: int, *, branch: bool = False) -> Any:
        """`node` rewritten; a combinator's `branch` is split by type (types.py) only after
        the merge with its siblings, which may give it a type."""
        if not isinstance(node, dict) or depth > MAX_DEPTH or self.steps > MAX_STEPS:
            return node
        self.steps += 1
        node = {key: self._child(key, value, depth=depth) for key, value in node.items()}
        return self._local(node, depth) if branch else self._split(node, depth)

    def _split(self, node: dict[str, Any], depth: int) -> Any:
        split = self._by_type(node, depth)
        return self._local(node, depth) if split is node else split

    def _by_type(self, node: Any, depth: int) -> Any:
        """`node` as an anyOf over types (types.py), each branch rewritten; else itself."""
        if not (self.split_types and isinstance(node, dict)):
            return node
        split = split_by_type(node)
        if split is not node:
            split["anyOf"] = [self._local(branch, depth) for branch in split["anyOf"]]
        return split

    def _local(self, node: dict[str, Any], depth: int) -> Any:
        """The rewrites of one node whose children are rewritten already."""
        whole_counts(node)
        negations(node)
        _anchor_patterns(node)
        _integral_steps(node)
        format_patterns(node)
        if "allOf" in node:
            node = self._flatten_all_of(node, depth)
        kinds = [k for k in COMBINATORS if k in node]
        if len(kinds) == 1 and kinds[0] != "allOf":
            node = self._distribute(node, kind=kinds[0], depth=depth)
        for kind in ("anyOf", "oneOf"):  # branches left untyped by the merge
            if isinstance(node.get(kind), list):
                node[kind] = [self._by_type(b, depth) for b in node[kind]]
        return lengths_into_pattern(node)

    def _child(self, key: str, value: Any, *, depth: int) -> Any:
        if key in SUBSCHEMA_MAPS and isinstance(value, dict):
            return {name: self.node(sub, depth) for name, sub in value.items()}
        if key in LIST_KEYS and isinstance(value, list):
            return [self.node(sub, depth, branch=key in COMBINATORS) for sub in value]
        if key in SUBSCHEMA_ONES and isinstance(value, dict):
            return self.node(value, depth)
        return value

    def _flatten_all_of(self, node: dict[str, Any], depth: int) -> dict[str, Any]:
        """S and allOf[...] -> one schema, when every branch merges exactly."""
        merged: Any = _constraints(node, drop=("allOf",))
        for branch in node["allOf"]:
            merged = self.merge(merged, self._inline(branch, depth), depth=depth)
            if merged is None or merged is NEVER:
                return node
        out = {**_annotations(node), **merged}
        return self.node(out, depth + 1) if any(k in out for k in COMBINATORS) else out

    def _distribute(self, node: dict[str, Any], *, kind: str, depth: int) -> dict[str, Any]:
        """S and anyOf[B...] -> anyOf[S and B, ...]; branches S rules out are dropped."""
        rest = _constraints(node, drop=(kind,))
        if not rest or not isinstance(node[kind], list):
            return node
        branches = []
        for branch in node[kind]:
            if not self._spend(rest):
                return node
            merged = self.merge(rest, self._inline(branch, depth), depth=depth)
            if merged is None:
                return node
            if merged is not NEVER:
                branches.append(self.node(merged, depth + 1))
        if not branches:
            return node
        return {**_annotations(node), kind: branches}

    def _inline(self, branch: Any, depth: int) -> Any:
        """A pure `$ref` branch replaced by (a rewritten copy of) its target."""
        if not isinstance(branch, dict) or "$ref" not in branch:
            return branch
        if set(branch) - ANNOTATIONS - {"$ref"} or not str(branch["$ref"]).startswith("#"):
            return None
        target = resolve_ref(self.root, str(branch["$ref"]))
        if not isinstance(target, dict) or depth >= MAX_DEPTH or not self._spend(target):
            return None
        return self.node(copy.deepcopy(target), depth + 1, branch=True)

    # --- intersection -----------------------------------------------------------------
    def merge(self, a: Any, b: Any, *, depth: int) -> Any:
        """The schema of values matching both `a` and `b`; None when that has no exact
        form here, NEVER when no value matches both."""
        if a is False or b is False:
            return NEVER
        a = {} if a is True else self._inline(a, depth)
        b = {} if b is True else self._inline(b, depth)
        if not isinstance(a, dict) or not isinstance(b, dict) or _conflicts(a, b):
            return None
        out = dict(a)
        for key, value in b.items():
            if key in ANNOTATIONS:
                continue
            merged = (
                value
                if key not in out
                else self._merge_value(key, x=out[key], y=value, depth=depth)
            )
            if merged is None or merged is NEVER:
                return merged
            out[key] = merged
        return out

    def _merge_value(self, key: str, *, x: Any, y: Any, depth: int) -> Any:
        if _same(x, y):
            return x
        both_dicts = isinstance(x, dict) and isinstance(y, dict)
        if key in ("properties", "patternProperties") and both_dicts:
            return self._merge_properties(x, y, depth=depth)
        return _merge_scalar(key, x=x, y=y)

    def _merge_properties(self, x: dict[str, Any], y: dict[str, Any], *, depth: int) -> Any:
        out = dict(x)
        for name, sub in y.items():
            merged = sub if name not in out else self.merge(out[name], sub, depth=depth + 1)
            if merged is None or merged is NEVER:
                return None
            out[name] = merged
        return out


def search_pattern(pattern: str) -> str:
    """A regex whose whole-string match is `pattern`'s search semantics (JSON Schema
    patterns are unanchored; xgrammar matches the whole string). Patterns with anchors
    inside are left alone."""
    shape = pattern_shape(pattern)
    if shape.inner_anchors or (shape.starts and shape.ends):
        return pattern
    body = pattern[1 if shape.starts else 0 : len(pattern) - 1 if shape.ends else len(pattern)]
    head = "^" if shape.starts else "^" + ANY_TEXT
    tail = "$" if shape.ends else ANY_TEXT + "$"
    return f"{head}(?:{body}){tail}"


def _anchor_patterns(node: dict[str, Any]) -> None:
    if isinstance(node.get("pattern"), str):
        node["pattern"] = search_pattern(node["pattern"])
    if isinstance(node.get("patternProperties"), dict):
        patterns = node["patternProperties"]
        node["patternProperties"] = {search_pattern(k): v for k, v in patterns.items()}


def _constraints(node: dict[str, Any], *, drop: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k not in ANNOTATIONS and k not in drop}


def _annotations(node: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k in ANNOTATIONS}


def _conflicts(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Keywords whose meaning depends on sibling keywords of the same schema object."""
    if _closes_over(a, b) or _closes_over(b, a):
        return True
    for group in SIBLING_GROUPS:
        if any(k in a for k in group) and any(k in b for k in group):
            return True
    if any(k in s for s in (a, b) for k in ("unevaluatedProperties", "unevaluatedItems")):
        return True
    tuples = [k for k in TUPLE_KEYS if k in a or k in b]
    both = any(k in a for k in TUPLE_KEYS) and any(k in b for k in TUPLE_KEYS)
    return both and (tuples != ["items"] or not all(isinstance(s["items"], dict) for s in (a, b)))


def _closes_over(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """`a` limits additional properties and `b` declares properties `a` does not."""
    limit = any(a.get(k) not in (None, True, {}) for k in ("additionalProperties",))
    if not limit and "unevaluatedProperties" not in a:
        return False
    extra = set(b.get("properties") or {}) - set(a.get("properties") or {})
    return bool(extra) or "patternProperties" in b


def _same(x: Any, y: Any) -> bool:
    return json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)


def _numbers(x: Any, y: Any) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))


def _merge_scalar(key: str, *, x: Any, y: Any) -> Any:
    """Intersect two values of one non-schema keyword (None: no exact form)."""
    if key == "type":
        return _merge_types(x, y)
    if key == "required" and isinstance(x, list) and isinstance(y, list):
        return list(dict.fromkeys(x + y))
    if key in ("enum", "const"):
        return _merge_enum(key, x=x, y=y)
    if key in LOWER_BOUNDS + UPPER_BOUNDS and _numbers(x, y):
        return max(x, y) if key in LOWER_BOUNDS else min(x, y)
    if key == "allOf" and isinstance(x, list) and isinstance(y, list):
        return x + y
    if key == "not":
        return {"anyOf": [x, y]}
    return None


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
    keep = [v for v in xs if any(_same(v, w) for w in ys)]
    if not keep:
        return NEVER
    return keep[0] if key == "const" else keep

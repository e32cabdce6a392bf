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
import functools
import json
from typing import Any

from plait.backend.grammar.schema.booleans import booleans_as_objects
from plait.backend.grammar.schema.conditions import Conditions
from plait.backend.grammar.schema.formats import format_patterns
from plait.backend.grammar.schema.hoist import Hoister
from plait.backend.grammar.schema.lengths import lengths_into_pattern
from plait.backend.grammar.schema.merge import Merger, contradicts
from plait.backend.grammar.schema.negate import Negator
from plait.backend.grammar.schema.numbers import integral_steps
from plait.backend.grammar.schema.objects import ObjectForm, objects_as_enforced
from plait.backend.grammar.schema.refs import resolve_refs
from plait.backend.grammar.schema.types import (
    drop_inapplicable,
    negations,
    split_by_type,
    whole_bounds,
    whole_counts,
)
from plait.backend.grammar.schema.utils import (
    ANNOTATIONS,
    NEVER,
    SUBSCHEMA_LISTS,
    SUBSCHEMA_MAPS,
    SUBSCHEMA_ONES,
    pattern_shape,
    resolve_ref,
)
from plait.backend.grammar.schema.values import narrowed

COMBINATORS = ("allOf", "anyOf", "oneOf")
LIST_KEYS = (*SUBSCHEMA_LISTS, "items")  # draft 4: `items` as a list
MAX_DEPTH = 4
MAX_STEPS = 5000
MAX_COPIED_CHARS = 2_000_000  # JSON the merges may copy, in all (a small schema can ask more)
ANY_TEXT = "[\\s\\S]*"


def rewrite_schema(schema: Any, *, strict_mode: bool = False) -> Any:
    """An equivalent schema with combinators merged with their sibling keywords;
    `strict_mode`: as xgrammar's, objects without `additionalProperties` are closed."""
    if not isinstance(schema, dict):
        return schema
    resolved = resolve_refs(schema)
    # refs left as they were may point anywhere in the tree: then no node may move
    movable = resolved is not schema or '"$ref"' not in json.dumps(schema)
    form = ObjectForm(closed=strict_mode, evaluated='"unevaluated' in json.dumps(schema))
    schema = booleans_as_objects(resolved, form=form)
    if not isinstance(schema, dict):
        return schema
    rewriter = _Rewriter(schema, split_types=movable)
    rewritten = rewriter.node(copy.deepcopy(schema), 0)
    if rewriter.conditional:  # schemas with a grammar rule of their own go under `$defs`
        rewritten = rewriter.hoister().hoist(rewritten)
    return booleans_as_objects(objects_as_enforced(rewritten, form=form), form=form)


class _Rewriter:
    """Bottom-up rewrite; `steps` bounds the work on huge or deeply recursive schemas;
    `split_types`: whether an untyped node may become an anyOf over types (which moves it)."""

    def __init__(self, root: dict[str, Any], *, split_types: bool = True) -> None:
        self.root = root
        self.steps = 0
        self.split_types = split_types
        self.copied = 0
        # unevaluated* read which keywords evaluated what, and refs left as written (with
        # their `$id`s) may point into any subschema: there conditions (and arrays with
        # `contains`) keep their own form
        self.conditional = split_types and '"unevaluated' not in json.dumps(root)
        self.merger = Merger(inline=self._inline)
        self.negator = Negator(merger=self.merger, inline=self._inline, root=root)
        self.conditions = Conditions(merger=self.merger, negator=self.negator)

    def hoister(self) -> Hoister:
        """Moves arrays that need a rule of their own, their item defs rewritten here."""
        rewrite = functools.partial(self.node, depth=1)
        return Hoister(merger=self.merger, negator=self.negator, rewrite=rewrite)

    def merge(self, a: Any, b: Any, *, depth: int) -> Any:
        return self.merger.merge(a, b, depth=depth)

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
        for rule in (whole_counts, drop_inapplicable, integral_steps, whole_bounds):
            rule(node)
        node = narrowed(node)
        if node is NEVER or contradicts(node):
            return False
        negations(node)
        _anchor_patterns(node)
        format_patterns(node)
        rewritten = self._conditions(node, depth)
        if rewritten is not node:
            return rewritten
        if "allOf" in node:
            node = self._flatten_all_of(node, depth)
            if not isinstance(node, dict):
                return node
        kinds = [k for k in COMBINATORS if k in node]
        if len(kinds) == 1 and kinds[0] != "allOf":
            node = self._distribute(node, kind=kinds[0], depth=depth)
            if not isinstance(node, dict):
                return node
        for kind in ("anyOf", "oneOf"):  # branches left untyped by the merge
            if isinstance(node.get(kind), list):
                node[kind] = [self._by_type(b, depth) for b in node[kind]]
        return lengths_into_pattern(node)

    def _conditions(self, node: dict[str, Any], depth: int) -> Any:
        """`not`, `if`/`then`/`else` and dependencies merged into the node as anyOfs
        (conditions.py), each where its form is exact; the result is rewritten again."""
        found = self.conditions.found(node, depth=depth) if self.conditional else []
        if not found:
            return node
        used = {k for condition in found for k in condition.keywords}
        merged: Any = _constraints(node, drop=tuple(used))
        for condition in found:
            both = self.merge(merged, condition.schema, depth=depth)
            if both is NEVER:
                return False
            if both is None or not self._spend(both):
                merged.update({k: node[k] for k in condition.keywords if k in node})
            else:
                merged = both
        return self.node({**_annotations(node), **merged}, depth + 1)

    def _child(self, key: str, value: Any, *, depth: int) -> Any:
        if key in SUBSCHEMA_MAPS and isinstance(value, dict):
            return {name: self.node(sub, depth) for name, sub in value.items()}
        if key in LIST_KEYS and isinstance(value, list):
            return [self.node(sub, depth, branch=key in COMBINATORS) for sub in value]
        if key in SUBSCHEMA_ONES and isinstance(value, dict):
            return self.node(value, depth)
        return value

    def _flatten_all_of(self, node: dict[str, Any], depth: int) -> Any:
        """S and allOf[...] -> one schema, when every branch merges exactly."""
        merged: Any = _constraints(node, drop=("allOf",))
        for branch in node["allOf"]:
            merged = self.merge(merged, self._inline(branch, depth), depth=depth)
            if merged is None or merged is NEVER:
                return node if merged is None else False
        out = {**_annotations(node), **merged}
        return self.node(out, depth + 1)

    def _distribute(self, node: dict[str, Any], *, kind: str, depth: int) -> Any:
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
            return False
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

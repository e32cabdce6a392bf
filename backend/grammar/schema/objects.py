"""Object keywords written in the forms xgrammar enforces: required names declared, names that
may not appear kept out.

- `patternProperties` beside open additional properties: the other names (neither declared
  nor matched by a pattern) become one more pattern, with the schema of
  `additionalProperties`, which becomes `false` (xgrammar would let a name a pattern matches
  take the additional properties' schema instead).
- A `required` name missing from `properties` is not enforced by xgrammar; it is declared
  with the schema its value has anyway: that of the one `patternProperties` pattern matching
  it, else `additionalProperties` (`{}` when open). When it can have no value at all
  (`additionalProperties: false`, no pattern), an object schema is false; with several
  matching patterns, or a name JSON writes with escapes, the name stays undeclared (warned).
- A name that may not appear (a `false` property: `dependentRequired` and `not required`
  write them) is removed from `properties` and from the names each `patternProperties`
  pattern matches (the pattern intersected with that of every other name, automata.py).
  Unless the object is closed, the additional names then become one more pattern, of the
  names neither declared, nor banned, nor matched by another pattern, with the schema of
  `additionalProperties`, which becomes `false` (`ban_names`). (xgrammar keeps declared
  names out of the additional ones itself, but has no way to keep out others: a
  `propertyNames` pattern would let declared names in again as additional ones.) Not
  done where a pattern has no DFA, the pattern of the other names passes
  `MAX_NAMES_CHARS`, or `unevaluatedProperties` reads which keyword evaluated a name (then
  booleans.py leaves `{"not": {}}`, warned).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plait.backend.grammar.schema.automata import NOTHING, complement, intersection, outside
from plait.backend.grammar.schema.utils import map_subschemas, needs_escape, searches

MAX_NAMES_CHARS = 20_000  # the pattern of the other names of an object, at most


@dataclass(frozen=True)
class ObjectForm:
    """What the object rewrites may assume: `closed`, an object without
    `additionalProperties` allows no other names (xgrammar's strict mode); `evaluated`,
    `unevaluatedProperties` somewhere reads which keyword evaluated each name, so no name
    may move under a pattern of the other names."""

    closed: bool = False
    evaluated: bool = False


def objects_as_enforced(schema: Any, *, form: ObjectForm) -> Any:
    """`schema` with every object's required names declared and its other names under a
    pattern of their own beside `patternProperties` (above)."""

    def rule(node: dict[str, Any]) -> Any:
        node = declare_required(node)
        return _patterned(node, form=form) if isinstance(node, dict) else node

    return map_subschemas(schema, rule)


def _patterned(node: dict[str, Any], *, form: ObjectForm) -> dict[str, Any]:
    """`patternProperties` beside open additional properties: xgrammar lets a name a
    pattern matches take the additional properties' schema instead (and, with no
    `properties`, allows no other name); the names no pattern matches and no property
    declares get a pattern of their own, and `additionalProperties` becomes `false`."""
    extra = node.get("additionalProperties")
    if not node.get("patternProperties") or extra is False or (extra is None and form.closed):
        return node
    return ban_names(node, [], form=form) or node


def declare_required(node: dict[str, Any]) -> Any:
    """`node` with its undeclared required names declared; False for an object schema a
    required name cannot appear in."""
    required, properties = node.get("required"), node.get("properties", {})
    if not isinstance(required, list) or not isinstance(properties, dict):
        return node
    declared = dict(properties)
    for name in required:
        if not isinstance(name, str) or name in declared or needs_escape(name):
            continue
        schema = value_schema(node, name)
        if schema is False and node.get("type") == "object":
            return False
        if schema is not None and schema is not False:
            declared[name] = schema
    return node if declared == properties else {**node, "properties": declared}


def value_schema(node: dict[str, Any], name: str) -> Any:
    """The schema the value of `name` has in object schema `node`: its declaration, else
    that of the one pattern matching it, else `additionalProperties` (False: it may not
    appear; None: no single schema)."""
    declared = node.get("properties") or {}
    if isinstance(declared, dict) and name in declared:
        return declared[name]
    patterns = node.get("patternProperties") or {}
    if not isinstance(patterns, dict):
        return None
    found = [searches(pattern, name) for pattern in patterns]
    if None in found or sum(map(bool, found)) > 1:
        return None
    for matched, schema in zip(found, patterns.values(), strict=True):
        if matched:
            return schema
    extra = node.get("additionalProperties", True)
    return {} if extra is True else extra if isinstance(extra, (dict, bool)) else None


def ban_names(
    node: dict[str, Any], banned: list[str], *, form: ObjectForm
) -> dict[str, Any] | None:
    """`node` where no name of `banned` may appear (above), or None where that has no form
    here."""
    patterns = node.get("patternProperties") or {}
    if any(needs_escape(n) for n in banned) or not isinstance(patterns, dict):
        return None
    kept_patterns = _patterns_without(patterns, banned)
    if kept_patterns is None or "unevaluatedProperties" in node:
        return None
    properties = {k: v for k, v in (node.get("properties") or {}).items() if k not in banned}
    out = {k: v for k, v in node.items() if k not in ("properties", "patternProperties")}
    out.update({"properties": properties} if properties else {})
    extra = node.get("additionalProperties")
    if extra is False or (extra is None and form.closed):
        return {**out, "patternProperties": kept_patterns} if kept_patterns else out
    if form.evaluated:
        return None
    others = _other_names([*banned, *properties], list(patterns))
    if others is None:
        return None
    if others != NOTHING:  # (no name is left for the additional properties)
        kept_patterns[others] = extra if isinstance(extra, dict) else {}
    return {**out, "patternProperties": kept_patterns, "additionalProperties": False}


def _other_names(names: list[str], patterns: list[str]) -> str | None:
    """The pattern of the names that are not in `names` and match none of `patterns`."""
    others: str | None = outside(names)
    if len(others or "") > MAX_NAMES_CHARS:
        return None
    for pattern in patterns:
        unmatched = complement(pattern)
        others = None if unmatched is None or others is None else intersection(others, unmatched)
    return others if others is not None and len(others) <= MAX_NAMES_CHARS else None


def _patterns_without(patterns: dict[str, Any], banned: list[str]) -> dict[str, Any] | None:
    """`patternProperties` whose patterns no longer match a banned name (each intersected
    with the pattern of every other name), or None."""
    out = {}
    for pattern, schema in patterns.items():
        matches = [searches(pattern, name) for name in banned]
        if None in matches:
            return None
        narrowed = intersection(pattern, outside(banned)) if any(matches) else pattern
        if narrowed is None:
            return None
        if narrowed != NOTHING:
            out[narrowed] = schema
    return out

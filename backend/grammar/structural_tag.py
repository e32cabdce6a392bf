"""Structural tags (xgrammar's format for tool calls and tagged sections), as SGLang takes them.

Two spellings are accepted, as SGLang does:

- legacy: ``{"type": "structural_tag", "structures": [{"begin", "schema", "end"}, ...],
  "triggers": [...]}``: free text until a trigger, then one of the tagged JSON sections;
- xgrammar's: ``{"type": "structural_tag", "format": {...}}`` with formats such as
  ``sequence``, ``tag``, ``triggered_tags``, ``json_schema``, ``regex``, ``const_string``.

`normalize_structural_tag` turns either into the second form (compact JSON: the cache key).
At compile time `expand_json_schemas` replaces every plain JSON section (style "json") by the
grammar a `json_schema` constraint with the request's options would get (compact or bounded
whitespace, strict mode, the schema rewrite) and collects its warnings, so a JSON section in a
tag is generated exactly like a JSON constraint.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

Node = dict[str, Any]
# A json_schema format with only these keys is generated like a `json_schema` constraint; one
# with any_order, excludes or another style is left to xgrammar as written.
PLAIN_JSON_KEYS = frozenset({"type", "json_schema", "style"})


class StructuralTagError(ValueError):
    """A structural tag that is not JSON or not shaped like one."""


def normalize_structural_tag(value: str | Node) -> str:
    """Compact JSON of the tag in xgrammar's form; raises StructuralTagError naming the problem."""
    tag = _parse(value)
    if "structures" in tag or "triggers" in tag:
        tag = _from_legacy(tag)
    if not isinstance(tag.get("format"), dict):
        raise StructuralTagError("structural_tag needs a 'format' object (or 'structures')")
    return json.dumps(tag, separators=(",", ":"), ensure_ascii=False)


def expand_json_schemas(
    text: str, json_grammar: Callable[[Any], tuple[str, tuple[str, ...]]]
) -> tuple[str, tuple[str, ...]]:
    """The normalized tag with each plain JSON section replaced by a ``grammar`` format whose
    EBNF ``json_grammar(schema)`` gives, and the warnings it returned (deduplicated)."""
    tag = json.loads(text)
    warnings: list[str] = []
    for node in json_schema_nodes(tag["format"]):
        if set(node) <= PLAIN_JSON_KEYS and node.get("style", "json") == "json":
            ebnf, found = json_grammar(node.get("json_schema", True))
            node.clear()
            node.update({"type": "grammar", "grammar": ebnf})
            warnings.extend(found)
    return json.dumps(tag, ensure_ascii=False), tuple(dict.fromkeys(warnings))


def json_schema_nodes(node: Any) -> Iterator[Node]:
    """Every ``{"type": "json_schema", ...}`` format below ``node`` (schemas not entered)."""
    if isinstance(node, list):
        for item in node:
            yield from json_schema_nodes(item)
    elif isinstance(node, dict):
        if node.get("type") == "json_schema":
            yield node
            return
        for value in node.values():
            yield from json_schema_nodes(value)


def _parse(value: str | Node) -> Node:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise StructuralTagError(f"structural_tag is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise StructuralTagError(f"structural_tag must be an object, got {type(value).__name__}")
    if value.get("type", "structural_tag") != "structural_tag":
        raise StructuralTagError(
            f"structural_tag.type must be 'structural_tag', not {value['type']!r}"
        )
    return dict(value)


def _from_legacy(tag: Node) -> Node:
    structures, triggers = tag.get("structures"), tag.get("triggers")
    if not isinstance(structures, list) or not structures:
        raise StructuralTagError("structural_tag.structures must be a non-empty list")
    if not isinstance(triggers, list) or not all(isinstance(t, str) and t for t in triggers):
        raise StructuralTagError("structural_tag.triggers must be a list of non-empty strings")
    tags = []
    for i, item in enumerate(structures):
        if not isinstance(item, dict) or not all(k in item for k in ("begin", "schema", "end")):
            raise StructuralTagError(f"structural_tag.structures[{i}] needs begin, schema and end")
        schema = item["schema"]
        if isinstance(schema, str):
            schema = _parse_schema(schema, i)
        content = {"type": "json_schema", "json_schema": schema}
        tags.append({"type": "tag", "begin": item["begin"], "content": content, "end": item["end"]})
    fmt = {"type": "triggered_tags", "triggers": triggers, "tags": tags}
    return {"type": "structural_tag", "format": fmt}


def _parse_schema(text: str, index: int) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise StructuralTagError(
            f"structural_tag.structures[{index}].schema is not valid JSON: {exc}"
        ) from exc

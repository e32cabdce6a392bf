"""Every `$ref` a schema can resolve within itself, written as a JSON pointer xgrammar reads.

xgrammar follows only `#` and `#/...` pointers from the root; any other `$ref` (an `$anchor`
name, a URI relative to an `$id`, a URN) it logs and accepts anything for. Here each `$ref`
is resolved as JSON Schema says (against the base URI of its nearest `$id`, to an `$id`, an
`$anchor` or a pointer within one) and rewritten:

- a target at the root, or directly under the root's `$defs`/`definitions`, is pointed at
  where it is (`#/$defs/a`);
- any other target (`#/properties/foo`, a subschema with its own `$id`) is copied under the
  root's `$defs` (`plait_ref_N`) and pointed at there, since later rewrites may move the
  original (a schema without `type` becomes an `anyOf`).

The `$id`s and `$anchor`s are then removed: every reference is a pointer from the root.
A `$ref` to another document stays as it is (the warning walker reports it), and so does a
schema with `$dynamicRef` (its meaning depends on the dynamic scope the `$id`s make) or one
whose copies would pass `MAX_HOISTED_CHARS`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

from plait.backend.grammar.schema.utils import resolve_ref

HOIST_PREFIX = "plait_ref_"
MAX_HOISTED_CHARS = 1_000_000  # copies of moved targets, at most
DEF_KEYS = ("$defs", "definitions")
_NOT_SCHEMAS = ("enum", "const", "examples", "default")
_IDENTIFIERS = ("$id", "$anchor", "$dynamicAnchor")


def resolve_refs(schema: Any) -> Any:
    """`schema` (not modified) with every resolvable `$ref` a pointer from the root."""
    if not isinstance(schema, dict) or _has_dynamic_ref(schema):
        return schema
    out = copy.deepcopy(schema)
    ids, anchors, refs = _index(out)
    targets: dict[str, str] = {}  # target pointer -> the pointer refs are written as
    for node, uri in refs:
        pointer = _target(uri, ids, anchors)
        target = None if pointer is None else resolve_ref(out, "#" + pointer)
        if isinstance(target, bool) and (target or "not" not in node):
            del node["$ref"]  # a boolean target: true, or false as `not: {}`
            node.update({} if target else {"not": {}})
        elif pointer is not None and target is not None:
            node["$ref"] = "#" + targets.setdefault(pointer, _stable(pointer, len(targets)))
    hoisted = _hoisted(out, targets)
    if hoisted is None:
        return schema  # a schema built to blow up; its refs stay as xgrammar reads them
    if hoisted:
        defs = out.get("$defs")
        out["$defs"] = {**(defs if isinstance(defs, dict) else {}), **hoisted}
    _drop_identifiers(out)
    return out


def _hoisted(root: Any, targets: dict[str, str]) -> dict[str, Any] | None:
    """Copies of the targets that move, by their `$defs` name; None past MAX_HOISTED_CHARS
    (measured target by target before anything is copied)."""
    moved = {alias: pointer for pointer, alias in targets.items() if alias != pointer}
    size = 0
    for pointer in moved.values():
        size += len(json.dumps(resolve_ref(root, "#" + pointer)))
        if size > MAX_HOISTED_CHARS:
            return None
    return {
        alias[len("/$defs/") :]: copy.deepcopy(resolve_ref(root, "#" + pointer))
        for alias, pointer in moved.items()
    }


def _stable(pointer: str, index: int) -> str:
    """Where refs to `pointer` point: itself when later rewrites never move it."""
    parts = pointer.split("/")
    if pointer == "" or (len(parts) == 3 and parts[1] in DEF_KEYS):
        return pointer
    return f"/$defs/{HOIST_PREFIX}{index}"


def _target(uri: str, ids: dict[str, str], anchors: dict[str, str]) -> str | None:
    """The JSON pointer (from the root) an absolute ref URI names, or None."""
    document, fragment = urldefrag(uri)
    if document not in ids:
        return None
    if fragment == "" or fragment.startswith("/"):
        return ids[document] + unquote(fragment)
    return anchors.get(f"{document}#{fragment}")


def _index(
    root: dict[str, Any],
) -> tuple[dict[str, str], dict[str, str], list[tuple[dict[str, Any], str]]]:
    """Base URIs of the `$id`s and `$anchor`s (each a pointer), and every `$ref` node with
    its absolute URI."""
    ids: dict[str, str] = {"": ""}
    anchors: dict[str, str] = {}
    refs: list[tuple[dict[str, Any], str]] = []
    for node, pointer, base in _walk(root, "", ""):
        if isinstance(node.get("$id"), str):
            ids.setdefault(base, pointer)
        for key in ("$anchor", "$dynamicAnchor"):  # both are plain fragments for a $ref
            if isinstance(node.get(key), str):
                anchors.setdefault(f"{base}#{node[key]}", pointer)
        if isinstance(node.get("$ref"), str):
            refs.append((node, join_uri(base, node["$ref"])))
    return ids, anchors, refs


def _walk(node: Any, pointer: str, base: str) -> Iterator[tuple[dict[str, Any], str, str]]:
    """(schema object, its pointer, its base URI) for every object under `node`."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            yield from _walk(item, f"{pointer}/{i}", base)
        return
    if not isinstance(node, dict):
        return
    if isinstance(node.get("$id"), str):
        base = urldefrag(join_uri(base, node["$id"]))[0]
    yield node, pointer, base
    for key, child in node.items():
        if key not in _NOT_SCHEMAS:
            name = key.replace("~", "~0").replace("/", "~1")
            yield from _walk(child, f"{pointer}/{name}", base)


def join_uri(base: str, ref: str) -> str:
    """`ref` resolved against `base`; a fragment or an absolute URI (a URN too, which
    urljoin does not resolve against) on its own terms."""
    if ref.startswith("#"):
        return urldefrag(base)[0] + ref
    if ":" in ref.split("/")[0]:
        return ref
    return urljoin(base, ref)


def _has_dynamic_ref(node: Any) -> bool:
    if isinstance(node, list):
        return any(_has_dynamic_ref(item) for item in node)
    if not isinstance(node, dict):
        return False
    if "$dynamicRef" in node:
        return True
    return any(_has_dynamic_ref(v) for k, v in node.items() if k not in _NOT_SCHEMAS)


def _drop_identifiers(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _drop_identifiers(item)
    elif isinstance(node, dict):
        for key in _IDENTIFIERS:
            if isinstance(node.get(key), str):
                del node[key]
        for key, child in node.items():
            if key not in _NOT_SCHEMAS:
                _drop_identifiers(child)

"""`enum` and `const` values checked against the keywords beside them.

xgrammar writes an `enum`/`const` as its values and ignores every keyword beside it (`type`
included). The values are checked here against those keywords (types, numeric bounds and
integral or decimal steps, lengths, a pattern Python's `re` reads, item and property counts,
required names, another `enum`/`const`): the values that fail one are dropped, and the
keywords every value could be checked against go (but `type`), which leaves the exact
enum. A keyword not checked here stays beside it (the warning walker reports it).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

from plait.backend.grammar.schema.utils import NEVER, is_number, same, searches

Check = Callable[[Any, Any], "bool | None"]  # (value, keyword's value) -> valid, None: unknown


def _type(value: Any, types: Any) -> bool | None:
    names = [types] if isinstance(types, str) else types if isinstance(types, list) else None
    if names is None:
        return None
    whole = is_number(value) and float(value).is_integer()
    kinds = {
        "string": isinstance(value, str),
        "integer": whole,
        "number": is_number(value),
        "boolean": isinstance(value, bool),
        "null": value is None,
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
    }
    return any(kinds.get(t, False) for t in names)


def _bound(compare: Callable[[Any, Any], bool]) -> Check:
    def check(value: Any, bound: Any) -> bool | None:
        if not is_number(value):
            return True
        return compare(value, bound) if is_number(bound) else None

    return check


def _multiple(value: Any, step: Any) -> bool | None:
    if not is_number(value):
        return True
    if not is_number(step) or step <= 0:
        return None
    return Fraction(repr(value)) % Fraction(repr(step)) == 0


def _count(
    kind: type[str | list[Any] | dict[str, Any]], compare: Callable[[int, Any], bool]
) -> Check:
    def check(value: Any, bound: Any) -> bool | None:
        if not isinstance(value, kind):
            return True
        return compare(len(value), bound) if is_number(bound) else None

    return check


def _pattern(value: Any, pattern: Any) -> bool | None:
    if not isinstance(value, str):
        return True
    return searches(pattern, value) if isinstance(pattern, str) else None


def _required(value: Any, names: Any) -> bool | None:
    if not isinstance(value, dict):
        return True
    return all(n in value for n in names) if isinstance(names, list) else None


CHECKS: dict[str, Check] = {
    "type": _type,
    "minimum": _bound(lambda v, b: v >= b),
    "maximum": _bound(lambda v, b: v <= b),
    "exclusiveMinimum": _bound(lambda v, b: v > b),
    "exclusiveMaximum": _bound(lambda v, b: v < b),
    "multipleOf": _multiple,
    "minLength": _count(str, lambda n, b: n >= b),
    "maxLength": _count(str, lambda n, b: n <= b),
    "pattern": _pattern,
    "minItems": _count(list, lambda n, b: n >= b),
    "maxItems": _count(list, lambda n, b: n <= b),
    "minProperties": _count(dict, lambda n, b: n >= b),
    "maxProperties": _count(dict, lambda n, b: n <= b),
    "required": _required,
    "const": lambda v, c: same(v, c),
    "enum": lambda v, e: any(same(v, x) for x in e) if isinstance(e, list) else None,
}


def narrowed(node: dict[str, Any]) -> Any:
    """`node` with its enum/const values checked against the keywords beside them (above);
    NEVER when no value is left."""
    key = "enum" if isinstance(node.get("enum"), list) else "const" if "const" in node else None
    if key is None:
        return node
    values = node["enum"] if key == "enum" else [node["const"]]
    beside = [k for k in node if k != key and k in CHECKS]
    if not beside:
        return node
    kept, unknown = [], set()
    for value in values:
        verdicts = {k: CHECKS[k](value, node[k]) for k in beside}
        unknown |= {k for k, ok in verdicts.items() if ok is None}
        if all(ok is not False for ok in verdicts.values()):
            kept.append(value)
    if not kept:
        return NEVER
    # (`type` stays: it says nothing more then, and xgrammar's enum reads past it)
    out = {k: v for k, v in node.items() if k not in beside or k in unknown or k == "type"}
    if key == "const":
        return out
    return {**out, "enum": kept}

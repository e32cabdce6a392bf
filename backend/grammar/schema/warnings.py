"""JSON Schema keywords the grammar cannot enforce exactly, found by walking the schema.

xgrammar turns a JSON Schema into a grammar; some keywords have no grammar form and are
dropped, others are narrowed. Each finding is a `SchemaGap`: `loose` when the grammar may
accept instances the schema rejects (e.g. `uniqueItems`, `not`), `strict` when it may reject
instances the schema accepts (e.g. an unanchored `pattern` is matched against the whole
string). The walk follows local `$ref`s from the root, so unused definitions are not reported.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from plait.backend.grammar.schema.automata import NOTHING, intersection
from plait.backend.grammar.schema.formats import LEAP_SECOND_PATTERNS, implied_length
from plait.backend.grammar.schema.hoist import is_moved, rule_of
from plait.backend.grammar.schema.numbers import Numeric
from plait.backend.grammar.schema.utils import (
    ANNOTATIONS,
    MAX_INTEGER_STEP,
    disjoint,
    has_type,
    needs_escape,
    node_types,
    pattern_shape,
    resolve_ref,
    same,
    searches,
)

Effect = Literal["loose", "strict"]

ALWAYS_LOOSE = {
    "not": "the negated schema is not excluded",
    "if": "conditional (if/then/else) schemas are not applied",
    "contains": "no item is required to match",
    "minContains": "the count of matching items is not checked",
    "maxContains": "the count of matching items is not checked",
    "dependencies": "properties required by other properties are not enforced",
    "dependentRequired": "properties required by other properties are not enforced",
    "dependentSchemas": "schemas applied by other properties are not enforced",
    "propertyNames": "property names are not checked",
    "$dynamicRef": "dynamic references are not followed",
}
# Keywords a moved schema's own rule enforces (arrays: the counts; numbers: `not` integer
# or multiple).
RULED_KEYWORDS = ("contains", "minContains", "maxContains", "not")
FORMAT_GAPS = {
    "hostname": "label lengths and punycode labels are not checked",
    "ipv6": "an embedded IPv4 part may have leading zeros",
}
# Formats xgrammar turns into a regular language; any other format is not checked.
FORMATS = frozenset(
    {
        "date",
        "date-time",
        "time",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "uri",
        "uri-reference",
        "uri-template",
        "uuid",
        "duration",
        "json-pointer",
        "relative-json-pointer",
    }
)
CALENDAR_FORMATS = frozenset({"date", "date-time"})
TYPE_KEYWORDS = {
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "array": ("minItems", "maxItems"),
    "object": ("minProperties", "maxProperties"),
}
RANGE_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
LOOKAROUND = re.compile(r"\(\?<?[=!]")
MAX_PATTERN_PAIRS = 28  # patternProperties of more patterns are taken to overlap
BOUNDED_THEN_OPTIONAL = re.compile(r"\{\d+(,\d*)?\}.*\)[?*]")


@dataclass(frozen=True)
class SchemaGap:
    """One keyword the grammar does not enforce as the schema says."""

    keyword: str
    path: str
    effect: Effect
    detail: str


def schema_gaps(schema: Any, *, strict_mode: bool = True) -> list[SchemaGap]:
    """Every gap reachable from the root of `schema` (a parsed JSON Schema)."""
    walker = _Walker(schema, strict_mode=strict_mode)
    walker.visit(schema, "")
    return walker.gaps


def gap_warnings(gaps: list[SchemaGap]) -> tuple[str, ...]:
    """One warning per (keyword, detail), naming the keyword and where it occurs."""
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for gap in gaps:
        grouped.setdefault((gap.keyword, gap.effect, gap.detail), []).append(gap.path or "/")
    out = []
    for (keyword, effect, detail), paths in grouped.items():
        where = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        verb = "is not enforced" if effect == "loose" else "is enforced more strictly"
        out.append(f"json_schema keyword '{keyword}' {verb} ({detail}) at {where}")
    return tuple(out)


class _Walker:
    """Depth-first walk over subschemas, following local $refs once."""

    def __init__(self, root: Any, *, strict_mode: bool) -> None:
        self.root = root
        self.strict_mode = strict_mode
        self.gaps: list[SchemaGap] = []
        self.seen: set[str] = set()
        self.ruled = False

    def visit(self, node: Any, path: str) -> None:
        if not isinstance(node, dict):
            return
        # a schema moved under `$defs` with a grammar rule of its own (hoist.py)
        self.ruled = is_moved(path) and rule_of(node) is not None
        for rule in RULES:
            for keyword, effect, detail in rule(self, node):
                self.gaps.append(SchemaGap(keyword, path, effect, detail))
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#") and ref not in self.seen:
            self.seen.add(ref)
            self.visit(resolve_ref(self.root, ref), ref[1:])
        ruled = self.ruled
        for key, child in _children(node, path):
            if not (ruled and key.rpartition("/")[2] in ("not", "contains")):
                self.visit(child, key)  # (a rule enforces those of a moved schema)


def _children(node: dict[str, Any], path: str) -> Iterator[tuple[str, Any]]:
    for key in ("properties", "patternProperties", "dependentSchemas"):
        if isinstance(node.get(key), dict):
            for name, sub in node[key].items():
                yield f"{path}/{key}/{_escape(name)}", sub
    for key in ("allOf", "anyOf", "oneOf", "prefixItems", "items"):
        if isinstance(node.get(key), list):
            for i, sub in enumerate(node[key]):
                yield f"{path}/{key}/{i}", sub
    for key in ("items", "additionalProperties", "additionalItems", "propertyNames", "contains"):
        if isinstance(node.get(key), dict):
            yield f"{path}/{key}", node[key]
    for key in ("not", "if", "then", "else", "unevaluatedProperties", "unevaluatedItems"):
        if isinstance(node.get(key), dict):
            yield f"{path}/{key}", node[key]


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


Finding = tuple[str, Effect, str]


def _always_loose(w: _Walker, node: dict[str, Any]) -> Iterator[Finding]:
    for keyword, detail in ALWAYS_LOOSE.items():
        if keyword in node and not (w.ruled and keyword in RULED_KEYWORDS):
            yield keyword, "loose", detail
    if node.get("uniqueItems") is True and not w.ruled:
        yield "uniqueItems", "loose", "duplicate items are not rejected"
    if "unevaluatedProperties" in node and not w.strict_mode:
        yield "unevaluatedProperties", "loose", "properties left unevaluated are not rejected"


def _multiple_of(w: _Walker, node: dict[str, Any]) -> Iterator[Finding]:
    step = node.get("multipleOf")
    rule = rule_of(node) if w.ruled else None
    if isinstance(rule, Numeric):  # numbers.py's own rule (integers never have exponents)
        if rule.integral is not True:
            keyword = "multipleOf" if step is not None else "not"
            yield keyword, "strict", "numbers are written without an exponent"
        return
    if step is None or w.ruled:
        return
    integral = node_types(node) == {"integer"} and isinstance(step, int)
    if not integral:
        yield "multipleOf", "loose", "only integer multipleOf on integer types is enforced"
    elif not 0 < step <= MAX_INTEGER_STEP:
        yield "multipleOf", "loose", f"ignored above {MAX_INTEGER_STEP}"
    elif any(bound in node for bound in RANGE_KEYWORDS):
        yield "multipleOf", "loose", "ignored beside minimum/maximum"


def _combinators(w: _Walker, node: dict[str, Any]) -> Iterator[Finding]:
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        yield "allOf", "loose", "only single-branch allOf is enforced"
    branches = node.get("oneOf")
    if isinstance(branches, list) and len(branches) > 1 and not disjoint(w.root, branches):
        yield "oneOf", "loose", "branches that may overlap are matched as anyOf"
    combined = [k for k in ("allOf", "anyOf", "oneOf") if k in node]
    if not combined:
        return
    for extra in combined[1:]:
        yield extra, "loose", "with several combinators in one schema, some are not applied"
    for keyword in sorted(set(node) - ANNOTATIONS - {"allOf", "anyOf", "oneOf", "$ref"}):
        yield keyword, "loose", f"ignored beside {combined[0]}"


def _ref_siblings(w: _Walker, node: dict[str, Any]) -> Iterator[Finding]:
    if "$ref" not in node:
        return
    ref = node["$ref"]
    if not isinstance(ref, str) or not ref.startswith("#"):
        yield "$ref", "loose", "a reference to another document is not followed"
    elif resolve_ref(w.root, ref) is None:
        yield "$ref", "loose", "a reference that resolves to nothing is not followed"
    for keyword in sorted(set(node) - ANNOTATIONS - {"$ref"}):
        yield keyword, "loose", "keywords beside $ref are ignored"


def _untyped(w: _Walker, node: dict[str, Any]) -> Iterator[Finding]:
    if "type" in node or any(k in node for k in ("$ref", "enum", "const", "anyOf", "oneOf")):
        return
    for type_name, keywords in TYPE_KEYWORDS.items():
        for keyword in keywords:
            if keyword in node:
                yield keyword, "loose", f'ignored without "type": "{type_name}"'


def _beside_enum(w: _Walker, node: dict[str, Any]) -> Iterator[Finding]:
    if "enum" not in node and "const" not in node:
        return
    ignored = {k for ks in TYPE_KEYWORDS.values() for k in ks} & set(node)
    for keyword in sorted(ignored):
        yield keyword, "loose", "keywords beside enum/const are ignored"


def _strings(w: _Walker, node: dict[str, Any]) -> Iterator[Finding]:
    if "type" not in node or "string" not in node_types(node):
        return
    pattern, fmt = node.get("pattern"), node.get("format")
    lengths = [k for k in ("minLength", "maxLength") if k in node]
    if implied_length(node):  # the format's shortest value is long enough
        lengths = []
    if (pattern is not None or fmt is not None) and lengths:
        for keyword in lengths:
            yield keyword, "loose", "ignored together with pattern/format"
    elif lengths and "enum" not in node and "const" not in node:
        for keyword in lengths:
            yield keyword, "strict", "length-bounded strings cannot hold escape sequences"
    if isinstance(pattern, str) and pattern in LEAP_SECOND_PATTERNS:
        yield "format", "strict", "a leap second is accepted only at 23:59:60 UTC"
    if isinstance(pattern, str) and fmt is not None:
        yield "pattern", "loose", "ignored beside format"
    elif isinstance(pattern, str):
        yield from _pattern(pattern)
    if isinstance(fmt, str):
        yield from _format(fmt)


def _pattern(pattern: str) -> Iterator[Finding]:
    if LOOKAROUND.search(pattern):
        yield "pattern", "loose", "lookaround assertions are ignored"
    if BOUNDED_THEN_OPTIONAL.search(pattern):
        yield (
            "pattern",
            "loose",
            "a bounded repetition followed by an optional group may go unbounded",
        )
    shape = pattern_shape(pattern)
    if shape.inner_anchors:
        yield "pattern", "strict", "anchors inside the pattern are ignored"
    elif not (shape.starts and shape.ends):
        yield "pattern", "strict", "matched against the whole string, as if anchored by ^...$"


def _format(fmt: str) -> Iterator[Finding]:
    if fmt not in FORMATS:
        yield "format", "loose", f"format '{fmt}' is not checked"
    elif fmt in FORMAT_GAPS:
        yield "format", "loose", f"format '{fmt}': {FORMAT_GAPS[fmt]}"
    elif fmt in CALENDAR_FORMATS:
        yield "format", "loose", f"format '{fmt}': days are not checked against the month"


def _escaped_names(w: _Walker, node: dict[str, Any]) -> Iterator[Finding]:
    properties = node.get("properties")
    if isinstance(properties, dict) and any(needs_escape(name) for name in properties):
        yield (
            "properties",
            "loose",
            "a property name JSON writes with escapes is not matched (its value is unchecked)",
        )


def _required(w: _Walker, node: dict[str, Any]) -> Iterator[Finding]:
    required = node.get("required")
    if not isinstance(required, list):
        return
    properties = node.get("properties")
    declared = properties if isinstance(properties, dict) else {}
    missing = [name for name in required if name not in declared]
    if missing:
        yield "required", "loose", f"required names missing from properties: {missing[:5]}"


def _pattern_properties(w: _Walker, node: dict[str, Any]) -> Iterator[Finding]:
    patterns = node.get("patternProperties")
    if not isinstance(patterns, dict) or not patterns:
        return
    for pattern in patterns:
        for _, effect, detail in _pattern(pattern):
            yield "patternProperties", effect, f"property-name {detail}"
    if _overlapping_names(patterns, node.get("properties")):
        yield (
            "patternProperties",
            "loose",
            "a name matching several patterns (or a pattern and a declared property) is "
            "checked against one of their schemas only",
        )
    extra = node.get("additionalProperties")
    opened = extra is True or isinstance(extra, dict) or (extra is None and not w.strict_mode)
    if "properties" in node and opened:
        yield (
            "patternProperties",
            "loose",
            "with properties and open additionalProperties, property values are not checked",
        )
    elif "properties" not in node and extra is not False and not w.strict_mode:
        yield "patternProperties", "strict", "properties matching no pattern are rejected"


def _overlapping_names(patterns: dict[str, Any], properties: object) -> bool:
    """Whether one name may fall under two schemas: two patterns whose languages meet (up
    to `MAX_PATTERN_PAIRS` checked), or a declared property whose name a pattern matches."""
    names = properties if isinstance(properties, dict) else {}
    for pattern, schema in patterns.items():
        for name, declared in names.items():  # no matter when the declared schema is it
            found = searches(pattern, name)
            if found is not False and schema not in ({}, True) and not same(schema, declared):
                return True
    keys = list(patterns)
    pairs = [(a, b) for i, a in enumerate(keys) for b in keys[i + 1 :]]
    return len(pairs) > MAX_PATTERN_PAIRS or any(intersection(a, b) != NOTHING for a, b in pairs)


def _enum_values(w: _Walker, node: dict[str, Any]) -> Iterator[Finding]:
    values = (
        node["enum"]
        if isinstance(node.get("enum"), list)
        else [node["const"]]
        if "const" in node
        else []
    )
    if any(isinstance(v, (dict, list)) and v for v in values):
        key = "enum" if "enum" in node else "const"
        yield key, "strict", "object and array values must be written in compact JSON"
    types = node_types(node)
    if types and any(not has_type(v, types) for v in values):
        yield "type", "loose", "enum/const values outside the type are allowed"


RULES = (
    _always_loose,
    _multiple_of,
    _combinators,
    _ref_siblings,
    _untyped,
    _beside_enum,
    _strings,
    _required,
    _escaped_names,
    _pattern_properties,
    _enum_values,
)

"""llguidance's grammar of a key, built in a compile worker process (`workers`).

- `json_schema` / `json_object`: the schema as plait rewrites it for either backend
  (`schema.rewrite`: refs resolved, boolean subschemas, formats as patterns with real
  calendars), closed where `strict_mode` asks (`additionalProperties: false` beside listed
  properties, `items: false` after `prefixItems`: xgrammar's strict mode), in the request's
  layout (`layout.llguidance_options`). llguidance refuses a keyword it does not implement;
  the schema is then compiled `lenient` (those keywords ignored, `oneOf` read as `anyOf`) and
  each ignored keyword is reported as a warning, like xgrammar's.
- `regex`: llguidance's regex (Rust syntax); jump-forward follows plait's DFA like xgrammar's.
- `choices`: a Lark alternation of string literals; `ebnf`: the GBNF grammar as xgrammar
  reads it, converted to Lark (llguidance's `gbnf_to_lark`); `lark`: as given.
- `structural_tag`: Lark from the tag's formats (`llg_lark`), each JSON section a `%json`
  schema with the request's layout and strict mode.

Every grammar is validated here (no vocabulary needed), so that a grammar llguidance refuses
fails in the worker, within its deadline, with llguidance's message.
"""

from __future__ import annotations

import decimal
import json
import re
from typing import Any

import llguidance as llg

from plait.backend.grammar.errors import GrammarError, error_line
from plait.backend.grammar.keys import LLGUIDANCE, BuiltGrammar, GrammarKey
from plait.backend.grammar.layout import llguidance_options
from plait.backend.grammar.llg_lark import ebnf_lark, tag_grammar
from plait.backend.grammar.llg_matcher import LIMITS
from plait.backend.grammar.regex_fsm import RegexFSM
from plait.backend.grammar.schema.rewrite import rewrite_schema
from plait.backend.grammar.schema.utils import is_number

Schema = Any
_UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[(.*?)\]")
_UNKNOWN_FORMAT = re.compile(r"Unknown format: (.*)")
# formats llguidance checks more loosely than their definition (measured on the
# JSON-Schema-Test-Suite's format files, docs/structured.md)
LOOSE_FORMATS = {"hostname": "label lengths and punycode labels are not checked"}
# keywords whose values are maps of subschemas, lists of subschemas, or one subschema
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalItems", "additionalProperties", "not", "if", "then",
                  "else", "contains", "propertyNames", "unevaluatedItems",
                  "unevaluatedProperties")  # fmt: skip
_OPEN_OBJECT = ("additionalProperties", "unevaluatedProperties")
# llguidance's lexer follows the remainder of a `multipleOf` digit by digit: a step whose
# digits make a number past this (999983 took 9 s and 0.4 GB for one request; 123456789, the
# integer form of 0.123456789, made it allocate 3.3 GB and abort the process) is refused.
MAX_MULTIPLE_DIGITS_VALUE = 1024


def build_llguidance(key: GrammarKey) -> BuiltGrammar:
    """llguidance's grammar of `key`, validated; raises GrammarError naming the problem."""
    grammar, fsm, warnings = _grammar(key)
    failed, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, limits=LIMITS)
    if failed:
        raise GrammarError(f"invalid {key.kind}: {error_line(messages[0])}")
    return BuiltGrammar(LLGUIDANCE, grammar, fsm, warnings)


def _grammar(key: GrammarKey) -> tuple[str, RegexFSM | None, tuple[str, ...]]:
    if key.kind in ("json_schema", "json_object"):
        schema, warnings = json_schema(key, json.loads(key.text))
        return llg.LLMatcher.grammar_from_json_schema(schema), None, warnings
    if key.kind == "regex":
        return llg.LLMatcher.grammar_from_regex(key.text), RegexFSM.bounded(key.text), ()
    if key.kind == "choices":
        choices = json.loads(key.text)
        lark = "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
        return llg.LLMatcher.grammar_from_lark(lark), None, ()
    if key.kind == "ebnf":
        return llg.LLMatcher.grammar_from_lark(ebnf_lark(key.text)), None, ()
    if key.kind == "lark":
        return llg.LLMatcher.grammar_from_lark(key.text), None, ()
    if key.kind == "structural_tag":
        grammar, warnings = tag_grammar(key.text, section=lambda schema: json_schema(key, schema))
        return grammar, None, warnings
    raise GrammarError(f"{key.kind}: llguidance does not take this constraint kind")


# --- JSON Schema ------------------------------------------------------------------------------
def json_schema(key: GrammarKey, schema: Schema) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The schema llguidance is given for `key` (rewritten, closed under strict mode, the
    layout's `x-guidance` options) and its warnings: the first of (strict, exact), (open,
    exact), (strict, lenient), (open, lenient) that llguidance accepts; raises GrammarError
    with llguidance's message on the last one when none is."""
    rewritten = rewrite_schema(schema)
    if rewritten is False:
        raise GrammarError("invalid json_schema: the schema is false (no instance is valid)")
    _check_multiples(rewritten)
    base = as_object(rewritten)
    shapes = [closed(base), base] if key.strict_mode else [base]
    options = llguidance_options(key.layout)
    error = ""
    for lenient in (False, True):
        strict_error = ""  # why the closed shape failed at this leniency
        for shape in shapes:
            candidate = {**shape, "x-guidance": {**options, "lenient": lenient}}
            failed, messages = _check(candidate)
            if not failed:
                opened = strict_error if shape is not shapes[0] else ""
                return candidate, _notes(candidate, messages, lenient=lenient, opened=opened)
            error = error_line(messages[0])
            strict_error = strict_error or error
    raise GrammarError(f"invalid json_schema: {error}")


def _check_multiples(schema: Schema) -> None:
    """GrammarError for a `multipleOf` llguidance's lexer could not hold in bounded memory
    (its significant digits, as an integer, past `MAX_MULTIPLE_DIGITS_VALUE`)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            step = node.get("multipleOf")
            if is_number(step) and _step_digits(step) > MAX_MULTIPLE_DIGITS_VALUE:
                raise GrammarError(
                    f"invalid json_schema: multipleOf {step} is past what llguidance "
                    f"builds (significant digits up to {MAX_MULTIPLE_DIGITS_VALUE})"
                )
            # every value, data included: a property may be named "enum" or "const", and a
            # refused false positive (an enum object holding "multipleOf") costs only this
            # backend, where a missed step aborts the process
            stack.extend(node.values())


def _step_digits(step: float) -> int:
    """The integer llguidance follows a step's remainders by: the significant digits of a
    fraction (0.125: 125), an integer whole (1000000 stays 1000000: it strips trailing zeros
    only after a decimal point)."""
    _, digits, exponent = decimal.Decimal(repr(step)).normalize().as_tuple()
    assert isinstance(exponent, int)  # a finite number: JSON has no others
    return int("".join(map(str, digits)) or "0") * 10 ** max(exponent, 0)


def _check(schema: dict[str, Any]) -> tuple[bool, list[str]]:
    grammar = llg.LLMatcher.grammar_from_json_schema(schema)
    failed, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, limits=LIMITS)
    return bool(failed), list(messages)


def _notes(
    schema: dict[str, Any], messages: list[str], *, lenient: bool, opened: str
) -> tuple[str, ...]:
    """Warnings in xgrammar's words: strict mode turned off (`opened`: why the strict schema
    failed), each keyword a lenient compile ignored, and `oneOf`, which it reads as
    `anyOf`."""
    notes = [f"strict_mode was turned off for this schema ({opened})"] if opened else []
    notes += [note for message in messages for note in _message_notes(message)]
    if lenient and '"oneOf"' in json.dumps(schema):
        notes.append("json_schema keyword 'oneOf' is not enforced (llguidance matches it as "
                     "anyOf)")  # fmt: skip
    for fmt in sorted(_formats(schema) & set(LOOSE_FORMATS)):
        notes.append(f"json_schema keyword 'format' is not enforced (llguidance's {fmt}: "
                     f"{LOOSE_FORMATS[fmt]})")  # fmt: skip
    return tuple(dict.fromkeys(notes))


def _message_notes(message: str) -> list[str]:
    """One of llguidance's warnings in xgrammar's words, naming the keyword."""
    found = _UNIMPLEMENTED.search(message)
    if found is not None:
        return [f"json_schema keyword '{keyword}' is not enforced (llguidance does not "
                "implement it)" for keyword in json.loads(f"[{found.group(1)}]")]  # fmt: skip
    unknown = _UNKNOWN_FORMAT.search(message)
    if unknown is not None:
        return [f"json_schema keyword 'format' is not enforced (llguidance does not know "
                f"format '{unknown.group(1).strip()}')"]  # fmt: skip
    return [f"json_schema: llguidance: {error_line(message)}"]


def _formats(node: Schema) -> set[str]:
    """Every `format` a schema uses (not inside `enum`/`const` values)."""
    if isinstance(node, list):
        return {f for item in node for f in _formats(item)}
    if not isinstance(node, dict):
        return set()
    found = {node["format"]} if isinstance(node.get("format"), str) else set()
    for key, value in node.items():
        if key not in ("enum", "const", "default", "examples"):
            found |= _formats(value)
    return found


def as_object(schema: Schema) -> dict[str, Any]:
    """A boolean schema as an object schema (`x-guidance` needs an object)."""
    if schema is True:
        return {}
    if schema is False:
        return {"not": {}}
    return dict(schema)


def closed(node: Schema) -> Schema:
    """`node` under xgrammar's strict mode: objects that list properties (or patterns) take
    no others unless they say so, arrays with `prefixItems` no items past them."""
    if isinstance(node, list):
        return [closed(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for name, value in node.items():
        if name in _SCHEMA_MAPS and isinstance(value, dict):
            out[name] = {k: closed(v) for k, v in value.items()}
        elif name in _SCHEMA_LISTS or name in _SCHEMA_VALUES:
            out[name] = closed(value)
        else:
            out[name] = value
    lists = "properties" in node or "patternProperties" in node
    if lists and not any(k in node for k in _OPEN_OBJECT):
        out["additionalProperties"] = False
    if "prefixItems" in node and "items" not in node and "unevaluatedItems" not in node:
        out["items"] = False
    return out

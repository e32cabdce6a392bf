"""JSON Schema keywords xgrammar ignores that plait enforces by rewriting the schema:
valid instances accepted, invalid ones rejected by the grammar matcher, no warning left."""

from __future__ import annotations

import itertools
import json
import re
from fractions import Fraction
from typing import Any

import jsonschema
import pytest
import xgrammar as xgr
from hypothesis import given, settings
from hypothesis import strategies as st
from xgrammar.testing import _is_grammar_accept_string as _accepts_text

from plait.backend.grammar.compiler import GrammarKey, json_schema_grammar
from plait.backend.grammar.layout import COMPACT
from plait.backend.grammar.schema.formats import FORMAT_SHORTEST, LENGTH_FORMAT_PATTERNS
from plait.backend.grammar.schema.lengths import MAX_REGEX_CHARS, lengths_into_pattern
from plait.backend.grammar.schema.rewrite import rewrite_schema
from plait.backend.grammar.schema.warnings import schema_gaps

COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)


def accepts(schema: dict[str, Any], value: Any) -> bool:
    key = GrammarKey("json_schema", json.dumps(schema), COMPACT, strict_mode=True)
    grammar, _ = json_schema_grammar(key)
    compiled = COMPILER.compile_grammar(grammar)
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return bool(matcher.accept_string(text)) and bool(matcher.is_terminated())


def check(schema: dict[str, Any], values: list[Any]) -> None:
    """The grammar agrees with jsonschema on every value, and reports no length gap."""
    for value in values:
        expected = jsonschema.Draft202012Validator(schema).is_valid(value)
        assert accepts(schema, value) == expected, (schema, value, expected)
    keywords = {gap.keyword for gap in schema_gaps(rewrite_schema(schema))}
    assert not keywords & {"minLength", "maxLength"}, keywords


@pytest.mark.parametrize(
    ("schema", "values"),
    [
        (
            {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 4},
            ["a", "ab", "abcd", "abcde", "aB", ""],
        ),
        (
            {"type": "string", "pattern": "[0-9]", "maxLength": 3},  # unanchored: a search
            ["1", "a1b", "ab1c", "abc", "x9"],
        ),
        (
            {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{4}$", "minLength": 7, "maxLength": 7},
            ["AB-1234", "AB-123", "ab-1234"],  # the bounds are implied by the pattern
        ),
        (
            {"type": "string", "pattern": "^(ab|c)*$", "minLength": 3, "maxLength": 5},
            ["abc", "cab", "ababc", "ab", "cccccc", "abab", "aba"],
        ),
        (
            {"type": "string", "pattern": "^[^x]+$", "maxLength": 3},
            ["é", "abc", "abcd", "axb"],  # (no escapes: xgrammar's patterns never match them)
        ),
        # only a minLength: the counter stops at the bound, the DFA's language after it
        (
            {"type": "string", "pattern": "^[a-z]+$", "minLength": 3},
            ["ab", "abc", "abcdefgh", "aBc"],
        ),
        (
            {"type": "string", "pattern": "^(ab|c)*$", "minLength": 3},
            ["ab", "abc", "cab", "ababab", "c", "ccc", "abca", ""],
        ),
        ({"type": "string", "pattern": "[0-9]", "minLength": 2}, ["1", "a1", "12", "ab", "x9y"]),
        (
            {"type": "string", "pattern": "^[A-Z][a-z]*( [A-Z][a-z]*)*$", "minLength": 5},
            ["Ann", "Ann B", "Anna", "New York", "new York", "A B C"],
        ),
    ],
)
def test_lengths_beside_a_pattern_are_enforced(schema: dict[str, Any], values: list[Any]) -> None:
    check(schema, values)


def test_an_expansion_too_large_keeps_the_length_keywords_and_their_warning() -> None:
    schema = {"type": "string", "pattern": "foo", "maxLength": 200}
    rewritten = rewrite_schema(schema)
    assert "maxLength" in rewritten and len(rewritten["pattern"]) < MAX_REGEX_CHARS
    assert "maxLength" in {gap.keyword for gap in schema_gaps(rewritten)}


def test_a_length_without_a_pattern_or_beside_a_format_is_left_alone() -> None:
    plain = {"type": "string", "maxLength": 3}
    dated = {"type": "string", "format": "date", "pattern": "^2", "maxLength": 10}
    assert lengths_into_pattern(plain) == plain and lengths_into_pattern(dated) == dated


@pytest.mark.parametrize("step", [5, 2.0])
def test_a_whole_multiple_of_on_a_number_is_enforced(step: float) -> None:
    """`multipleOf` 5 on a number: the grammar writes integers stepped by 5 (xgrammar's
    integer multipleOf), with no warning left."""
    schema = {"type": "number", "multipleOf": step}
    for value in (10, 20, 0, -20, 7, 12.5, 3, -25):
        expected = jsonschema.Draft202012Validator(schema).is_valid(value)
        assert accepts(schema, value) == expected, (schema, value)
    assert not schema_gaps(rewrite_schema(schema))


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "number", "multipleOf": 0.5},
        {"type": "number", "multipleOf": 0.01, "minimum": 0, "exclusiveMaximum": 10},
        {"type": "integer", "multipleOf": 5, "minimum": -20},
        {"type": "number", "multipleOf": 2048},
    ],
)
def test_a_multiple_of_xgrammar_drops_has_a_rule_of_its_own(schema: dict[str, Any]) -> None:
    """A decimal step, a step beside a range, a step above 1024 (numbers.py). Multiples in
    decimal arithmetic, as JSON Schema means them (jsonschema divides floats: 0.07 / 0.01
    is 7.000000000000001 there)."""
    rest = {k: v for k, v in schema.items() if k != "multipleOf"}
    step = Fraction(repr(schema["multipleOf"]))
    for value in (0, 7, 10, -20, -25, 1.5, 0.25, 0.07, 9.99, 10.5, 4096, 6144.5):
        multiple = (Fraction(repr(value)) / step).denominator == 1
        expected = multiple and jsonschema.Draft202012Validator(rest).is_valid(value)
        assert accepts(schema, value) == expected, (schema, value)
    gaps = schema_gaps(rewrite_schema(schema))
    assert [g.effect for g in gaps] == ([] if schema["type"] == "integer" else ["strict"])


@pytest.mark.parametrize("step", [1e400, -5, 0.123456789])
def test_a_multiple_of_without_a_rule_is_warned_about(step: float) -> None:
    """An infinite or negative step is left to the checks (no exception in the rewrite); a
    step of too many states (p / 10^d: about p (d + 2)) stays warned."""
    schema = {"type": "number", "multipleOf": step}
    rewritten = rewrite_schema(schema)
    assert rewritten["type"] == "number"
    assert [g.keyword for g in schema_gaps(rewritten)] == ["multipleOf"]


TOO_LARGE = {(6, "^[ab]*b[ab]$"), (6, "^(x|yz)+(0|1)*$")}  # branching products


@pytest.mark.parametrize(
    "pattern", ["^[a-z]+$", "^(ab|c)*$", "^[ab]*b[ab]$", "^(x|yz)+(0|1)*$", "^a*(bc)?d*$"]
)
@pytest.mark.parametrize("low", [0, 1, 3, 6])
def test_a_minimum_length_expression_matches_exactly_what_it_should(pattern: str, low: int) -> None:
    """The rewritten pattern (state elimination after the counter) against the definition,
    on every string of up to 8 characters over the pattern's letters and one other."""
    node = lengths_into_pattern({"type": "string", "pattern": pattern, "minLength": low})
    letters = sorted({c for c in pattern if c.isalnum()}) + ["#"]
    if "minLength" in node:  # the expansion passed MAX_REGEX_CHARS: left as is, warned
        assert node["pattern"] == pattern and (low, pattern) in TOO_LARGE
        assert "minLength" in {gap.keyword for gap in schema_gaps(node)}
        return
    rewritten = re.compile(node["pattern"])
    for size in range(9):
        for chars in itertools.product(letters, repeat=size):
            text = "".join(chars)
            expected = re.fullmatch(pattern[1:-1], text) is not None and size >= low
            assert (rewritten.fullmatch(text) is not None) == expected, (text, node["pattern"])


def test_ipv4_is_written_as_a_pattern_without_leading_zeros() -> None:
    """xgrammar's ipv4 grammar accepts `010.0.0.1`, which an IPv4 parser rejects: the format
    becomes a pattern that agrees with the format checker."""
    schema = {"type": "string", "format": "ipv4"}
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    for value in ("1.2.3.4", "010.0.0.1", "255.255.255.255", "256.1.1.1", "0.0.0.0", "1.2.3"):
        assert accepts(schema, value) == validator.is_valid(value), value
    assert not schema_gaps(rewrite_schema(schema))


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="PTDWMYHS0129/~a#-Fx", max_size=9))
def test_formats_written_as_patterns_beside_a_length_are_xgrammars(text: str) -> None:
    """The patterns of uuid, duration and the JSON pointers match what xgrammar's own format
    grammars match (on strings without escapes)."""
    for fmt, pattern in LENGTH_FORMAT_PATTERNS.items():
        grammar = xgr.Grammar.from_json_schema(json.dumps({"type": "string", "format": fmt}))
        ours = re.fullmatch(pattern, text) is not None
        assert _accepts_text(grammar, json.dumps(text)) == ours, (fmt, text)


def test_lengths_beside_a_format() -> None:
    """Folded into the format's pattern, or implied by the format's shortest value; other
    formats keep their lengths, warned."""
    uuid = {"type": "string", "format": "uuid", "maxLength": 36}
    assert "maxLength" not in json.dumps(rewrite_schema(uuid))
    short = {"type": "string", "format": "duration", "maxLength": 4}
    for value, valid in [("P1D", True), ("P10D", True), ("P100D", False), ("PT1H", True)]:
        assert accepts(short, value) == valid
    for fmt, shortest in FORMAT_SHORTEST.items():  # implied: no warning
        schema = {"type": "string", "format": fmt, "minLength": shortest}
        lengths = {g.keyword for g in schema_gaps(schema)} & {"minLength", "maxLength"}
        assert rewrite_schema(schema) == schema and not lengths
        assert "minLength" in {
            g.keyword for g in schema_gaps({**schema, "minLength": shortest + 1})
        }
    email = {"type": "string", "format": "email", "maxLength": 30}
    assert [g.keyword for g in schema_gaps(rewrite_schema(email))] == ["maxLength"]
    examples = {"email": "a@b", "hostname": "a", "uri": "a:", "ipv6": "::", "uri-reference": ""}
    for fmt, text in examples.items():  # the shortest values exist
        assert len(text) == FORMAT_SHORTEST[fmt] and accepts(
            {"type": "string", "format": fmt}, text
        )

"""`not`, `if`/`then`/`else`, the dependency keywords and `required` as the rewrite writes
them (schema/negate.py, conditions.py, objects.py): random schemas whose rewritten form
jsonschema judges as it judges the original, and whose grammar, where no warning is left,
accepts exactly the valid values."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import xgrammar as xgr
from grammar_cases import validates
from hypothesis import given, settings
from hypothesis import strategies as st
from schema_suite import SuiteRunner

from plait.backend.grammar.compiler import GrammarError, GrammarKey, json_schema_grammar
from plait.backend.grammar.layout import DUMPS
from plait.backend.grammar.schema.rewrite import rewrite_schema
from plait.backend.grammar.schema.warnings import schema_gaps

NAMES = ("a", "b", "ab")
TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.5, -1.5, 2.25, 0.75, 4.5]),
    st.text("ab", max_size=3),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(NAMES), inner, max_size=3)
    ),
    max_leaves=6,
)
bounds = st.integers(0, 3)
leaf_keywords = st.one_of(
    st.builds(lambda t: {"type": t}, st.sampled_from(TYPES)),
    st.builds(lambda ts: {"type": ts}, st.lists(st.sampled_from(TYPES), min_size=1, max_size=3)),
    st.builds(lambda k, v: {k: v}, st.sampled_from(["minimum", "exclusiveMaximum"]), bounds),
    st.builds(lambda v: {"multipleOf": v}, st.sampled_from([2, 0.5, 1.5, 0.25])),
    st.builds(lambda k, v: {k: v}, st.sampled_from(["minLength", "maxLength"]), bounds),
    st.builds(lambda k, v: {k: v}, st.sampled_from(["minItems", "maxProperties"]), bounds),
    st.builds(lambda p: {"pattern": p}, st.sampled_from(["^a", "b$", "^(ab)*$", "a"])),
    st.builds(lambda v: {"const": v}, scalars),
    st.builds(lambda vs: {"enum": vs}, st.lists(scalars, min_size=1, max_size=3)),
    st.builds(lambda ns: {"required": ns}, st.lists(st.sampled_from(NAMES), max_size=2)),
)


def _combine(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    props = st.dictionaries(st.sampled_from(NAMES), inner, min_size=1, max_size=2)
    needed = st.lists(st.sampled_from(NAMES), max_size=2)
    return st.one_of(
        st.builds(lambda a, b: {**a, **b}, inner, inner),
        st.builds(lambda s: {"not": s}, inner),
        st.builds(lambda ss: {"anyOf": ss}, st.lists(inner, min_size=1, max_size=2)),
        st.builds(lambda ss: {"allOf": ss}, st.lists(inner, min_size=1, max_size=2)),
        st.builds(lambda i, t, e: {"if": i, "then": t, "else": e}, inner, inner, inner),
        st.builds(lambda i, t: {"if": i, "then": t}, inner, inner),
        st.builds(lambda p: {"properties": p}, props),
        st.builds(lambda p: {"prefixItems": p}, st.lists(inner, min_size=1, max_size=2)),
        st.builds(lambda n, d: {"dependentRequired": {n: d}}, st.sampled_from(NAMES), needed),
        st.builds(lambda n, s: {"dependentSchemas": {n: s}}, st.sampled_from(NAMES), inner),
        st.builds(lambda p: {"properties": p, "additionalProperties": False}, props),
        st.builds(lambda s: {"contains": s}, inner),
    )


schemas = st.recursive(leaf_keywords, _combine, max_leaves=5)
RUNNER = SuiteRunner()


@settings(max_examples=400, deadline=None)
@given(schemas, st.lists(values, min_size=1, max_size=6))
def test_the_rewrite_keeps_every_verdict(schema: Any, instances: list[Any]) -> None:
    rewritten = rewrite_schema(schema)
    for value in instances:
        assert validates(rewritten, value) == validates(schema, value), (rewritten, value)


def _writable(value: Any) -> bool:
    """Values whose text the grammars here can write: strings without escapes."""
    return all(not re.search(r'["\\\x00-\x1f]', s) for s in _strings(value))


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    return []


@settings(max_examples=250, deadline=None)
@given(schemas, st.lists(values, min_size=1, max_size=6))
def test_without_warnings_the_grammar_is_exact(schema: Any, instances: list[Any]) -> None:
    """No warning at all (neither loose nor strict, but numbers written without an exponent)
    means the grammar accepts exactly the valid values (written as `json.dumps` does, any
    property order for valid ones)."""
    try:
        _, gaps = RUNNER.checker.compile(RUNNER.key(schema))
    except GrammarError:
        return  # nothing valid (refused, with xgrammar's message)
    if [g for g in gaps if "exponent" not in g.detail]:  # (the values here have none)
        return
    for value in filter(_writable, instances):
        valid = validates(schema, value)
        assert RUNNER.accepts(schema, value, any_order=valid) == valid, (schema, value)


def test_negations_and_conditions_leave_no_warning() -> None:
    """The forms of issue 30's list that now compile to an exact grammar."""
    exact = [
        {"not": {"type": "object", "properties": {"foo": {"type": "string"}}}},
        {"not": {"required": ["a", "b"]}},
        {"not": {"enum": ["x", 2, None]}},
        {"not": {"type": "string", "pattern": "^a+$"}},
        {"if": {"exclusiveMaximum": 0}, "then": {"minimum": -10}, "else": {"maximum": 5}},
        {
            "if": {"properties": {"kind": {"const": "a"}}, "required": ["kind"]},
            "then": {"required": ["x"]},
            "else": {"required": ["y"]},
        },  # fmt: skip
        {"type": "object", "dependentRequired": {"bar": ["foo"], "baz": ["foo", "bar"]}},
        {"dependentSchemas": {"a": {"properties": {"b": {"type": "integer"}}}}},
        {"dependencies": {"a": ["b"], "c": {"required": ["a"]}}},
        {"type": "object", "required": ["a"]},
    ]
    for schema in exact:
        loose = [g for g in schema_gaps(rewrite_schema(schema)) if g.effect == "loose"]
        assert loose == [], (json.dumps(schema), loose)


def test_names_that_may_not_appear_stay_out_of_open_objects() -> None:
    """`bar` requires `foo`; without `foo` an object may not name `bar`, declared or not, and
    the declared properties keep their schemas (no way round them as additional ones)."""
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "dependentRequired": {"bar": ["foo"]},
    }
    cases = [
        ({"n": 1}, True),
        ({"n": 1, "bar": 2}, False),
        ({"bar": 2, "foo": 1}, True),
        ({"x": 1, "bar": 2}, False),
        ({"barr": 1, "ba": 2}, True),
        ({"n": "one"}, False),
        ({"foo": 1, "n": "one"}, False),
    ]
    for value, valid in cases:
        assert validates(schema, value) == valid
        assert RUNNER.accepts(schema, value, any_order=valid) == valid, value


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True))
def test_a_dependency_product_is_bounded(names: list[str]) -> None:
    """Each dependency doubles the branches of an object; past the bound the keyword stays
    (and is warned about) instead of growing the schema without end."""
    many = {f"{n}{i}": [f"x{i}"] for i in range(8) for n in names}
    schema = {"type": "object", "dependentRequired": many}
    rewritten = rewrite_schema(schema)
    assert len(json.dumps(rewritten)) < 200_000
    if "dependentRequired" in json.dumps(rewritten):
        assert "dependentRequired" in {g.keyword for g in schema_gaps(rewritten)}


def test_random_walks_never_reach_a_dead_end() -> None:
    """From every prefix the grammar allows, some character (or the end) is allowed: random
    walks over a one-character vocabulary through the rewritten grammars, each step taken
    among the allowed characters, never find an empty mask."""
    chars = [chr(c) for c in range(32, 127)]
    info = xgr.TokenizerInfo([*chars, "</s>"], stop_token_ids=[len(chars)])
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    mask = xgr.allocate_token_bitmask(1, info.vocab_size)
    rng = random.Random(0)
    for schema in DEAD_END_CANDIDATES:
        grammar, _ = json_schema_grammar(GrammarKey("json_schema", json.dumps(schema), DUMPS))
        compiled = compiler.compile_grammar(grammar)
        for _ in range(20):
            matcher = xgr.GrammarMatcher(compiled)
            for _ in range(120):
                matcher.fill_next_token_bitmask(mask)
                bits = mask[0].tolist()
                allowed = [i for i in range(info.vocab_size) if bits[i // 32] >> (i % 32) & 1]
                assert allowed, schema
                token = rng.choice(allowed)
                if token == len(chars):
                    break
                assert matcher.accept_token(token)


DEAD_END_CANDIDATES = [
    {"type": "object", "properties": {"n": {"type": "integer"}}, "dependentRequired": {"b": ["f"]}},
    {"type": "object", "properties": {"a": {}}, "patternProperties": {"^x": {"type": "integer"}}},
    {"not": {"required": ["a"]}},
    {"type": "array", "contains": {"const": 1}, "minContains": 2, "maxContains": 3},
    {"type": "array", "items": {"enum": ["a", "b", 1]}, "uniqueItems": True, "minItems": 2},
    {"type": "number", "multipleOf": 0.25, "minimum": -1, "maximum": 3},
    {"not": {"type": "integer"}},
    {"not": {"enum": ["ab", "b", 2.5]}},
    {"not": {"type": "string", "pattern": "^a"}},
    {"if": {"properties": {"k": {"const": "a"}}}, "then": {"required": ["x"]}},
]


def test_hostile_schemas_stay_within_the_bounds() -> None:
    """Expansions past their bounds keep the keyword (warned) instead of growing: thousands of
    names beside a pattern, bounds of hundreds of digits, forty conditionals, counts past
    the states of a rule."""
    names = {f"property_name_{i}": {"type": "string"} for i in range(2000)}
    cases = {  # (`a` may not appear without `b`: a `not` its object cannot keep out)
        "not": {
            "type": "object",
            "properties": names,
            "patternProperties": {"^x": {}},
            "dependentRequired": {"a": ["b"]},
        },  # fmt: skip
        "multipleOf": {"type": "number", "multipleOf": 0.5, "minimum": 1e300},
        "allOf": {
            "allOf": [
                {
                    "if": {"properties": {f"k{i}": {"const": i}}, "required": [f"k{i}"]},
                    "then": {"required": [f"v{i}"]},
                }
                for i in range(40)
            ]
        },  # fmt: skip
        "contains": {
            "type": "array",
            "contains": {"const": 1},
            "minContains": 40,
            "maxContains": 50,
            "maxItems": 40,
        },  # fmt: skip
    }
    for keyword, schema in cases.items():  # (strict mode would close the object)
        key = GrammarKey("json_schema", json.dumps(schema), DUMPS, strict_mode=False)
        grammar, gaps = json_schema_grammar(key)
        assert keyword in {g.keyword for g in gaps if g.effect == "loose"}, keyword
        assert len(str(grammar)) < 2_000_000

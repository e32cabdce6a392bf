"""`contains` with `minContains`/`maxContains`, and `uniqueItems` over a few values, as the
grammar rules of schema/arrays.py and sequences.py: in every layout the grammar accepts
exactly the arrays jsonschema accepts, keeps no dead end, and stays warned past its bounds."""

from __future__ import annotations

import json
from typing import Any

import pytest
import xgrammar as xgr
from grammar_cases import StringChecker, validates
from hypothesis import given, settings
from hypothesis import strategies as st

from plait.backend.grammar.compiler import GrammarKey
from plait.backend.grammar.layout import COMPACT, DUMPS, FLEXIBLE, SPACED
from plait.backend.grammar.schema.arrays import MAX_VALUES
from plait.backend.grammar.schema.hoist import moved_rules
from plait.backend.grammar.schema.rewrite import rewrite_schema
from plait.backend.grammar.schema.sequences import Counted, sequence_rules
from plait.backend.grammar.schema.warnings import schema_gaps

CHECKER = StringChecker()
SEPARATORS = {COMPACT: (",", ":"), DUMPS: (", ", ": "), SPACED: (", ", ": "), FLEXIBLE: None}

items = st.integers(-2, 6) | st.sampled_from(["a", "b", "ab@cd.ef", True, None, 1.5])
conditions = st.sampled_from(
    [
        {"const": 1},
        {"minimum": 3},
        {"type": "string"},
        {"enum": [1, "a"]},
        {"type": "integer", "multipleOf": 2},
        {"not": {"type": "integer"}},
        {"type": "string", "format": "email"},  # no complement here: at least, not at most
    ]
)
NO_COMPLEMENT = ({"type": "string", "format": "email"},)
counts = st.none() | st.integers(0, 3)


def accepts(schema: Any, value: Any, layout: str) -> bool:
    text = json.dumps(schema, separators=(",", ":"))
    compiled, _ = CHECKER.compile(GrammarKey("json_schema", text, layout, strict_mode=False))
    separators = SEPARATORS[layout]
    written = (
        json.dumps(value, separators=separators) if separators else json.dumps(value, indent=2)
    )
    return CHECKER.accepts(compiled, written)


def loose(schema: Any) -> set[str]:
    return {g.keyword for g in schema_gaps(rewrite_schema(schema)) if g.effect == "loose"}


def _counted(condition: Any, low: int | None, high: int | None, longest: int | None) -> Any:
    schema: dict[str, Any] = {"type": "array", "contains": condition}
    for key, value in (("minContains", low), ("maxContains", high), ("maxItems", longest)):
        if value is not None:
            schema[key] = value
    return schema


@settings(max_examples=120, deadline=None)
@given(conditions, counts, counts, counts, st.lists(st.lists(items, max_size=5), max_size=6))
def test_counted_items_match_jsonschema(
    condition: Any, low: int | None, high: int | None, longest: int | None, arrays: list[Any]
) -> None:
    schema = _counted(condition, low, high, longest)
    if "maxContains" in schema and condition in NO_COMPLEMENT:
        assert "maxContains" in loose(schema)
        return
    assert not loose(schema)
    if not validates(rewrite_schema(schema), []) and not any(validates(schema, a) for a in arrays):
        return
    for array in arrays:
        expected = validates(schema, array)
        for layout in (DUMPS, COMPACT):
            assert accepts(schema, array, layout) == expected, (schema, array, layout)


@pytest.mark.parametrize("layout", [COMPACT, DUMPS, SPACED, FLEXIBLE])
def test_every_layout_writes_the_counted_rule(layout: str) -> None:
    schema = {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1},
              "minContains": 2, "maxContains": 3}  # fmt: skip
    cases = {(): False, (1,): False, (1, 2, 1): True, (1, 1, 1, 1): False, (2, 1, 5, 1, 1): True}
    for array, valid in cases.items():
        assert validates(schema, list(array)) == valid
        assert accepts(schema, list(array), layout) == valid, (array, layout)
    assert accepts(schema, ["1", 1, 1], layout) is False  # items keep their own schema


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from(
        [
            {"items": {"enum": ["a", "b", 1, 2.5]}},
            {"items": {"type": "boolean"}},
            {"items": {"type": "integer", "minimum": 1, "exclusiveMaximum": 4}},
            {"prefixItems": [{"type": "boolean"}, {"type": "boolean"}], "maxItems": 2},
            {"prefixItems": [{"enum": [1, 2]}], "items": {"enum": [2, 3]}, "minItems": 2},
        ]
    ),
    st.lists(st.lists(st.sampled_from(["a", "b", 1, 2, 3, 2.5, True, False]), max_size=4)),
)
def test_distinct_values_match_jsonschema(shape: dict[str, Any], arrays: list[Any]) -> None:
    schema = {"type": "array", "uniqueItems": True, **shape}
    assert "uniqueItems" not in loose(schema)
    for array in arrays:
        assert accepts(schema, array, DUMPS) == validates(schema, array), (schema, array)


def test_what_has_no_rule_stays_warned() -> None:
    many = {"type": "array", "items": {"enum": list(range(MAX_VALUES + 1))}, "uniqueItems": True}
    assert "uniqueItems" in loose(many)
    assert "uniqueItems" in loose(
        {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    )
    huge = {"type": "array", "contains": {"const": 1}, "minContains": 100, "maxContains": 100,
            "maxItems": 100}  # fmt: skip
    assert {"contains", "minContains", "maxContains"} <= loose(huge)
    tuples = {"type": "array", "prefixItems": [{"type": "string"}], "contains": {"const": 1}}
    assert "contains" in loose(tuples)


def test_arrays_no_value_meets_are_false() -> None:
    """maxContains below minContains, more distinct items than values: nothing is valid."""
    assert (
        rewrite_schema({"type": "array", "contains": {}, "minContains": 3, "maxContains": 1})
        is False
    )
    fewer = {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True, "minItems": 3}
    assert rewrite_schema(fewer) is False


def test_rules_have_no_dead_ends() -> None:
    """Every written state can still end the array (only live states are written)."""
    spec = Counted("m", "o", low=2, high=3, shortest=1, longest=4)
    rules = sequence_rules("r", spec, DUMPS)
    names = set(rules)
    assert all(rules[name] for name in names)
    for name, alternatives in rules.items():
        for alternative in alternatives:
            targets = [t for t in alternative.split() if t.startswith("plait_r_")]
            assert all(t in names for t in targets), (name, alternative)
    written = "\n".join(f"{n} ::= {' | '.join(a)}" for n, a in rules.items())
    grammar = xgr.Grammar.from_ebnf(f'root ::= r\ndefs_m ::= "1"\ndefs_o ::= "2"\n{written}\n')
    assert xgr.testing._is_grammar_accept_string(grammar, "[2, 1, 1]")
    assert not xgr.testing._is_grammar_accept_string(grammar, "[1, 1, 1, 1]")


def test_moved_arrays_are_read_back_from_the_schema() -> None:
    flags = {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True}
    ones = {"type": "array", "contains": {"const": 1}}
    schema = {"type": "object", "properties": {"a": ones, "b": flags}}
    rewritten = rewrite_schema(schema)
    assert set(moved_rules(rewritten)) == {"plait_rule_a", "plait_rule_b"}
    assert rewritten["properties"]["a"] == {"$ref": "#/$defs/plait_rule_a"}
    assert not any(ch.isdigit() for name in rewritten["$defs"] for ch in name)

"""Numbers with a rule of their own (schema/numbers.py): decimal steps, steps beside a range,
numbers that are not integers or not multiples. The automaton is checked against exact
decimal arithmetic on number texts, the compiled grammar against it on values, and what
has no rule stays warned."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from typing import Any

from grammar_cases import validates
from hypothesis import given, settings
from hypothesis import strategies as st
from schema_suite import SuiteRunner

from plait.backend.grammar.schema.numbers import (
    Numeric,
    number_fsm,
    number_rules,
    number_states,
    numeric_of,
)
from plait.backend.grammar.schema.rewrite import rewrite_schema
from plait.backend.grammar.schema.warnings import schema_gaps

RUNNER = SuiteRunner()
SYNTAX = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")

decimals = st.builds(
    lambda n, d: Fraction(n, d), st.integers(-300, 300), st.sampled_from([1, 2, 4, 10, 100])
)
steps = st.sampled_from([Fraction(3, 2), Fraction(1, 4), Fraction(5), Fraction(1, 100),
                         Fraction(7, 10), Fraction(12)])  # fmt: skip
specs = st.builds(
    Numeric,
    st.none() | decimals,
    st.booleans(),
    st.none() | decimals,
    st.booleans(),
    st.none() | steps,
    st.none() | st.sampled_from([Fraction(1, 2), Fraction(3)]),
    st.sampled_from([None, True, False]),
)
texts = st.builds(
    lambda sign, whole, fraction: sign + whole + fraction,
    st.sampled_from(["", "-"]),
    st.sampled_from(["0", "1", "2", "3", "7", "12", "24", "60", "150", "00", "01"]),
    st.sampled_from(["", ".0", ".5", ".25", ".75", ".05", ".50", ".01", ".125", ".", "e1"]),
)


def allowed(spec: Numeric, text: str) -> bool:
    """`spec` in exact decimal arithmetic, on the exponent-free number syntax."""
    if not SYNTAX.fullmatch(text):
        return False
    value = Fraction(text)
    checks = [
        spec.low is None or (value > spec.low if spec.low_open else value >= spec.low),
        spec.high is None or (value < spec.high if spec.high_open else value <= spec.high),
        spec.step is None or (value / spec.step).denominator == 1,
        spec.off_step is None or (value / spec.off_step).denominator != 1,
        spec.integral is not True or "." not in text,
        spec.integral is not False or value.denominator != 1,
    ]
    return all(checks)


@settings(max_examples=300, deadline=None)
@given(specs, st.lists(texts, min_size=1, max_size=12))
def test_the_automaton_is_the_decimal_arithmetic(spec: Numeric, samples: list[str]) -> None:
    fsm = number_fsm(spec)
    for text in samples:
        assert fsm.accepts(text) == allowed(spec, text), (spec, text)


@settings(max_examples=60, deadline=None)
@given(specs)
def test_rules_write_only_live_states(spec: Numeric) -> None:
    rules = number_rules("r", spec)
    if number_states(spec) == 0:
        return
    assert len(rules) == number_states(spec) + 1
    for alternatives in rules.values():
        assert alternatives  # every state can still end a number
        for alternative in alternatives:
            assert all(t in rules for t in alternative.split() if t.startswith("plait_r_q"))


def exactly_valid(schema: dict[str, Any], value: Any) -> bool:
    """jsonschema's verdict, `multipleOf` in decimal arithmetic (jsonschema divides floats)."""
    step = schema.get("multipleOf")
    rest = {k: v for k, v in schema.items() if k != "multipleOf"}
    multiple = step is None or (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and (Fraction(repr(value)) / Fraction(repr(step))).denominator == 1
    )
    return multiple and validates(rest, value)


number_schemas = st.builds(
    lambda t, step, low, high, fractional: {
        "type": t,
        **({"multipleOf": step} if step else {}),
        **({"minimum": low} if low is not None else {}),
        **({"exclusiveMaximum": high} if high is not None else {}),
        **({"not": {"type": "integer"}} if fractional else {}),
    },
    st.sampled_from(["number", "integer"]),
    st.sampled_from([None, 0.5, 0.01, 1.5, 3, 0.25]),
    st.none() | st.sampled_from([-2, 0, 0.5, 3]),
    st.none() | st.sampled_from([-1, 1, 4.5, 100]),
    st.booleans(),
)
values = st.one_of(
    st.integers(-10, 200),
    st.sampled_from([0.5, -1.5, 2.25, 0.01, 0.07, 4.5, 99.99, 1.0, -0.25, 12.5, 3.0]),
)


@settings(max_examples=120, deadline=None)
@given(number_schemas, st.lists(values, min_size=1, max_size=8))
def test_compiled_number_grammars_are_exact(schema: dict[str, Any], samples: list[Any]) -> None:
    """Where no warning is left but "written without an exponent" (strict) the grammar
    accepts exactly the valid numbers (json.dumps writes these without one)."""
    rewritten = rewrite_schema(schema)
    if rewritten is False or [g for g in schema_gaps(rewritten) if "exponent" not in g.detail]:
        return  # no number at all (refused, with xgrammar's message), or warned
    for value in samples:
        expected = exactly_valid(schema, value)
        if isinstance(value, float) and value.is_integer() and "integer" in json.dumps(rewritten):
            continue  # 3.0 is an integer; integer grammars write no fraction (strict)
        assert RUNNER.accepts(schema, value, any_order=False) == expected, (schema, value)


def test_which_numbers_get_a_rule() -> None:
    assert numeric_of({"type": "integer", "multipleOf": 3}) is None  # xgrammar's own
    assert numeric_of({"type": "integer", "minimum": 3}) is None
    assert numeric_of({"type": "integer", "multipleOf": 3, "minimum": 3}) is not None
    assert numeric_of({"type": "number", "multipleOf": 0.5}) is not None
    assert numeric_of({"type": "number", "not": {"type": "integer"}}) is not None
    # an integer multiple of 1e-8 is any integer: of 0.5, any integer too (the step is 1)
    whole = numeric_of({"type": "integer", "multipleOf": 0.5, "maximum": 9})
    assert whole is not None and whole.step == 1


def test_numbers_with_a_rule_are_reported_strict() -> None:
    gaps = schema_gaps(rewrite_schema({"type": "number", "multipleOf": 0.01}))
    assert [(g.keyword, g.effect) for g in gaps] == [("multipleOf", "strict")]


def test_steps_of_too_many_states_stay_warned() -> None:
    many = {"type": "number", "multipleOf": 0.123456789}
    assert [g.keyword for g in schema_gaps(rewrite_schema(many))] == ["multipleOf"]
    ranged = {"type": "integer", "multipleOf": 5000, "minimum": 1}
    assert [g.keyword for g in schema_gaps(rewrite_schema(ranged))] == ["multipleOf"]


def test_a_number_no_value_meets_is_false() -> None:
    assert rewrite_schema({"type": "integer", "multipleOf": 5, "minimum": 1, "maximum": 4}) is False
    both = rewrite_schema(
        {"type": "number", "minimum": 2, "maximum": 2, "not": {"type": "integer"}}
    )
    assert both is False
    assert json.dumps(rewrite_schema({"type": "number", "multipleOf": 0.5, "maximum": 1}))

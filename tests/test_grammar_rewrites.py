"""The schema rewrites of issue 30, one by one: untyped keywords split by type, `$ref`s
resolved to root pointers, boolean subschemas, calendar formats as patterns, and the
warnings for what stays loose."""

from __future__ import annotations

import datetime
import json
import re
from typing import Any

from plait.backend.grammar.schema.booleans import booleans_as_objects
from plait.backend.grammar.schema.formats import FORMAT_PATTERNS
from plait.backend.grammar.schema.refs import resolve_refs
from plait.backend.grammar.schema.rewrite import rewrite_schema
from plait.backend.grammar.schema.types import split_by_type
from plait.backend.grammar.schema.warnings import schema_gaps


def loose(schema: Any) -> set[str]:
    return {g.keyword for g in schema_gaps(rewrite_schema(schema)) if g.effect == "loose"}


def test_untyped_keywords_go_under_their_type() -> None:
    node = {"title": "t", "maxLength": 2, "minimum": 1, "required": ["a"]}
    assert split_by_type(node) == {
        "title": "t",
        "anyOf": [
            {"type": "string", "maxLength": 2},
            {"type": "number", "minimum": 1},
            {"type": "object", "required": ["a"]},
            {"type": ["null", "boolean", "array"]},
        ],
    }
    for kept in ({"type": "string", "maxLength": 2}, {"enum": [1], "maxLength": 2}, {}):
        assert split_by_type(kept) is kept


def test_refs_become_root_pointers_and_ids_go() -> None:
    schema = {
        "$id": "http://example.com/root.json",
        "properties": {
            "a": {"$ref": "#item"},
            "b": {"$ref": "#/properties/c"},
            "c": {"$id": "c.json", "type": "integer"},
            "d": {"$ref": "c.json"},
            "e": {"$ref": "http://other.example/x.json"},
        },
        "$defs": {"item": {"$anchor": "item", "type": "string"}},
    }
    out = resolve_refs(schema)
    props = out["properties"]
    assert props["a"] == {"$ref": "#/$defs/item"}
    assert props["b"] == props["d"] == {"$ref": "#/$defs/plait_ref_1"}
    assert out["$defs"]["plait_ref_1"] == {"type": "integer"}
    assert props["e"] == {"$ref": "http://other.example/x.json"}  # another document
    assert "$id" not in out and "$anchor" not in out["$defs"]["item"]
    assert "$id" in schema  # the input is not modified
    assert "$ref" in loose(schema)  # the remote one


def test_urn_ids_and_percent_escapes_resolve() -> None:
    schema = {
        "$id": "urn:uuid:deadbeef-1234-0000-0000-4321feebdaed",
        "$defs": {'a"b': {"type": "string"}},
        "properties": {"x": {"$ref": "urn:uuid:deadbeef-1234-0000-0000-4321feebdaed#/$defs/a%22b"}},
    }
    assert resolve_refs(schema)["properties"]["x"] == {"$ref": '#/$defs/a"b'}


def test_a_schema_with_dynamic_refs_is_left_and_warned() -> None:
    schema = {"$dynamicRef": "#x", "$defs": {"x": {"$dynamicAnchor": "x", "type": "string"}}}
    assert resolve_refs(schema) == schema
    assert "$dynamicRef" in loose(schema)


def test_boolean_subschemas() -> None:
    assert booleans_as_objects({"prefixItems": [True, False, {}], "items": {}}) == {
        "prefixItems": [{}],
        "maxItems": 1,
    }
    assert booleans_as_objects({"prefixItems": [{"type": "string"}], "items": False}) == {
        "prefixItems": [{"type": "string"}],
        "maxItems": 1,
    }
    closed = {"properties": {"a": False, "b": True}, "additionalProperties": False}
    assert booleans_as_objects(closed) == {
        "properties": {"b": {}},
        "additionalProperties": False,
    }
    # an open object keeps the name out of its other names (objects.ban_names)
    kept_out = booleans_as_objects({"properties": {"a": False, "b": {"type": "null"}}})
    assert kept_out["properties"] == {"b": {"type": "null"}}
    assert kept_out["additionalProperties"] is False
    [(others, extra)] = kept_out["patternProperties"].items()
    assert extra == {}
    assert [n for n in ("", "a", "b", "ab", "aa", "ba") if re.fullmatch(others, n)] == [
        "",
        "ab",
        "aa",
        "ba",
    ]
    needs_a = {"type": "object", "properties": {"a": False}, "required": ["a"]}
    assert booleans_as_objects(needs_a) is False
    # without a type, non-objects stay valid; a name patternProperties match is kept out of it
    untyped = booleans_as_objects({"properties": {"a": False}, "required": ["a"]})
    assert untyped == {"properties": {"a": {"not": {}}}, "required": ["a"]}
    patterned = {"properties": {"a": False}, "patternProperties": {"^a[0-9]*$": {}},
                 "additionalProperties": False}  # fmt: skip
    names = ("a", "a1", "a12", "b")
    out = booleans_as_objects(patterned)
    assert set(out) == {"additionalProperties", "patternProperties"}
    [(kept, _)] = out["patternProperties"].items()
    assert [n for n in names if re.fullmatch(kept, n)] == ["a1", "a12"]
    unanchored = {**patterned, "type": "object", "patternProperties": {"^a": {}}}  # not anchored
    assert booleans_as_objects(unanchored)["properties"] == {"a": {"not": {}}}
    [(kept, _)] = rewrite_schema(unanchored)["patternProperties"].items()
    assert [n for n in names if re.fullmatch(kept, n)] == ["a1", "a12"]
    assert booleans_as_objects({"allOf": [True, False]}) is False
    assert booleans_as_objects({"anyOf": [False, {"type": "null"}]}) == {
        "anyOf": [{"type": "null"}]
    }
    assert booleans_as_objects({"propertyNames": False}) == {"maxProperties": 0}
    assert booleans_as_objects({"patternProperties": {"a": False, "b": True}}) == {
        "patternProperties": {"a": {"not": {}}, "b": {}}
    }
    assert booleans_as_objects({"not": True}) is False
    assert booleans_as_objects({"not": False, "type": "null"}) == {"type": "null"}


def test_dates_know_each_month_and_leap_years() -> None:
    pattern = re.compile(FORMAT_PATTERNS["date"])
    for year in (1, 4, 100, 400, 1900, 2000, 2023, 2024, 2100, 9996, 9999):
        for month in range(1, 13):
            for day in range(1, 32):
                text = f"{year:04d}-{month:02d}-{day:02d}"
                try:
                    real = bool(datetime.date(year, month, day))
                except ValueError:
                    real = False
                assert bool(pattern.fullmatch(text)) == real, text
    assert pattern.fullmatch("0000-01-01") is None
    assert rewrite_schema({"type": "string", "format": "date"}) == {
        "type": "string",
        "pattern": FORMAT_PATTERNS["date"],
    }


def test_times_and_leap_seconds() -> None:
    pattern = re.compile(FORMAT_PATTERNS["date-time"])
    good = ["2024-02-29T23:59:60Z", "2023-01-01t00:00:00.5z", "2023-01-01T23:59:59-23:59"]
    bad = ["2023-02-29T00:00:00Z", "2023-01-01T24:00:00Z", "2023-01-01T23:58:60Z"]
    bad += ["2023-01-01T10:00:00+10:60", "2023-01-01T10:00:00", "2023-01-01 10:00:00Z"]
    assert all(pattern.fullmatch(t) for t in good)
    assert not any(pattern.fullmatch(t) for t in bad)
    gaps = schema_gaps(rewrite_schema({"type": "string", "format": "time"}))
    assert [(g.keyword, g.effect) for g in gaps] == [("format", "strict")]


def test_what_stays_loose_is_warned() -> None:
    assert "propertyNames" in loose({"type": "object", "propertyNames": {"maxLength": 3}})
    assert "format" in loose({"type": "string", "format": "hostname"})
    assert "properties" in loose({"type": "object", "properties": {'a"b': {"type": "null"}}})
    assert "oneOf" in loose({"allOf": [{"type": "integer"}], "anyOf": [{}], "oneOf": [{}]})


def test_negated_types_and_values_are_removed() -> None:
    assert rewrite_schema({"not": {"type": "string"}}) == {
        "type": ["null", "boolean", "object", "array", "number"]
    }
    assert rewrite_schema({"type": ["string", "null"], "not": {"type": "null"}}) == {
        "type": "string"
    }
    assert rewrite_schema({"enum": [1, 2, 3], "not": {"enum": [2]}}) == {"enum": [1, 3]}
    assert rewrite_schema({"enum": ["a", "b"], "not": {"const": "a"}}) == {"enum": ["b"]}
    # the numbers that are not integers have a rule of their own (numbers.py)
    fractional = rewrite_schema({"not": {"type": "integer"}})
    assert fractional["anyOf"] == [
        {"type": ["null", "boolean", "object", "array", "string"]},
        {"$ref": "#/$defs/plait_rule_a"},
    ]
    assert fractional["$defs"] == {"plait_rule_a": {"type": "number", "not": {"type": "integer"}}}
    assert "not" not in loose({"not": {"type": "integer"}})
    assert rewrite_schema({"enum": [1], "not": {"enum": [1]}}) is False  # nothing is left


def test_copies_of_moved_targets_are_bounded() -> None:
    big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2000)}}
    schema = {"properties": {f"r{i}": {"$ref": f"#/properties/big{i}"} for i in range(40)}}
    schema["properties"].update({f"big{i}": big for i in range(40)})
    assert resolve_refs(schema) is schema  # 40 copies of 60 KB: left as it was
    small = {"properties": {"a": {"type": "null"}, "b": {"$ref": "#/properties/a"}}}
    assert resolve_refs(small)["$defs"] == {"plait_ref_0": {"type": "null"}}


def test_merges_copy_within_a_budget() -> None:
    """400 refs to one 2,000-property schema beside a sibling keyword: the merge would copy
    the target 400 times (tens of MB); past the budget the combinator stays as written."""
    big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2000)}}
    schema = {"$defs": {"big": big}, "minProperties": 1, "anyOf": [{"$ref": "#/$defs/big"}] * 400}
    out = rewrite_schema(schema)
    assert len(json.dumps(out)) < 2 * len(json.dumps(schema))
    assert out["anyOf"] == schema["anyOf"]


def test_refs_left_unresolved_keep_their_targets_in_place() -> None:
    """With $dynamicRef the refs stay as written, so no untyped node is split by type (a
    split would move `#/properties/big` away from where the ref points)."""
    schema = {
        "properties": {"r": {"$ref": "#/properties/big"}, "big": {"maxLength": 3}},
        "$defs": {"d": {"$dynamicRef": "#x"}},
    }
    assert rewrite_schema(schema)["properties"] == schema["properties"]


def test_not_const_treats_whole_floats_as_integers() -> None:
    out = rewrite_schema({"enum": [1, 2], "not": {"const": 1.0}})
    assert out["enum"] == [2]


def test_time_fractions_need_their_dot_in_the_compiled_grammar() -> None:
    """xgrammar drops the first element of an optional group holding a `+`; the time
    patterns avoid that shape (a model wrote "10:10:1000...0" through `(?:\\.[0-9]+)?`)."""
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string as accepts

    schema = {"type": "string", "pattern": FORMAT_PATTERNS["date-time"]}
    grammar = xgr.Grammar.from_json_schema(json.dumps(schema))
    for text, ok in [
        ("1000-10-10T10:10:10.25Z", True),
        ("1000-10-10T10:10:10Z", True),
        ("1000-10-10T10:10:1025Z", False),
        ("2119-06-30t00:11:29260017556812015861-21:13", False),
    ]:
        assert accepts(grammar, json.dumps(text)) is ok, text

"""structural_tag constraints (tool calls, tagged sections) on plait-tiny's random weights."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import xgrammar as xgr
from grammar_cases import LlgStringChecker, validates

import plait
from helpers import tiny_engine
from plait.backend.engine.engine import Engine, GenerationError
from plait.backend.grammar.compiler import build_grammar
from plait.backend.grammar.keys import GrammarKey
from plait.backend.grammar.layout import COMPACT
from plait.backend.grammar.structural_tag import (
    StructuralTagError,
    expand_json_schemas,
    normalize_structural_tag,
)

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "tags": {"type": "array", "items": {"enum": ["rain", "sun"]}, "uniqueItems": True},
    },
    "required": ["city", "days"],
}
SEQUENCE = {
    "type": "structural_tag",
    "format": {
        "type": "sequence",
        "elements": [
            {"type": "const_string", "value": "Calling: "},
            {
                "type": "tag",
                "begin": "<call>",
                "content": {"type": "json_schema", "json_schema": WEATHER},
                "end": "</call>",
            },
        ],
    },
}
TRIGGERED = {
    "type": "structural_tag",
    "format": {
        "type": "triggered_tags",
        "triggers": ["<f="],
        "tags": [
            {
                "type": "tag",
                "begin": "<f=weather>",
                "content": {"type": "json_schema", "json_schema": WEATHER},
                "end": "</f>",
            },
            {
                "type": "tag",
                "begin": "<f=clock>",
                "content": {"type": "regex", "pattern": r"[0-2][0-9]:[0-5][0-9]"},
                "end": "</f>",
            },
        ],
        "at_least_one": True,
        "stop_after_first": True,
    },
}
# "(" is a frequent token of plait-tiny's prior, so the trigger fires in most outputs.
LEGACY = {
    "type": "structural_tag",
    "structures": [{"begin": "(weather ", "schema": WEATHER, "end": ")"}],
    "triggers": ["("],
}


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with tiny_engine() as eng:
        yield eng


def run(
    engine: Engine, tag: dict[str, Any], n: int, *, backend: str, tokens: int = 128
) -> list[dict[str, Any]]:
    on = {"structural_tag": tag, "grammar_backend": backend}
    params = [{"max_new_tokens": tokens, "temperature": 1.0, "seed": i, **on} for i in range(n)]
    return engine.generate(["Tool call:"] * n, params)


WEATHER_WARNINGS = {
    "xgrammar": [  # the tags' uniqueItems has a rule of its own (two values)
        "json_schema keyword 'maxLength' is enforced more strictly (length-bounded strings "
        "cannot hold escape sequences) at /properties/city",
    ],
    "llguidance": [
        "json_schema keyword 'uniqueItems' is not enforced (llguidance does not implement it)"
    ],
}


def test_sequence_gives_the_exact_structure_with_valid_json(
    engine: Engine, grammar_backend: str
) -> None:
    outs = run(engine, SEQUENCE, 8, backend=grammar_backend)
    assert all(o["finish_reason"]["type"] == "stop" for o in outs)
    for out in outs:
        m = re.fullmatch(r"Calling: <call>(.*)</call>", out["text"], re.S)
        assert m is not None, out["text"]
        assert validates(enforced_weather(grammar_backend), json.loads(m.group(1), strict=False))
        outside_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', m.group(1))
        # the default layout, like a json_schema constraint: at most one space per gap
        assert not re.search(r"\s\s|[\n\t\r]", outside_strings)
        assert out["warnings"] == WEATHER_WARNINGS[grammar_backend]


def test_triggered_tags_dispatch_to_each_tag_content(engine: Engine, grammar_backend: str) -> None:
    outs = run(engine, TRIGGERED, 8, backend=grammar_backend)
    kinds = set()
    for out in outs:
        assert out["finish_reason"]["type"] == "stop", out
        m = re.fullmatch(r"(.*?)<f=(weather|clock)>(.*)</f>", out["text"], re.S)
        assert m is not None, out["text"]
        assert "<f=" not in m.group(1)
        kinds.add(m.group(2))
        if m.group(2) == "clock":
            assert re.fullmatch(r"[0-2][0-9]:[0-5][0-9]", m.group(3))
        else:
            assert validates(
                enforced_weather(grammar_backend), json.loads(m.group(3), strict=False)
            )
    assert kinds  # at_least_one: every output holds a tag


def test_legacy_structures_and_triggers(engine: Engine, grammar_backend: str) -> None:
    calls = 0
    for out in run(engine, LEGACY, 6, backend=grammar_backend, tokens=96):
        text = out["text"]
        for body in re.findall(r"\(weather (\{.*?\})\)", text, re.S):
            assert validates(enforced_weather(grammar_backend), json.loads(body, strict=False))
            calls += 1
        outside = re.sub(r"\(weather \{.*?\}\)", "", text, flags=re.S)
        # A trigger always opens a tag; an unfinished one can only be the cut-off end.
        assert "(" not in outside or out["finish_reason"]["type"] == "length", text
    assert calls >= 3


@pytest.mark.parametrize(
    ("tag", "message"),
    [
        ("{bad", "structural_tag is not valid JSON"),
        ("[" * 5000 + "]" * 5000, "structural_tag is not valid JSON"),
        ({"format": {"type": "nope"}}, "invalid structural_tag: .*nope"),
        ({"type": "json_schema", "format": {}}, "structural_tag.type must be 'structural_tag'"),
        ({"structures": [{"begin": "<a>"}], "triggers": ["<a"]}, r"structures\[0\] needs"),
        ({"structures": [], "triggers": ["<"]}, "structures must be a non-empty list"),
        ({"type": "structural_tag"}, "needs a 'format' object"),
    ],
)
def test_bad_tags_fail_only_their_request(
    engine: Engine, grammar_backend: str, tag: Any, message: str
) -> None:
    on = {"structural_tag": tag, "grammar_backend": grammar_backend}
    with pytest.raises(GenerationError, match=message):
        engine.generate("x", {"max_new_tokens": 4, **on})
    assert (
        engine.generate("x", {"max_new_tokens": 2, "ignore_eos": True})["usage"][
            "completion_tokens"
        ]
        == 2
    )


def test_one_constraint_at_most(engine: Engine) -> None:
    with pytest.raises(GenerationError, match="at most one constraint"):
        engine.generate("x", {"regex": "a", "structural_tag": SEQUENCE})


def test_a_program_can_ask_for_a_tool_call(engine: Engine, grammar_backend: str) -> None:
    @plait.program
    def agent(s):  # type: ignore[no-untyped-def]
        s += "Weather today? " + plait.gen("call", structural_tag=SEQUENCE, max_tokens=128)

    local = plait.LocalBackend(engine=engine)
    state = agent.run(backend=local, temperature=1.0, seed=3, grammar_backend=grammar_backend)
    assert re.fullmatch(r"Calling: <call>\{.*\}</call>", state["call"], re.S)
    assert state.text() == "Weather today? " + state["call"]


def test_normalized_form_and_which_sections_are_expanded() -> None:
    legacy = json.loads(normalize_structural_tag(LEGACY))
    assert legacy == {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": ["("],
            "tags": [
                {
                    "type": "tag",
                    "begin": "(weather ",
                    "content": {"type": "json_schema", "json_schema": WEATHER},
                    "end": ")",
                }
            ],
        },
    }
    as_text = dict(LEGACY, structures=[dict(LEGACY["structures"][0], schema=json.dumps(WEATHER))])
    assert normalize_structural_tag(json.dumps(as_text)) == normalize_structural_tag(LEGACY)
    xml = {"type": "json_schema", "json_schema": WEATHER, "style": "qwen_xml"}
    tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": [xml, xml]}}
    tag["format"]["elements"][0] = {"type": "json_schema", "json_schema": WEATHER}
    expanded, warnings = expand_json_schemas(json.dumps(tag), lambda s: ('root ::= "{}"', ("w",)))
    first, second = json.loads(expanded)["format"]["elements"]
    assert first == {"type": "grammar", "grammar": 'root ::= "{}"'}
    assert second == xml  # another style is xgrammar's to handle
    assert warnings == ("w",)
    with pytest.raises(StructuralTagError, match="must be an object"):
        normalize_structural_tag("[1]")


def enforced_weather(backend: str) -> dict[str, Any]:
    """WEATHER as the backend enforces it: xgrammar enforces the tags' uniqueItems (a rule of
    its own); llguidance warns that it cannot, so the check goes without it."""
    if backend == "xgrammar":
        return WEATHER
    out = json.loads(json.dumps(WEATHER))
    out["properties"]["tags"].pop("uniqueItems")
    return out


# --- llguidance's Lark against xgrammar, string by string -----------------------------------
DIGIT_TAG = {"type": "tag", "begin": "<f=c>", "content": {"type": "regex", "pattern": "[0-9]"},
             "end": "</f>"}  # fmt: skip
TRIGGER_TEXTS = ["", "abc", "<f=c>1</f>", "abc<f=c>1</f>", "<f=c>1</f>xyz", "<f=c>1</f>x<f=c>2</f>",
                 "<f=c>1</f><f=c>2</f>", "ab<f=x", "<f=c>12</f>"]  # fmt: skip
SEPARATED_TAGS = [
    {
        "type": "tag",
        "begin": "<a>",
        "content": {"type": "regex", "pattern": "[0-9]"},
        "end": "</a>",
    },
    {"type": "tag", "begin": "<b>", "content": {"type": "any_text"}, "end": ["</b>", "</c>"]},
]
SEPARATED_TEXTS = ["", "<a>1</a>", "<a>1</a>,<b>x</b>", "<a>1</a><b>x</b>", "x<a>1</a>",
                   "<a>1</a>,", "<b>hi</c>,<a>2</a>", "<b>h</b>i</b>"]  # fmt: skip
SEQUENCE_FORMAT = {"type": "sequence", "elements": [
    {"type": "const_string", "value": "Call: "},
    {"type": "or", "elements": [SEPARATED_TAGS[1], {"type": "regex", "pattern": "[0-9]{2}"}]},
    {"type": "optional", "content": {"type": "const_string", "value": "!"}},
    {"type": "repeat", "min": 0, "max": 2, "content": {"type": "const_string", "value": "ab"}},
]}  # fmt: skip
SEQUENCE_TEXTS = ["Call: <b>hi</b>", "Call: <b>hi</c>!", "Call: 42", "Call: 42!abab",
                  "Call: 42ababab", "Call: <b>h</b>i</b>", "Call: 4", "Call:42"]  # fmt: skip
ONE_INTEGER = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
JSON_TAG = {"type": "tag", "begin": "<j>", "end": "</j>",
            "content": {"type": "json_schema", "json_schema": ONE_INTEGER}}  # fmt: skip
JSON_TEXTS = ['<j>{"a":1}</j>', '<j>{"a":"x"}</j>', '<j>{"a":1,"b":2}</j>', '<j>{ "a":1}</j>',
              "<j>{}</j>"]  # fmt: skip
SHAPES = [
    *[
        (
            {
                "type": "triggered_tags",
                "triggers": ["<f="],
                "tags": [DIGIT_TAG],
                "at_least_one": one,
                "stop_after_first": first,
            },
            TRIGGER_TEXTS,
        )  # fmt: skip
        for one in (False, True)
        for first in (False, True)
    ],
    *[
        (
            {
                "type": "tags_with_separator",
                "tags": SEPARATED_TAGS,
                "separator": ",",
                "at_least_one": one,
                "stop_after_first": first,
            },
            SEPARATED_TEXTS,
        )  # fmt: skip
        for one in (False, True)
        for first in (False, True)
    ],
    (SEQUENCE_FORMAT, SEQUENCE_TEXTS),
    (JSON_TAG, JSON_TEXTS),
]


@pytest.mark.parametrize(("fmt", "texts"), SHAPES)
def test_llguidance_accepts_what_xgrammar_accepts(fmt: dict[str, Any], texts: list[str]) -> None:
    """Each tag shape built for both backends (plait's own builds, compact layout) decides
    every string alike; the strings include accepted and rejected ones for each shape."""
    text = normalize_structural_tag({"type": "structural_tag", "format": fmt})
    key = GrammarKey("structural_tag", text, COMPACT, strict_mode=True)
    xgr_built = build_grammar(key)
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)
    grammar = compiler.compile_grammar(xgr.Grammar.deserialize_json(xgr_built.data))
    checker = LlgStringChecker()
    llg_built = build_grammar(dataclasses.replace(key, backend="llguidance"))
    template = checker.compile(llg_built.data)
    verdicts = []
    for sample in texts:
        matcher = xgr.GrammarMatcher(grammar, terminate_without_stop_token=True)
        want = bool(matcher.accept_string(sample)) and bool(matcher.is_terminated())
        assert checker.accepts(template, sample) == want, sample
        verdicts.append(want)
    assert any(verdicts) and not all(verdicts)

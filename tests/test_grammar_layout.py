"""JSON layouts: which whitespace each allows between tokens, and that none allows runs, on
both grammar backends."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr
from grammar_cases import LlgStringChecker

from plait.backend.grammar.compiler import GrammarKey, build_grammar, grammar_key
from plait.backend.grammar.layout import (
    COMPACT,
    DEFAULT_LAYOUT,
    FLEXIBLE,
    MAX_INDENT,
    SPACED,
    resolve_layout,
    schema_grammar,
)
from plait.backend.request.sampling_params import SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "integer"}},
        "home": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
    "required": ["name", "tags", "home"],
}
VALUE = {"name": "Ann", "tags": [1, 2], "home": {"city": "Oslo"}}
COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)


LLG = LlgStringChecker()


def accepts(layout: str, text: str, backend: str = "xgrammar") -> bool:
    if backend == "llguidance":
        key = GrammarKey("json_schema", json.dumps(SCHEMA), layout, backend="llguidance")
        return LLG.accepts(LLG.compile(build_grammar(key).data), text)
    grammar = COMPILER.compile_grammar(schema_grammar(json.dumps(SCHEMA), layout=layout))
    matcher = xgr.GrammarMatcher(grammar, terminate_without_stop_token=True)
    return bool(matcher.accept_string(text)) and bool(matcher.is_terminated())


COMPACT_TEXT = json.dumps(VALUE, separators=(",", ":"))
SPACED_TEXT = json.dumps(VALUE)  # ", " and ": "
INDENTED = json.dumps(VALUE, indent=2)
LOOSE = '{ "name" : "Ann" , "tags" : [ 1 , 2 ] , "home" : { "city" : "Oslo" } }'


@pytest.mark.parametrize(
    ("layout", "allowed"),
    [
        (COMPACT, {COMPACT_TEXT}),
        (SPACED, {COMPACT_TEXT, SPACED_TEXT, LOOSE}),
        (FLEXIBLE, {COMPACT_TEXT, SPACED_TEXT, LOOSE, INDENTED}),
    ],
)
def test_each_layout_accepts_its_styles(
    layout: str, allowed: set[str], grammar_backend: str
) -> None:
    for text in (COMPACT_TEXT, SPACED_TEXT, LOOSE, INDENTED):
        assert accepts(layout, text, grammar_backend) == (text in allowed), (layout, text)


@pytest.mark.parametrize("layout", [COMPACT, SPACED, FLEXIBLE])
@pytest.mark.parametrize(
    "padded",
    [
        '{  "name":"Ann","tags":[1,2],"home":{"city":"Oslo"}}',  # two spaces
        '{"name":"Ann","tags":[1,2],"home":{"city":"Oslo"}   }',
        '{\n\n"name":"Ann","tags":[1,2],"home":{"city":"Oslo"}}',  # a blank line
        '{"name":"Ann",\t"tags":[1,2],"home":{"city":"Oslo"}}',  # a tab
        '{"name":"Ann", \n"tags":[1,2],"home":{"city":"Oslo"}}',  # space then newline
        '{"name":"Ann","tags":[1,2],"home":{"city":"Oslo"}\n' + " " * (MAX_INDENT + 1) + "}",
    ],
)
def test_no_layout_allows_a_run_of_padding(layout: str, padded: str, grammar_backend: str) -> None:
    assert not accepts(layout, padded, grammar_backend)


def test_indentation_up_to_the_limit_is_allowed(grammar_backend: str) -> None:
    deep = '{"name":"Ann","tags":[1,2],"home":{"city":"Oslo"\n' + " " * MAX_INDENT + "}}"
    assert accepts(FLEXIBLE, deep, grammar_backend)
    assert not accepts(SPACED, deep, grammar_backend)


def test_the_request_options_choose_the_layout() -> None:
    def key(**options: object) -> GrammarKey:
        return grammar_key(SamplingParams.from_dict({"json_schema": "{}", **options}))

    assert key().layout == DEFAULT_LAYOUT
    assert key(any_whitespace=True).layout == FLEXIBLE
    assert key(json_layout="compact", any_whitespace=True).layout == COMPACT
    assert resolve_layout(layout=None, any_whitespace=False) == DEFAULT_LAYOUT
    with pytest.raises(ValueError, match="json_layout"):
        SamplingParams.from_dict({"json_layout": "pretty"})

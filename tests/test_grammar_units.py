"""Grammar pieces without a model: schema walker and rewrite, regex DFA, retokenizer, backend."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import xgrammar as xgr
from transformers import PreTrainedTokenizerBase

from plait.backend.config import EngineConfig
from plait.backend.grammar.backend import GrammarBackend, make_grammar
from plait.backend.grammar.compiler import GrammarError, build_grammar, grammar_key
from plait.backend.grammar.jump_forward import Retokenizer
from plait.backend.grammar.keys import GrammarKey
from plait.backend.grammar.layout import DUMPS
from plait.backend.grammar.llg_build import build_llguidance
from plait.backend.grammar.regex_fsm import RegexCursor, RegexFSM
from plait.backend.grammar.schema.rewrite import rewrite_schema, search_pattern
from plait.backend.grammar.schema.warnings import gap_warnings, schema_gaps
from plait.backend.grammar.vocab import Vocab
from plait.backend.model.builtin import resolve_model_path
from plait.backend.request.req import Req
from plait.backend.request.sampling_params import SamplingParams
from plait.backend.text.tokenizer import load_tokenizer

EOS = frozenset({0, 2})


# --- schema walker --------------------------------------------------------------------------
def keywords(schema: dict[str, Any], *, effect: str = "loose") -> set[str]:
    return {g.keyword for g in schema_gaps(rewrite_schema(schema)) if g.effect == effect}


def test_walker_names_each_unenforced_keyword() -> None:
    schema = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "n": {"type": "number", "multipleOf": 0.123456789},  # too many remainders
            "k": {"type": "integer", "multipleOf": 3},
            "x": {"not": {"type": "array", "uniqueItems": True}},  # no complement
            "y": {"if": {"type": "string", "format": "email"}, "then": {"maxLength": 9}},
            "z": {  # two tuples: their merge has no exact form here
                "allOf": [
                    {"prefixItems": [{"type": "string"}]},
                    {"prefixItems": [{"maxLength": 2}]},
                ]
            },
            "d": {"type": "string", "format": "date"},
            "h": {"type": "number", "multipleOf": 0.5, "not": {"type": "integer"}},
        },
    }
    found = keywords(schema)
    assert found == {"uniqueItems", "multipleOf", "not", "if", "allOf"}  # a date is a pattern
    warnings = gap_warnings(schema_gaps(rewrite_schema(schema)))
    assert any("'uniqueItems' is not enforced" in w and "/properties/tags" in w for w in warnings)
    assert not any("/properties/k" in w for w in warnings)  # integer multipleOf is enforced
    ruled = [w for w in warnings if "/properties/h" in w or "plait_rule" in w]  # its own rule
    assert ruled == [
        "json_schema keyword 'multipleOf' is enforced more strictly (numbers are written "
        "without an exponent) at /$defs/plait_rule_a"
    ]


def test_walker_follows_refs_and_ignores_unused_definitions() -> None:
    schema = {
        "$defs": {"used": {"type": "array", "uniqueItems": True}, "unused": {"not": {}}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/used"}},
    }
    gaps = schema_gaps(schema)
    assert [(g.keyword, g.path) for g in gaps] == [("uniqueItems", "/$defs/used")]


def test_disjoint_one_of_is_not_reported() -> None:
    tagged = {
        "oneOf": [
            {"type": "object", "properties": {"t": {"const": "a"}}, "required": ["t"]},
            {"type": "object", "properties": {"t": {"const": "b"}}, "required": ["t"]},
        ]
    }
    assert keywords(tagged) == set()
    assert keywords({"oneOf": [{"type": "string"}, {"type": "integer"}]}) == set()
    assert keywords({"oneOf": [{"type": "integer"}, {"type": "number"}]}) == {"oneOf"}


def test_strict_gaps_are_separate_from_loose_ones() -> None:
    schema = {"type": "string", "maxLength": 5}
    assert keywords(schema, effect="strict") == {"maxLength"}
    assert keywords(schema) == set()


# --- schema rewrite ---------------------------------------------------------------------------
def test_rewrite_merges_all_of_and_distributes_siblings() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "anyOf": [{"required": ["b"]}, {"required": ["c"], "type": ["object", "null"]}],
        "allOf": [{"properties": {"b": {"type": "string"}}}],
    }
    out = rewrite_schema(schema)
    assert set(out) == {"anyOf"}
    first, second = out["anyOf"]
    assert first["required"] == ["a", "b"] and second["required"] == ["a", "c"]
    assert second["type"] == "object"
    assert first["properties"] == {"a": {"type": "integer"}, "b": {"type": "string"}}


def test_rewrite_leaves_what_it_cannot_merge_exactly() -> None:
    closed = {"allOf": [{"additionalProperties": False}, {"properties": {"a": {}}}]}
    assert rewrite_schema(closed) == {  # `a` may not appear: an empty object or another type
        "anyOf": [
            {"type": "object", "additionalProperties": False},
            {"type": ["null", "boolean", "array", "number", "string"]},
        ]
    }
    patterned = {"allOf": [{"additionalProperties": False}, {"patternProperties": {"^a": {}}}]}
    closed_first, patterns = rewrite_schema(patterned)["allOf"]
    assert closed_first == {"additionalProperties": False}
    assert search_pattern("^a") in patterns["patternProperties"]
    # two patterns meet in one (their DFAs' product), strings only
    [string, other] = rewrite_schema({"allOf": [{"pattern": "^a"}, {"pattern": "b$"}]})["anyOf"]
    assert string["type"] == "string" and "null" in other["type"]
    assert [t for t in ("ab", "a", "b", "axb", "ba") if re.fullmatch(string["pattern"], t)] == [
        "ab",
        "axb",
    ]


@pytest.mark.parametrize(
    ("pattern", "anchored"),
    [
        ("@", r"^[\s\S]*(?:@)[\s\S]*$"),
        ("^pkg:", r"^(?:pkg:)[\s\S]*$"),
        (r"\d+$", r"^[\s\S]*(?:\d+)$"),
        ("^a|b$", "^a|b$"),
        ("^(a|b)$", "^(a|b)$"),
        (r"[$^]", r"^[\s\S]*(?:[$^])[\s\S]*$"),
    ],
)
def test_search_pattern_anchors_json_schema_patterns(pattern: str, anchored: str) -> None:
    assert search_pattern(pattern) == anchored


# --- regex DFA ------------------------------------------------------------------------------
def test_regex_fsm_forces_single_transition_chains() -> None:
    fsm = RegexFSM.build(r'\{"id": [0-9]+, "ok": (true|false)\}')
    assert fsm is not None
    cursor = RegexCursor(fsm)
    assert cursor.forced() == '{"id": '
    cursor.advance(b'{"id": 4')
    assert cursor.forced() == ""
    cursor.advance(b",")
    assert cursor.forced() == ' "ok": '
    cursor.advance(b' "ok": t')
    assert cursor.forced() == "rue}"
    cursor.rollback(2)
    assert cursor.forced() == ""  # back after "4": a digit or the comma may follow


def test_regex_cursor_waits_for_complete_characters() -> None:
    fsm = RegexFSM.build("(é|è)x")
    assert fsm is not None
    cursor = RegexCursor(fsm)
    cursor.advance("é".encode()[:1])
    assert cursor.forced() == ""
    cursor.advance("é".encode()[1:])
    assert cursor.forced() == "x"
    cursor.advance(b"y")
    assert cursor.state is None and cursor.forced() == ""


# --- retokenizer ------------------------------------------------------------------------------
VOCAB = [b"", b'"', b'"name"', b"name", b":", b":x", b"n", b"a", b"m", b"e", b"\xc3", b"\xa9", b"b"]


def greedy_encode(text: str) -> list[int]:
    """Longest-match tokenizer over VOCAB (the 'canonical' tokenization for these tests)."""
    data, ids = text.encode(), []
    while data:
        best = max(
            (i for i, t in enumerate(VOCAB) if t and data.startswith(t)),
            key=lambda i: len(VOCAB[i]),
        )
        ids.append(best)
        data = data[len(VOCAB[best]) :]
    return ids


def retok() -> Retokenizer:
    return Retokenizer(token_bytes=VOCAB, encode=greedy_encode)


def ids(*tokens: bytes) -> list[int]:
    return [VOCAB.index(t) for t in tokens]


def test_retokenizer_backs_off_the_seam_and_holds_back_mergeable_text() -> None:
    jump = retok().plan(tail=ids(b"b", b'"'), forced='name":', room=10)
    assert jump is not None
    assert jump.removed == 1  # the lone '"' becomes part of '"name"'
    assert [VOCAB[t] for t in jump.appended] == [b'"name"']  # ':' could still become ':x'


def test_retokenizer_keeps_characters_whole_and_respects_room() -> None:
    full = retok().plan(tail=ids(b"b"), forced="éb", room=10)
    assert full is not None and [VOCAB[t] for t in full.appended] == [b"\xc3", b"\xa9", b"b"]
    assert retok().plan(tail=ids(b"b"), forced="é", room=1) is None
    mid = retok().plan(tail=ids(b"\xa9"), forced="b", room=10)
    assert mid is not None and mid.removed == 0


# --- backend --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return load_tokenizer(resolve_model_path("plait-tiny"))


@contextmanager
def backend(tokenizer: PreTrainedTokenizerBase, **config: Any) -> Iterator[GrammarBackend]:
    hooks = make_grammar(EngineConfig(**config), tokenizer, 16384)
    assert isinstance(hooks, GrammarBackend)
    try:
        yield hooks
    finally:
        hooks.close()


@pytest.fixture(scope="module")
def shared(tokenizer: PreTrainedTokenizerBase) -> Iterator[GrammarBackend]:
    """A backend with the default config (compile workers started once for the module)."""
    with backend(tokenizer) as hooks:
        yield hooks


def request(rid: str, **params: object) -> Req:
    sp = SamplingParams.from_dict({"max_new_tokens": 64, **params})
    return Req(rid=rid, input_ids=[5, 6, 7], params=sp, eos_ids=EOS)


def wait_ready(hooks: GrammarBackend, reqs: Sequence[Req]) -> tuple[list[Req], list[Req]]:
    ready: list[Req] = []
    failed: list[Req] = []
    deadline = time.monotonic() + 120  # the first compile waits for the workers to start
    while len(ready) + len(failed) < len(reqs) and time.monotonic() < deadline:
        r, f = hooks.poll()
        ready, failed = ready + r, failed + f
        time.sleep(0.005)
    return ready, failed


def test_same_constraint_compiles_once(shared: GrammarBackend, grammar_backend: str) -> None:
    hooks = shared
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    reqs = [request(f"r{i}", json_schema=schema, grammar_backend=grammar_backend) for i in range(3)]
    for req in reqs:
        hooks.submit(req)
    ready, failed = wait_ready(hooks, reqs)
    assert failed == [] and len(ready) == 3
    assert len({id(r.grammar.compiled) for r in ready}) == 1
    assert ready[0].grammar.compiled.backend == grammar_backend
    again = request("r3", json_schema=json.dumps(schema, indent=2), grammar_backend=grammar_backend)
    hooks.submit(again)
    assert wait_ready(hooks, [again])[0][0].grammar.compiled is ready[0].grammar.compiled


def test_cache_is_bounded(tokenizer: PreTrainedTokenizerBase) -> None:
    with backend(tokenizer, grammar_cache_size=2, grammar_workers=1) as hooks:
        reqs = [request(f"r{i}", regex=f"a{{{i + 1}}}") for i in range(4)]
        for req in reqs:
            hooks.submit(req)
            wait_ready(hooks, [req])
        assert len(hooks.cache.entries) == 2


ERRORS = {
    "xgrammar": {
        "schema": 'invalid json_schema: Unsupported type "foo"',
        "regex": "invalid regex: Regex parsing error at position 4",
        "ebnf": "invalid ebnf: EBNF parser error at line 1, column 10: "
        'Rule "missing" is not defined',
    },
    "llguidance": {
        "schema": "invalid json_schema: Invalid type: foo",
        "regex": 'invalid regex: at 1(8): invalid regex "[a-" (in regex): regex parse error:',
        "ebnf": "invalid ebnf: Rule 'missing' not found",
    },
}


def test_errors_name_the_problem_and_stay_with_their_request(
    shared: GrammarBackend, grammar_backend: str
) -> None:
    hooks = shared
    on = {"grammar_backend": grammar_backend}
    bad = {
        "schema": request("a", json_schema='{"type": "foo"}', **on),
        "json": request("b", json_schema="{not json", **on),
        "regex": request("c", regex="[a-", **on),
        "ebnf": request("d", ebnf="root ::= missing", **on),
    }
    good = request("e", regex="[0-9]+", **on)
    for req in [*bad.values(), good]:
        hooks.submit(req)
    ready, failed = wait_ready(hooks, [*bad.values(), good])
    assert ready == [good] and set(failed) == set(bad.values())
    messages = {k: str(r.finished.message) for k, r in bad.items() if r.finished is not None}
    expected = ERRORS[grammar_backend]
    assert messages["schema"] == expected["schema"]
    assert messages["json"].startswith("json_schema is not valid JSON")
    assert messages["regex"].startswith(expected["regex"])
    assert messages["ebnf"] == expected["ebnf"]


def test_a_compile_past_its_deadline_is_killed_and_queued_jobs_time_out_too(
    tokenizer: PreTrainedTokenizerBase, grammar_backend: str
) -> None:
    config = {"grammar_timeout_s": 0.5, "grammar_workers": 1, "grammar_backend": grammar_backend}
    with backend(tokenizer, **config) as hooks:
        pool = hooks.cache.pool
        hooks.warm_up()
        assert wait_for(lambda: pool.ready() == 1, 120)
        (first,) = pool.pids()
        slow = request("s", regex="a{2000}")  # its DFA takes seconds to build
        queued = request("q", regex="[0-9]+")  # waits behind it on the one worker
        hooks.submit(slow)
        hooks.submit(queued)
        ready, failed = wait_ready(hooks, [slow, queued])
        assert ready == [] and set(failed) == {slow, queued}
        for req in (slow, queued):
            assert req.finished is not None
            assert "timed out after 0.5s" in str(req.finished.message)
        assert wait_for(lambda: pool.ready() == 1 and pool.pids() != [first], 120)
        assert not pid_alive(first)
        fine = request("f", regex="[a-c]+")
        hooks.submit(fine)
        assert wait_ready(hooks, [fine]) == ([fine], [])
        again = request("s2", regex="a{2000}")  # a key that failed lately fails at once
        hooks.submit(again)
        assert again in hooks.poll()[1]


def wait_for(check: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return bool(check())


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_masks_allow_exactly_the_grammar(
    tokenizer: PreTrainedTokenizerBase, shared: GrammarBackend, grammar_backend: str
) -> None:
    hooks = shared
    plain = request("p")
    digits = request("d", regex="[0-9]{3}", grammar_backend=grammar_backend)
    hooks.submit(digits)
    wait_ready(hooks, [digits])
    mask = hooks.begin_fill([plain, digits])()
    assert mask is not None and mask.shape == (2, 512) and mask.dtype == torch.int32
    allowed = xgr.testing.bitmask_to_bool_mask(mask[1:2], 16384)[0]
    texts = [str(tokenizer.decode([t])) for t in allowed.nonzero().flatten().tolist()]
    assert texts and all(t.isdigit() and len(t) <= 3 for t in texts)
    assert not allowed[0] and not allowed[2]  # EOS only once three digits are in


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def test_jump_forward_appends_canonical_tokens_and_keeps_the_matcher_in_step(
    tokenizer: PreTrainedTokenizerBase, shared: GrammarBackend, grammar_backend: str
) -> None:
    hooks = shared
    on = {"json_layout": "compact", "grammar_backend": grammar_backend}  # every gap forced
    req = request("j", json_schema=PERSON, **on)
    hooks.submit(req)
    wait_ready(hooks, [req])
    brace = tokenizer.encode("{", add_special_tokens=False)
    req.output_ids.extend(brace)
    hooks.accept(req, brace[0])
    rewrite = hooks.after_sample(req)
    assert rewrite is not None and not rewrite.closed and rewrite.kept <= len(brace)
    text = str(tokenizer.decode(req.output_ids))
    assert text.startswith('{"name') and '{"name":"'.startswith(text)
    assert req.output_ids == tokenizer.encode(text, add_special_tokens=False)
    # the tokens a later jump may retokenize are held back from streaming
    assert req.hold_from == len(req.output_ids) - (hooks.rewriter.retokenizer.window - 1)
    rest = tokenizer.encode('{"name":"x","age":1}'[len(text) :], add_special_tokens=False)
    assert all(req.grammar.accept(token) for token in rest)
    assert req.grammar.matcher.is_completed()


# --- choosing the backend ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("schema", "chosen"),
    [
        ({"type": "object", "properties": {"a": {"type": "integer"}}}, "xgrammar"),  # no warning
        ({"type": "number", "multipleOf": 0.5}, "llguidance"),  # xgrammar warns, llg enforces
        ({"type": "string", "pattern": "\\p{Letter}+"}, "llguidance"),  # xgrammar refuses it
        ({"type": "array", "uniqueItems": True}, "xgrammar"),  # both warn: xgrammar's warning
        ({"type": "string", "format": "hostname"}, "xgrammar"),  # both loose (llg: warned)
    ],
)
def test_auto_takes_the_backend_that_enforces_every_keyword(schema: Any, chosen: str) -> None:
    key = GrammarKey("json_schema", json.dumps(schema), DUMPS, strict_mode=True, backend="auto")
    built = build_grammar(key)
    assert built.backend == chosen
    assert bool(built.warnings) == ("uniqueItems" in schema or "format" in schema)


@pytest.mark.parametrize("step", [123456789, 999983, 0.123456789, 1000000])
def test_a_step_llguidances_lexer_cannot_hold_is_refused_there_and_auto_takes_xgrammar(
    step: float,
) -> None:
    """(123456789, also the integer form of 0.123456789, made llguidance allocate 3.3 GB and
    abort the engine process while filling the first mask; 1000000 is counted whole, since
    llguidance strips an integer's trailing zeros only after a decimal point.)"""
    text = json.dumps({"type": "integer", "multipleOf": step})
    key = GrammarKey("json_schema", text, DUMPS, strict_mode=True, backend="llguidance")
    with pytest.raises(GrammarError, match="multipleOf .* past what llguidance builds"):
        build_grammar(key)
    auto = GrammarKey("json_schema", text, DUMPS, strict_mode=True, backend="auto")
    assert build_grammar(auto).backend == "xgrammar"


def test_the_engine_and_request_options_are_checked() -> None:
    with pytest.raises(ValueError, match="grammar_backend"):
        EngineConfig(grammar_backend="outlines")
    params = SamplingParams.from_dict({"lark": 'start: "a"'})
    assert grammar_key(params, backend="auto").backend == "llguidance"
    assert grammar_key(SamplingParams.from_dict({"regex": "a"}), backend="auto").backend == (
        "xgrammar"
    )
    with pytest.raises(GrammarError, match="xgrammar does not take Lark grammars"):
        grammar_key(params, backend="xgrammar")


# --- llguidance behind xgrammar's matcher calls -------------------------------------------------
def bit(mask: torch.Tensor, token: int) -> bool:
    return bool((int(mask[0, token >> 5]) >> (token & 31)) & 1)


def test_llguidance_matcher_keeps_the_matcher_contract(tokenizer: PreTrainedTokenizerBase) -> None:
    """A rejected token changes nothing (llguidance alone would enter an error state); the
    request's stop tokens, not llguidance's EOS, end the output and only where the grammar
    may end; rollback crosses the stop; forks are independent."""
    vocab = Vocab(tokenizer=tokenizer, vocab_size=16384)
    compiler = vocab.llg_compiler
    key = GrammarKey("regex", "[0-9]{2}", backend="llguidance")
    matcher = compiler.matcher(compiler.compile(build_llguidance(key).data), stops=[2])
    (llg_eos,) = compiler.eos
    assert llg_eos != 2
    digit, letter = (tokenizer.encode(t, add_special_tokens=False)[0] for t in ("1", "a"))
    mask = torch.zeros((1, 512), dtype=torch.int32)
    assert not matcher.accept_token(letter) and matcher.accept_token(digit)
    matcher.fill_next_token_bitmask(mask, 0)
    assert bit(mask, digit) and not bit(mask, 2) and not matcher.accept_token(2)
    assert matcher.accept_token(digit) and matcher.is_completed()
    matcher.fill_next_token_bitmask(mask, 0)
    assert bit(mask, 2) and not bit(mask, llg_eos) and not bit(mask, digit)
    assert matcher.accept_token(2) and matcher.is_terminated()
    fork = matcher.fork()
    matcher.rollback(2)
    assert not matcher.is_terminated() and fork.is_terminated()
    assert matcher.accept_token(digit) and not matcher.accept_token(digit)

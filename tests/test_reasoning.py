"""Reasoning models: the split of an output into reasoning and content, the prompt rule
(open, closed, absent block) on the real Qwen3 and DeepSeek-R1 templates, and the grammar
that waits out the reasoning section (the gate alone, the grammar backend with real tokens,
the engine)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from test_chat_templates import load
from test_grammar_units import backend, request, tokenizer, wait_ready  # noqa: F401
from transformers import PreTrainedTokenizerBase

from helpers import tiny_engine
from plait.backend.engine.engine import Engine
from plait.backend.grammar.reasoning_gate import GateEdit, ReasoningGate
from plait.backend.grammar.vocab import make_encoder
from plait.backend.text.reasoning import (
    REASONING_FORMATS,
    ReasoningSplitter,
    Split,
    request_format,
    split_output,
    starts_in_reasoning,
)

THINK = REASONING_FORMATS["qwen3"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
A = 67  # plait-tiny's "a"
GT_BRACE = 15910  # plait-tiny's ">{"
MARKER = [2836, 395, 1040]  # "</", "th", "ink" (then ">" or ">{")


# --- the split --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "inside", "expected"),
    [
        ('<think>\nplan\n</think>\n\n{"a":1}', True, Split("\nplan\n", '{"a":1}')),
        ('plan</think>{"a":1}', True, Split("plan", '{"a":1}')),  # DeepSeek-R1: opened
        ('<think>{"a":1}</think>{"b":2}', True, Split('{"a":1}', '{"b":2}')),  # JSON inside
        ("  <think>x</think>  y </think>", True, Split("x", "y </think>")),
        ("still thinking <", True, Split("still thinking <", "")),
        ("<think>x</think>y", False, Split("", "<think>x</think>y")),  # thinking off
        ("\n\n", True, Split("\n\n", "")),
        ("", True, Split("", "")),
    ],
)
def test_an_output_splits_into_reasoning_and_content(
    text: str, inside: bool, expected: Split
) -> None:
    assert ReasoningSplitter(THINK, in_reasoning=inside).split(text) == expected


@pytest.mark.parametrize("seed", range(20))
def test_streamed_pieces_concatenate_to_the_whole_split(seed: int) -> None:
    rng = random.Random(seed)
    text = rng.choice(["", "  ", "\n<think>"]) + "".join(
        rng.choice(["ab", "<", "</", "think", ">", "</think>", " ", "\n", "{}"]) for _ in range(30)
    )
    whole = ReasoningSplitter(THINK, in_reasoning=True).split(text)
    splitter = ReasoningSplitter(THINK, in_reasoning=True)
    cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, 6)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    parts = [splitter.feed(p) for p in pieces] + [splitter.finish()]
    assert "".join(p.reasoning for p in parts) == whole.reasoning
    assert "".join(p.content for p in parts) == whole.content


def test_the_request_picks_its_format() -> None:
    assert request_format(None, reasoning=None) is None
    assert request_format("deepseek-r1", reasoning=False) is None
    assert request_format("deepseek-r1", reasoning=None) == REASONING_FORMATS["deepseek-r1"]
    assert request_format(None, reasoning=True) == REASONING_FORMATS["think"]
    kimi = REASONING_FORMATS["kimi"]
    assert split_output(kimi, "\u25c1think\u25b7a\u25c1/think\u25b7b") == Split("a", "b")


# --- the prompt rule on the real templates ----------------------------------------------
def render(name: str, **kwargs: Any) -> str:
    hf, _ = load(name)
    messages = [{"role": "user", "content": "Hi"}]
    return str(
        hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    )


def test_the_prompt_says_where_the_output_starts() -> None:
    qwen3 = REASONING_FORMATS["qwen3"]
    thinking, off = render("qwen3"), render("qwen3", enable_thinking=False)
    assert thinking.endswith("<|im_start|>assistant\n")  # the model opens <think> itself
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert starts_in_reasoning(qwen3, thinking) and not starts_in_reasoning(qwen3, off)
    deepseek = render("deepseek-r1-distill-qwen")
    assert deepseek.endswith("<\uff5cAssistant\uff5c><think>\n")  # the output starts inside
    assert starts_in_reasoning(REASONING_FORMATS["deepseek-r1"], deepseek)
    assert split_output(qwen3, 'a</think>\n{"x":1}', prompt=deepseek) == Split("a", '{"x":1}')
    assert split_output(qwen3, '{"x":1}', prompt=off) == Split("", '{"x":1}')


# --- the gate alone ---------------------------------------------------------------------
VOCAB = [b"a", b"</th", b"ink>", b"ink>{", b"</think>", b"{"]


def test_the_gate_closes_on_the_marker_and_cuts_what_follows_it() -> None:
    gate = ReasoningGate(fmt=THINK, token_bytes=VOCAB, limit=None)
    for token in (0, 1):
        gate.feed(token)
        assert gate.open
    gate.feed(3)  # "ink>{": the marker ends inside the token
    assert not gate.open
    encoded: list[str] = []

    def encode(text: str) -> list[int]:
        encoded.append(text)
        return [2]

    assert gate.edit([0, 1, 3], encode=encode, room=0) == GateEdit(2, [2])
    assert encoded == ["ink>"]
    assert gate.edit([0, 1, 2], encode=encode, room=0) is None


def test_the_gate_writes_the_marker_at_its_limit() -> None:
    gate = ReasoningGate(fmt=THINK, token_bytes=VOCAB, limit=2)
    gate.feed(0)
    assert gate.edit([0], encode=lambda t: [9], room=5) is None
    gate.feed(0)
    marker = [1, 2]  # "</th", "ink>"
    assert gate.edit([0, 0], encode=lambda t: marker, room=2) == GateEdit(2, marker)
    assert not gate.open


def test_the_gate_writes_no_marker_past_the_token_limit() -> None:
    gate = ReasoningGate(fmt=THINK, token_bytes=VOCAB, limit=1)
    gate.feed(0)
    assert gate.edit([0], encode=lambda t: [1, 2], room=1) is None
    assert gate.open
    gate.feed(0)
    assert gate.edit([0, 0], encode=lambda t: [1, 2], room=5) is None  # decided once


# --- the grammar backend with plait-tiny's tokens ---------------------------------------
def feed(hooks: Any, req: Any, tokens: list[int]) -> list[Any]:
    """Sample `tokens` in turn as the scheduler does: append, accept, after_sample."""
    rewrites = []
    for token in tokens:
        req.output_ids.append(token)
        hooks.accept(req, token)
        rewrites.append(hooks.after_sample(req))
    return rewrites


def test_the_grammar_waits_for_the_end_of_the_reasoning(
    tokenizer: PreTrainedTokenizerBase,  # noqa: F811
    grammar_backend: str,
) -> None:
    with backend(
        tokenizer, reasoning_parser="qwen3", grammar_workers=1, grammar_backend=grammar_backend
    ) as hooks:
        req = request("r", json_schema=SCHEMA)
        hooks.submit(req)
        assert wait_ready(hooks, [req])[0] == [req]
        assert hooks.begin_fill([req])() is None  # inside the reasoning: no mask
        assert feed(hooks, req, [A, A, *MARKER]) == [None] * 5  # "a" is not JSON: not checked
        assert req.grammar.waiting and req.finished is None
        rewrite = feed(hooks, req, [GT_BRACE])[0]  # ">{" closes it: cut after ">"
        assert rewrite is not None and rewrite.kept == 5
        assert req.output_ids == [A, A, *MARKER, 32]
        assert not req.grammar.waiting and req.grammar.start == 6
        mask = hooks.begin_fill([req])()
        assert mask is not None and not (int(mask[0, A // 32]) >> (A % 32)) & 1  # no "a" now
        feed(hooks, req, [93])  # "{" is accepted by the grammar
        assert req.finished is None
        hooks.accept(req, A)  # "a" after "{" is not JSON
        assert req.finished is not None and req.finished.kind == "error"


def test_drafts_are_refused_inside_the_reasoning_and_walked_after_it(
    tokenizer: PreTrainedTokenizerBase,  # noqa: F811
    grammar_backend: str,
) -> None:
    """A draft the JSON grammar would accept gets no masks while the reasoning is open (they
    would force JSON onto free reasoning tokens), and is walked once the reasoning closed."""
    draft = tokenizer.encode('{"name', add_special_tokens=False)
    with backend(
        tokenizer, reasoning_parser="qwen3", grammar_workers=1, grammar_backend=grammar_backend
    ) as hooks:
        req = request("r", json_schema=SCHEMA)
        hooks.submit(req)
        assert wait_ready(hooks, [req])[0] == [req]
        feed(hooks, req, [A, A])
        n, mask = hooks.draft_masks(req, draft)
        assert n == 0 and mask.shape[0] == 1 and bool((mask == -1).all())  # nothing masked
        feed(hooks, req, [*MARKER, 32])  # "</think>": the grammar starts now
        n, mask = hooks.draft_masks(req, draft)
        assert n == len(draft) and mask.shape[0] == n + 1
        assert not (int(mask[0, A // 32]) >> (A % 32)) & 1  # row 0 is JSON's first mask
        feed(hooks, req, [93])  # "{" is still the grammar's next token: the walk was undone
        assert not req.grammar.waiting and req.finished is None


def test_a_closed_reasoning_in_the_prompt_applies_the_grammar_at_once(
    tokenizer: PreTrainedTokenizerBase,  # noqa: F811
    grammar_backend: str,
) -> None:
    closed = tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
    with backend(
        tokenizer, reasoning_parser="qwen3", grammar_workers=1, grammar_backend=grammar_backend
    ) as hooks:
        req = request("r", json_schema=SCHEMA)
        req.origin_input_ids = closed
        off = request("off", json_schema=SCHEMA, reasoning=False)
        for r in (req, off):
            hooks.submit(r)
        assert sorted(r.rid for r in wait_ready(hooks, [req, off])[0]) == ["off", "r"]
        assert req.grammar.gate is None and off.grammar.gate is None
        assert hooks.begin_fill([req, off])() is not None


def test_make_encoder_round_trips_the_marker(
    tokenizer: PreTrainedTokenizerBase,  # noqa: F811
) -> None:
    assert make_encoder(tokenizer)(">") == [32]


# --- the engine -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with tiny_engine(reasoning_parser="deepseek-r1") as eng:
        yield eng


def params(**extra: Any) -> dict[str, Any]:
    """JSON under a strong bias toward "a", which JSON cannot start with."""
    return {"json_schema": json.dumps(SCHEMA), "max_new_tokens": 48, "temperature": 0,
            "logit_bias": {str(A): 100.0}, "max_reasoning_tokens": 5, **extra}  # fmt: skip


def answer(text: str) -> Any:
    value = json.loads(text)
    jsonschema.validate(value, SCHEMA)
    return value


def test_the_reasoning_is_free_and_the_answer_is_valid_json(
    engine: Engine, grammar_backend: str
) -> None:
    for prompt in ("Q: <think>\n", "Q:"):  # opened by the template, or not at all
        out = engine.generate(prompt, params(grammar_backend=grammar_backend))
        reasoning, sep, rest = out["text"].partition("</think>")
        assert (reasoning, sep) == ("aaaaa", "</think>")
        answer(rest)
        assert out["finish_reason"]["type"] in ("stop", "length")


def test_thinking_switched_off_applies_the_grammar_from_the_first_token(
    engine: Engine, grammar_backend: str
) -> None:
    on = {"grammar_backend": grammar_backend}
    out = engine.generate("Q: <think>\n\n</think>\n\n", params(**on))
    assert out["text"].startswith('{"name": "')
    answer(out["text"])
    off = engine.generate("Q: <think>\n", params(reasoning=False, **on))
    assert off["text"].startswith('{"name": "')
    answer(off["text"])


def test_without_a_parser_the_grammar_applies_from_the_first_token() -> None:
    with tiny_engine() as plain:
        out = plain.generate("Q: <think>\n", params())
        assert out["text"].startswith('{"name": "')
        asked = plain.generate("Q: <think>\n", params(reasoning=True))
        assert asked["text"].startswith("aaaaa</think>")
        answer(asked["text"].partition("</think>")[2])


def test_the_marker_is_not_written_past_max_new_tokens(
    engine: Engine, grammar_backend: str
) -> None:
    limit = params(max_new_tokens=7, grammar_backend=grammar_backend)  # 5 + a 4-token marker
    out = engine.generate("Q: <think>\n", limit)
    assert out["text"] == "a" * 7
    assert len(out["output_ids"]) == 7 and out["finish_reason"]["type"] == "length"


@pytest.fixture(scope="module")
def drafting() -> Iterator[Engine]:
    with tiny_engine(reasoning_parser="deepseek-r1", speculative_draft_tokens=4) as eng:
        yield eng


def test_speculative_drafts_change_nothing_inside_or_after_the_reasoning(
    engine: Engine, drafting: Engine, grammar_backend: str
) -> None:
    """Drafting is off inside the reasoning (the grammar's masks must not reach it) and on
    after it; greedy outputs equal those of an engine that never drafts."""
    free = {"json_schema": json.dumps(SCHEMA), "max_new_tokens": 40, "temperature": 0,
            "max_reasoning_tokens": 12, "grammar_backend": grammar_backend}  # fmt: skip
    prompts = ["Q: <think>\n" + "b a b a b a " * 4, "Q: <think>\n\n</think>\n\n", "Q:"]
    for prompt in prompts:
        want, got = engine.generate(prompt, free), drafting.generate(prompt, free)
        assert got["output_ids"] == want["output_ids"], prompt
        answer(got["text"].rpartition("</think>")[2] if "</think>" in got["text"] else got["text"])

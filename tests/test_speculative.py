"""N-gram speculative decoding in the scheduler: outputs token for token those of decoding
without it (plain, constrained, stops, limits, mixed batches), the cache consistent, the
acceptance counters. plait-tiny in float32 (layer-by-layer) and int4 (the fused C step)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from helpers import greedy, tiny_engine
from plait.backend.engine.engine import Engine
from plait.backend.server.metrics import parse_metrics

COPY = "The quick brown fox jumps over the lazy dog near the river bank. " * 5
PROMPTS = [COPY + "Again: The quick brown", "one two three four five six one two three", "Hello"]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
JSON_PROMPT = 'Person: {"name": "Maria Lopez", "age": 34}\n' * 3 + "Person: "


@pytest.fixture(scope="module", params=["float32", "int4"])
def engines(request: pytest.FixtureRequest) -> Iterator[dict[str, Engine]]:
    """The same model without speculation and with drafts (4 tokens; 7 on the fused path)."""
    quant = {"quantization": request.param} if request.param == "int4" else {}
    drafts = 7 if quant else 4
    built = {k: tiny_engine(speculative_draft_tokens=k, **quant) for k in (0, drafts)}
    if quant:
        assert built[drafts].runtime.runner.fused_decode == "on"  # type: ignore[union-attr]
    yield built
    for engine in built.values():
        engine.shutdown()


def run_all(engines: dict[str, Engine], prompts: Any, params: Any) -> list[Any]:
    """Results of every engine for the same requests; speculating ones must equal the first."""
    results = [eng.generate(prompts, params) for eng in engines.values()]
    base = results[0]
    for other in results[1:]:
        for a, b in zip(base, other, strict=True):
            assert b["output_ids"] == a["output_ids"]
            assert b["text"] == a["text"]
            assert b["finish_reason"] == a["finish_reason"]
    return results


def drafted(results: list[Any]) -> tuple[int, int]:
    usages = [r["usage"] for r in results]
    made = sum(u.get("spec_draft_tokens", 0) for u in usages)  # only requests that drafted
    return made, sum(u.get("spec_accepted_tokens", 0) for u in usages)


def test_greedy_outputs_are_identical_and_drafts_are_accepted(engines: dict[str, Engine]) -> None:
    results = run_all(engines, PROMPTS, greedy(48))
    assert "spec_draft_tokens" not in results[0][0]["usage"]
    made, kept = drafted(results[1])
    assert made > 0 and kept <= made
    speculating = list(engines.values())[1]
    stats = speculating.stats()
    assert stats.extra["spec_draft_tokens"] >= made
    assert stats.kv_used_tokens == 0  # every draft slot went back
    if speculating.config.quantization != "int4":  # the float model copies this prompt
        assert kept > 0 and 0 < stats.extra["spec_acceptance_rate"] <= 1


def test_the_token_limit_inside_a_draft(engines: dict[str, Engine]) -> None:
    limits = range(1, 13)
    results = run_all(engines, PROMPTS[:1] * len(limits), [greedy(n) for n in limits])
    longest = len(results[0][-1]["output_ids"])  # shorter if the model ends by itself
    assert [len(r["output_ids"]) for r in results[0]] == [min(n, longest) for n in limits]


def test_stop_strings_and_stop_ids_inside_drafts(engines: dict[str, Engine]) -> None:
    """Each distinct token of the output as a stop id (as an EOS would end it), and stop
    strings cut at a few places, all in one batch."""
    (base,) = engines[0].generate(PROMPTS[:1], greedy(40))
    ids = base["output_ids"]
    params = [greedy(40, stop_token_ids=[t]) for t in dict.fromkeys(ids[4:])]
    for cut in (5, 9, 14):
        text = engines[0].tokenizer.decode(ids[cut : cut + 2])
        if text.strip():
            params += [greedy(40, stop=[text]), greedy(40, stop=[text], no_stop_trim=True)]
    results = run_all(engines, PROMPTS[:1] * len(params), params)
    assert any(r["finish_reason"]["type"] == "stop" for r in results[0])


@pytest.mark.parametrize("jump_forward", [True, False])
def test_json_schema_outputs_are_identical(
    engines: dict[str, Engine], jump_forward: bool, grammar_backend: str
) -> None:
    if engines[0].config.quantization == "int4":
        pytest.skip("the real-model test covers constrained drafts on the fused path")
    params = greedy(
        40, json_schema=SCHEMA, jump_forward=jump_forward, grammar_backend=grammar_backend
    )
    run_all(engines, [JSON_PROMPT, COPY + JSON_PROMPT], params)
    for limit in (3, 7, 11):  # closed at the limit, inside drafts
        run_all(engines, [JSON_PROMPT], {**params, "max_new_tokens": limit})


def test_a_mixed_batch(engines: dict[str, Engine]) -> None:
    """Speculating requests beside sampling, penalized, logprob and constrained ones (one
    constrained request per grammar backend)."""
    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[0], JSON_PROMPT, PROMPTS[1]]
    prompts.append(JSON_PROMPT)
    params = [
        greedy(30),
        {"max_new_tokens": 30, "temperature": 0.8, "seed": 7},
        greedy(30, frequency_penalty=0.5),
        greedy(30, return_logprob=True, top_logprobs_num=2),
        greedy(30, json_schema=SCHEMA, grammar_backend="xgrammar"),
        greedy(30, min_new_tokens=20, stop=["two"]),
        greedy(30, json_schema=SCHEMA, grammar_backend="llguidance"),
    ]
    results = run_all(engines, prompts, params)
    assert results[1][0]["usage"]["spec_draft_tokens"] > 0
    for i in (1, 2, 3):  # sampling, penalties, logprobs: never draft
        assert "spec_draft_tokens" not in results[1][i]["usage"]
    logprobs = [[lp for lp, _ in r[3]["logprobs"]["output"]] for r in results]
    assert logprobs[1] == pytest.approx(logprobs[0], abs=1e-4)  # the batches differ


def test_streams_carry_the_same_text(engines: dict[str, Engine]) -> None:
    texts = []
    for engine in engines.values():
        chunks = list(engine.generate(PROMPTS[0], greedy(40, stop=["river"]), stream=True))
        texts.append("".join(c["text"] for c in chunks))
    assert texts[0] == texts[1] and texts[0]


def test_metrics_count_drafts() -> None:
    from plait.backend.server.metrics import ServerMetrics  # noqa: PLC0415

    with tiny_engine(speculative_draft_tokens=4) as engine:
        engine.generate(PROMPTS[0], greedy(32))
        page = parse_metrics(ServerMetrics().render(engine.stats()))
    assert page["plait_spec_accepted_tokens_total"] > 0
    assert page["plait_spec_draft_tokens_total"] >= page["plait_spec_accepted_tokens_total"]


def test_the_option_is_checked() -> None:
    with pytest.raises(ValueError, match="speculative_draft_tokens"):
        tiny_engine(speculative_draft_tokens=-1)

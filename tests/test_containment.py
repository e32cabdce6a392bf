"""A failure while handling one request fails that request alone (faults injected into an
in-process engine's scheduler); the other requests of the batch finish exactly as they do
alone, the KV bookkeeping stays consistent (integrity checks after every step), and the
engine serves on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from helpers import greedy, tiny_engine
from plait.backend.engine.engine import Engine, GenerationError
from plait.backend.grammar import OnDemandGrammar
from plait.backend.model.forward_batch import ForwardBatch
from plait.backend.request.req import Req
from plait.backend.request.sampling_params import SamplingParams
from plait.backend.scheduler.scheduler import Scheduler

POISON = 4321  # a prompt token the injected forward fault trips on
VICTIMS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with tiny_engine() as eng:
        yield eng


def scheduler(engine: Engine) -> Scheduler:
    return engine.runtime.scheduler  # type: ignore[union-attr]


def params(**fields: Any) -> SamplingParams:
    return SamplingParams.from_dict(greedy(10, ignore_eos=True, **fields))


def together(engine: Engine, requests: list[tuple[list[int], SamplingParams]]) -> list[Any]:
    """Each request's final result, all submitted at once (errors as results)."""

    async def run() -> dict[int, Any]:
        return {i: item async for i, item in engine.stream_batch(requests, stream=False)}

    results = asyncio.run(run())
    return [results[i] for i in range(len(requests))]


def alone(engine: Engine, ids: list[int], sp: SamplingParams) -> list[int]:
    return list(engine.generate(input_ids=ids, sampling_params=sp)["output_ids"])


def assert_victims_whole(engine: Engine, results: list[Any], sp: SamplingParams) -> None:
    for ids, result in zip(VICTIMS, results, strict=True):
        assert result["finish_reason"]["type"] == "length", result
        assert result["output_ids"] == alone(engine, ids, sp)


def error_of(result: dict[str, Any]) -> str:
    reason = result["finish_reason"]
    assert reason["type"] == "error", reason
    return str(reason["message"])


def test_unrepresentable_sampling_fields_fail_only_their_request(engine: Engine) -> None:
    sp = params()
    # values the edge refuses, forced past it (model_copy does not validate)
    huge_k = params(temperature=0.8).model_copy(update={"top_k": 2**70})
    huge_seed = params(temperature=0.8).model_copy(update={"seed": 2**64})
    hostile = [([5, 6, 7, 8], huge_k), ([9, 10], huge_seed)]
    results = together(engine, [(ids, sp) for ids in VICTIMS] + hostile)
    assert_victims_whole(engine, results[:3], sp)
    assert "sampling failed" in error_of(results[3]) and error_of(results[3]).startswith(
        "internal error"
    )
    assert "could not be queued" in error_of(results[4])
    assert not engine.tokenizer_manager.in_flight()
    assert alone(engine, [5, 6, 7, 8], sp)  # still serving


def test_a_forward_failing_on_one_request_fails_only_that_request(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = scheduler(engine).runner
    real = runner.forward
    calls: list[int] = []

    def forward(batch: ForwardBatch) -> torch.Tensor:
        calls.append(batch.num_tokens)
        if POISON in batch.input_ids.tolist():
            raise RuntimeError("injected forward fault")
        return real(batch)

    sp = params()
    expected = [alone(engine, ids, sp) for ids in VICTIMS]
    monkeypatch.setattr(runner, "forward", forward)
    results = together(engine, [(ids, sp) for ids in VICTIMS] + [([POISON, 5, 6], sp)])
    assert [r["output_ids"] for r in results[:3]] == expected
    assert "forward pass failed" in error_of(results[3])
    assert len(calls) > 10  # the failing batch was retried in smaller groups
    monkeypatch.setattr(runner, "forward", real)
    assert engine.stats().kv_used_tokens == 0


def test_grammar_and_output_faults_fail_only_their_request(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    sched = scheduler(engine)
    assert sched.grammar is not None
    sp, regex = params(), params(regex="[a-z]{4,40}")
    expected = alone(engine, VICTIMS[0], regex)
    real_after, real_emit = sched.grammar.after_sample, sched.outputs.emit

    def after_sample(req: Req) -> Any:
        if req.origin_input_ids == [20, 21]:
            raise RuntimeError("injected grammar fault")
        return real_after(req)

    def emit(req: Req) -> Any:
        if req.origin_input_ids == [22, 23]:
            raise RuntimeError("injected output fault")
        return real_emit(req)

    monkeypatch.setattr(sched.grammar, "after_sample", after_sample)
    monkeypatch.setattr(sched.outputs, "emit", emit)
    results = together(
        engine, [(VICTIMS[0], regex), ([20, 21], regex), ([22, 23], sp), (VICTIMS[1], sp)]
    )
    assert results[0]["output_ids"] == expected
    assert "processing the sampled token failed" in error_of(results[1])
    assert "injected output fault" in error_of(results[2])
    assert results[3]["output_ids"] == alone(engine, VICTIMS[1], sp)


def test_a_failing_batch_mask_fill_is_redone_row_by_row(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    hooks = scheduler(engine).grammar
    assert isinstance(hooks, OnDemandGrammar)
    grammar = hooks.backend()
    sp = [params(regex="[a-z]{4,40}"), params(regex="[0-9]{3,30}")]
    expected = [alone(engine, ids, p) for ids, p in zip(VICTIMS, sp, strict=False)]
    filler = grammar.filler  # type: ignore[attr-defined]

    class Broken:
        def batch_fill_next_token_bitmask(self, *args: Any) -> None:
            raise RuntimeError("injected batch fill fault")

    monkeypatch.setattr(filler, "batch", Broken())
    results = together(engine, list(zip(VICTIMS, sp, strict=False)))
    assert [r["output_ids"] for r in results] == expected


def test_a_failure_no_request_can_be_blamed_for_fails_those_in_flight_and_serving_goes_on(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    sched = scheduler(engine)
    real = sched._schedule
    fired: list[bool] = []

    def schedule() -> list[Req]:
        # fire once every victim has arrived (they can reach the loop over several steps)
        arrived = len(sched.waiting) + len(sched.running) + len(sched.compiling)
        if not fired and arrived == len(VICTIMS):
            fired.append(True)
            raise RuntimeError("injected scheduler fault")
        return real()

    monkeypatch.setattr(sched, "_schedule", schedule)
    results = together(engine, [(ids, params()) for ids in VICTIMS])
    assert fired and all("injected scheduler fault" in error_of(r) for r in results)
    assert alone(engine, VICTIMS[0], params())
    assert not engine.tokenizer_manager.in_flight()


def test_an_abort_of_an_unknown_rid_is_answered(engine: Engine) -> None:
    (out,) = scheduler(engine).abort("never-seen")
    assert out.rid == "never-seen" and out.finish is not None and out.finish.kind == "abort"


def test_failing_abort_and_control_messages_are_answered(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    sched = scheduler(engine)

    def broken(*args: Any) -> Any:
        raise RuntimeError("injected message fault")

    monkeypatch.setattr(sched, "stats", broken)
    with pytest.raises(RuntimeError, match="injected message fault"):
        engine.stats()
    monkeypatch.setattr(sched, "abort", broken)
    stream = engine.generate(input_ids=[5, 6], sampling_params=greedy(200), stream=True)
    next(stream)
    with pytest.raises(GenerationError, match="injected message fault"):
        engine.tokenizer_manager.abort(engine.tokenizer_manager.in_flight()[0])
        list(stream)
    assert not engine.tokenizer_manager.in_flight()

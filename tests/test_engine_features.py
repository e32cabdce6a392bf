"""Engine behaviour: memory pressure, errors, streaming, stops, n>1, seeds, logprobs."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import greedy, tiny_engine
from plait.backend.engine.engine import Engine, GenerationError
from plait.backend.request import stop_conditions


@pytest.fixture(scope="module")
def engine() -> Engine:
    with tiny_engine() as eng:
        yield eng


def test_retraction_under_kv_pressure_loses_nothing() -> None:
    prompts = [[5 + i] * 30 + list(range(100, 120)) for i in range(8)]
    params = greedy(60, ignore_eos=True)
    with tiny_engine() as roomy:
        expected = [
            o["output_ids"] for o in roomy.generate(input_ids=prompts, sampling_params=params)
        ]
    with tiny_engine(kv_tokens=260, new_token_ratio=0.0, min_new_token_ratio=0.0) as tight:
        got = [o["output_ids"] for o in tight.generate(input_ids=prompts, sampling_params=params)]
        assert tight.stats().extra["retracted"] > 0
    assert got == expected
    assert all(len(ids) == 60 for ids in got)


def test_too_long_requests_get_clear_errors(engine: Engine) -> None:
    with pytest.raises(GenerationError, match="context length"):
        engine.generate(input_ids=[7] * 4000, sampling_params=greedy(200))
    with tiny_engine(kv_tokens=100) as small, pytest.raises(GenerationError, match="KV pool"):
        small.generate(input_ids=[7] * 90, sampling_params=greedy(20))
    with pytest.raises(GenerationError, match="empty"):
        engine.generate(input_ids=[], sampling_params=greedy(2))
    with pytest.raises(GenerationError, match="vocabulary"):
        engine.generate(input_ids=[10**6], sampling_params=greedy(2))
    with pytest.raises(GenerationError, match="temperature"):
        engine.generate("hi", {"temperature": -1})
    with pytest.raises(GenerationError, match="unknown field"):
        engine.generate("hi", {"max_tokens": 3})
    # the engine still serves
    assert engine.generate("hi", greedy(3))["usage"]["completion_tokens"] == 3


def test_stream_increments_concatenate_to_the_full_text(engine: Engine) -> None:
    full = engine.generate("Streaming test", greedy(20, ignore_eos=True))
    parts = list(engine.generate("Streaming test", greedy(20, ignore_eos=True), stream=True))
    assert "".join(p["text"] for p in parts) == full["text"]
    assert sum((p["output_ids"] for p in parts), []) == full["output_ids"]
    assert parts[-1]["finish_reason"] == {"type": "length"}
    assert all(p["finish_reason"] is None for p in parts[:-1])


def test_async_generate_and_stream(engine: Engine) -> None:
    async def main() -> tuple[list[dict], list[dict]]:
        outs = await asyncio.gather(
            *(engine.async_generate(f"q{i}", greedy(5, ignore_eos=True)) for i in range(6))
        )
        stream = await engine.async_generate("q0", greedy(5, ignore_eos=True), stream=True)
        return list(outs), [d async for d in stream]

    outs, parts = asyncio.run(main())
    assert [len(o["output_ids"]) for o in outs] == [5] * 6
    assert sum((p["output_ids"] for p in parts), []) == outs[0]["output_ids"]


def test_stop_strings_token_ids_and_min_tokens(engine: Engine) -> None:
    base = engine.generate("Stops", greedy(30, ignore_eos=True))
    text, ids = base["text"], base["output_ids"]
    stop = text[5:8]
    cut = engine.generate("Stops", greedy(30, ignore_eos=True, stop=[stop]))
    assert cut["text"] == text[: text.find(stop)]
    assert cut["finish_reason"] == {"type": "stop", "matched": stop}
    tok = ids[4]
    first = ids.index(tok)
    stopped = engine.generate("Stops", greedy(30, stop_token_ids=[tok]))
    assert stopped["output_ids"] == ids[: first + 1]
    assert stopped["finish_reason"] == {"type": "stop", "matched": tok}
    late = engine.generate("Stops", greedy(30, stop_token_ids=[tok], min_new_tokens=first + 2))
    assert tok not in late["output_ids"][: first + 2]


def test_stop_regex_and_no_stop_trim(engine: Engine) -> None:
    text = engine.generate("Stops", greedy(30, ignore_eos=True))["text"]
    pattern = re.escape(text[6]) + "." + re.escape(text[8])  # matches at 6 (or earlier)
    m = re.search(pattern, text)
    assert m is not None
    cut = engine.generate("Stops", greedy(30, ignore_eos=True, stop_regex=pattern))
    assert cut["text"] == text[: m.start()]
    assert cut["finish_reason"] == {"type": "stop", "matched": pattern}
    kept = engine.generate(
        "Stops", greedy(30, ignore_eos=True, stop_regex=[pattern], no_stop_trim=True)
    )
    # no_stop_trim: the text of every token generated, up to the one that completed the match.
    assert kept["output_ids"] == cut["output_ids"]
    assert kept["text"].startswith(text[: m.end()]) and text.startswith(kept["text"])
    parts = engine.generate("Stops", greedy(30, ignore_eos=True, stop_regex=pattern), stream=True)
    assert "".join(p["text"] for p in parts) == cut["text"]
    # An anchor means the start of the output, not of the window the scheduler checks.
    anchored = "^" + re.escape(text[10:12])
    if not re.search(anchored, text):
        whole = engine.generate("Stops", greedy(30, ignore_eos=True, stop_regex=anchored))
        assert whole["text"] == text and whole["finish_reason"] == {"type": "length"}
    for bad, message in [("(unclosed", "not a valid"), ("x?", "can match the empty string")]:
        with pytest.raises(GenerationError, match=r"stop_regex\[0\] .*" + message):
            engine.generate("Stops", greedy(3, stop_regex=bad))


@pytest.mark.parametrize("jump", [True, False])
def test_a_stop_inside_forced_text_still_stops(engine: Engine, jump: bool) -> None:
    # The regex forces the whole text: with jump-forward it arrives in one step.
    for stops in ({"stop": ["STOP"]}, {"stop_regex": ["S.OP"]}):
        params = {"max_new_tokens": 40, "regex": "abcSTOPdefghijklmnop", "jump_forward": jump}
        out = engine.generate("x", {**params, **stops, "seed": 1})
        matched = next(iter(stops.values()))[0]
        assert out["text"] == "abc" and out["finish_reason"] == {"type": "stop", "matched": matched}


def test_a_stop_regex_that_runs_out_of_time_fails_only_its_request(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stop_conditions, "SEARCH_TIMEOUT_S", 1e-9)

    async def both() -> list[Any]:
        slow = engine.async_generate("Stops", greedy(8, ignore_eos=True, stop_regex=r"\d+x"))
        plain = engine.async_generate("Stops", greedy(8, ignore_eos=True))
        return await asyncio.gather(slow, plain, return_exceptions=True)

    slow, plain = asyncio.run(both())
    assert isinstance(slow, GenerationError) and "took longer than" in str(slow)
    assert plain["finish_reason"] == {"type": "length"} and len(plain["output_ids"]) == 8


def test_n_samples_share_the_prompt_and_seeds_reproduce(engine: Engine) -> None:
    prompt = "A shared prompt for parallel samples " * 4
    params = {"max_new_tokens": 12, "temperature": 1.0, "seed": 11, "n": 3, "ignore_eos": True}
    outs = engine.generate(prompt, params)
    assert len(outs) == 3
    assert len({tuple(o["output_ids"]) for o in outs}) == 3
    prompt_len = outs[0]["usage"]["prompt_tokens"]
    assert [o["usage"]["cached_tokens"] >= prompt_len - 1 for o in outs[1:]] == [True, True]
    again = engine.generate(prompt, {**params, "n": 1, "seed": 12})
    assert again["output_ids"] == outs[1]["output_ids"]
    mixed = engine.generate(["other", prompt, "x y z"], {**params, "n": 1, "seed": 12})
    assert mixed[1]["output_ids"] == outs[1]["output_ids"]


def test_logprobs_match_a_plain_forward(engine: Engine) -> None:
    prompt_ids = list(range(300, 320))
    out = engine.generate(
        input_ids=prompt_ids,
        sampling_params=greedy(4, return_logprob=True, top_logprobs_num=3, logprob_start_len=5),
    )
    model = engine.runtime.runner.model
    seq = prompt_ids + out["output_ids"]
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(engine.runtime.runner.model_path).eval()
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([seq])).logits[0].float(), -1)
    lp = out["logprobs"]
    assert [t for _, t in lp["input"]] == prompt_ids[5:]
    want_in = [ref[p - 1, prompt_ids[p]].item() for p in range(5, 20)]
    assert lp["input"][0][0] == pytest.approx(want_in[0], abs=1e-4)
    assert [v for v, _ in lp["input"]] == pytest.approx(want_in, abs=1e-4)
    want_out = [ref[19 + i, t].item() for i, t in enumerate(out["output_ids"])]
    assert [v for v, _ in lp["output"]] == pytest.approx(want_out, abs=1e-4)
    assert [t for _, t in lp["output"]] == out["output_ids"]
    assert [top[0][1] for top in lp["output_top"]] == out["output_ids"]  # greedy = top-1
    assert len(lp["input_top"]) == 15 and len(lp["input_top"][0]) == 3
    assert model is engine.runtime.runner.model


def test_prefill_only_request_caches_the_prompt(engine: Engine) -> None:
    ids = list(range(1000, 1100))
    first = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0})
    assert first["output_ids"] == [] and first["finish_reason"] == {"type": "length"}
    second = engine.generate(input_ids=ids + [5, 6], sampling_params=greedy(1))
    assert second["usage"]["cached_tokens"] == 100


def test_abort_frees_kv_and_flush(engine: Engine) -> None:
    stream = engine.generate("abort me", greedy(500, ignore_eos=True), stream=True)
    next(stream)
    stream.close()  # closing the iterator aborts the request
    for _ in range(100):
        if engine.stats().running == 0:
            break
    assert engine.stats().running == 0
    assert engine.flush_cache()
    stats = engine.stats()
    assert stats.kv_used_tokens == 0 and stats.extra["cached_tokens"] == 0


def test_prompt_logprobs_from_position_zero(engine: Engine) -> None:
    params = greedy(1, return_logprob=True, logprob_start_len=0)
    one = engine.generate(input_ids=[321], sampling_params=params)
    assert one["logprobs"]["input"] == [(None, 321)]
    three = engine.generate(input_ids=[321, 322, 323], sampling_params=params)
    assert [t for _, t in three["logprobs"]["input"]] == [321, 322, 323]
    assert three["logprobs"]["input"][0][0] is None
    assert all(isinstance(v, float) for v, _ in three["logprobs"]["input"][1:])


def test_logit_bias_parsing_and_ranges() -> None:
    from plait.backend.request.sampling_params import SamplingParams

    params = SamplingParams.from_dict({"logit_bias": {"7": -1, 5: 3.5}})
    assert params.logit_bias == ((5, 3.5), (7, -1.0))
    params.check_vocab(vocab_size=10)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams.from_dict({"logit_bias": {"x": 1.0}})
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams.from_dict({"logit_bias": {3: "high"}})
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams.from_dict({"logit_bias": {3: 101}}).check_vocab(vocab_size=10)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams.from_dict({"logit_bias": {10: 1}}).check_vocab(vocab_size=10)


def test_logit_bias_steers_sampling_in_a_mixed_batch(engine: Engine) -> None:
    plain = greedy(5, ignore_eos=True)
    forced = greedy(5, ignore_eos=True, logit_bias={123: 100.0})
    sampled = {"max_new_tokens": 5, "temperature": 1.0, "seed": 3, "ignore_eos": True,
               "logit_bias": {"77": 100}}  # fmt: skip
    alone = engine.generate("Bias", plain)
    out = engine.generate(["Bias", "Bias", "Bias"], [plain, forced, sampled])
    assert out[0]["output_ids"] == alone["output_ids"]  # other rows are untouched
    assert out[1]["output_ids"] == [123] * 5
    assert out[2]["output_ids"] == [77] * 5


def test_profile_records_steps_into_a_chrome_trace(tmp_path: Path) -> None:
    with tiny_engine() as unset, pytest.raises(ValueError, match="profiling is off"):
        unset.start_profile()
    with tiny_engine(profile_dir=str(tmp_path)) as engine:
        check_profiles(engine, tmp_path)


def check_profiles(engine: Engine, tmp_path: Path) -> None:
    assert "started" in engine.start_profile()
    with pytest.raises(ValueError, match="already"):
        engine.start_profile()
    engine.generate("Profile me", greedy(4))
    path = Path(engine.stop_profile())
    assert path.parent == tmp_path.resolve() and path.suffix == ".json"
    events = json.loads(path.read_text())["traceEvents"]
    names = {str(e.get("name", "")) for e in events}
    assert "plait.scheduler_step" in names and any(n.startswith("aten::") for n in names)
    with pytest.raises(ValueError, match="no profile"):
        engine.stop_profile()
    with pytest.raises(ValueError, match="num_steps"):
        engine.start_profile(num_steps=0)
    with pytest.raises(ValueError, match="relative path"):
        engine.start_profile(output_dir=str(tmp_path))
    engine.start_profile(output_dir="auto", num_steps=2)
    engine.generate("Stops by itself", greedy(6))
    assert len(list((tmp_path / "auto").glob("plait-trace-*.json"))) == 1


def test_a_failing_detokenization_fails_only_its_request_in_process(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    detokenizer = engine.runtime.detokenizer  # type: ignore[union-attr]
    real = detokenizer.step

    def step(out: Any) -> str:
        if out.rid == "poisoned":
            raise RuntimeError("decode failed")
        return real(out)

    monkeypatch.setattr(detokenizer, "step", step)
    params = engine._requests(None, [[5, 6, 7], [5, 6, 8]], greedy(6, ignore_eos=True))[0]

    async def both() -> dict[int, dict[str, Any]]:
        stream = engine.stream_batch(params, rids=["poisoned", "fine"], stream=False)
        return {index: item async for index, item in stream}

    results = asyncio.run(both())
    assert results[0]["text"] == "" and len(results[0]["output_ids"]) == 6
    assert results[1]["text"] and len(results[1]["output_ids"]) == 6
    again = engine.generate(input_ids=[5, 6, 8], sampling_params=greedy(6, ignore_eos=True))
    assert again["output_ids"] == results[1]["output_ids"]  # the scheduler thread lives on

"""SGLang's native API (/generate and friends) and /metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import MODEL, error_message, metrics, sse_events

from plait.runtime import Runtime


@pytest.fixture(scope="module")
def url(plait_server: Runtime) -> str:
    return plait_server.url


def generate(url: str, **body: Any) -> httpx.Response:
    return httpx.post(url + "/generate", json=body, timeout=120)


def greedy(tokens: int, **extra: Any) -> dict[str, Any]:
    return {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True, **extra}


def test_generate_single_text(url: str) -> None:
    out = generate(url, text="The capital of", sampling_params=greedy(6)).json()
    meta = out["meta_info"]
    assert len(out["output_ids"]) == 6 == meta["completion_tokens"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] > 0 and meta["cached_tokens"] >= 0
    assert isinstance(out["text"], str) and meta["id"]


def test_generate_batch_input_ids_and_n(url: str) -> None:
    outs = generate(url, input_ids=[[5, 6, 7], [8, 9]], sampling_params=greedy(3)).json()
    assert [o["meta_info"]["prompt_tokens"] for o in outs] == [3, 2]
    samples = generate(url, text="x", sampling_params=greedy(3, n=2)).json()
    assert len(samples) == 2 and samples[0]["output_ids"] == samples[1]["output_ids"]
    per_item = generate(
        url, text=["a", "b"], sampling_params=[greedy(2), greedy(4)], rid=["r-a", "r-b"]
    ).json()
    assert [o["meta_info"]["completion_tokens"] for o in per_item] == [2, 4]
    assert [o["meta_info"]["id"] for o in per_item] == ["r-a", "r-b"]


def test_generate_stream_has_cumulative_text(url: str) -> None:
    full = generate(url, text="stream me", sampling_params=greedy(8)).json()
    body = {"text": "stream me", "sampling_params": greedy(8), "stream": True}
    with httpx.stream("POST", url + "/generate", json=body, timeout=60) as r:
        events = sse_events(list(r.iter_lines()))
    assert events[-1]["text"] == full["text"]
    assert all(b["text"].startswith(a["text"]) for a, b in zip(events, events[1:], strict=False))
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_logprobs_in_sglang_format(url: str) -> None:
    out = generate(
        url,
        text="one two three four",
        sampling_params=greedy(3),
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=2,
        return_text_in_logprobs=True,
    ).json()
    meta = out["meta_info"]
    prompt = meta["input_token_logprobs"]
    assert len(prompt) == meta["prompt_tokens"] and prompt[0][0] is None
    assert all(isinstance(t[2], str) for t in prompt)
    assert [t[1] for t in meta["output_token_logprobs"]] == out["output_ids"]
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])
    plain = generate(url, text="one two", sampling_params=greedy(2), return_logprob=True).json()
    assert all(t[2] is None for t in plain["meta_info"]["output_token_logprobs"])
    assert len(plain["meta_info"]["input_token_logprobs"]) == 1  # default start: last token


def test_cache_prefix_then_hit(url: str) -> None:
    prefix = "A long shared prefix for the radix cache to keep. " * 4
    generate(url, text=prefix, sampling_params={"max_new_tokens": 0})
    out = generate(url, text=prefix + "and more", sampling_params=greedy(1)).json()
    assert out["meta_info"]["cached_tokens"] >= 20


def test_model_info_server_info_flush_health(url: str) -> None:
    info = httpx.get(url + "/get_model_info").json()
    assert info["model_path"] == MODEL and info["is_generation"] is True
    server = httpx.get(url + "/get_server_info").json()
    assert server["max_total_num_tokens"] == 16384 and "stats" in server
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/health_generate", timeout=30).status_code == 200
    assert httpx.post(url + "/flush_cache", json={"empty_cache": True}).status_code in (200, 400)


def test_abort_request_by_rid(url: str) -> None:
    body = {"text": "abort me", "sampling_params": greedy(3000), "rid": "to-abort"}
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", url + "/generate", json={**body, "stream": True}) as r,
    ):
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        assert client.post(url + "/abort_request", json={"rid": "to-abort"}).status_code == 200
        events = sse_events(list(lines))
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "abort"


def test_generate_errors_name_the_field(url: str) -> None:
    r = generate(url, text="x", sampling_params={"temperature": -1})
    assert r.status_code == 400 and "temperature" in error_message(r)
    r = generate(url, text="x", sampling_params={"max_tokens": 3})
    assert r.status_code == 400 and "max_tokens" in error_message(r)
    r = generate(url, text="x", input_ids=[1])
    assert r.status_code == 400 and "text" in error_message(r)
    r = generate(url, text="x", bogus=1)
    assert r.status_code == 400 and "bogus" in error_message(r)
    r = generate(url, input_ids=[1] * 5000, sampling_params=greedy(1))
    assert r.status_code == 400 and "input_ids" in error_message(r)
    r = generate(url, text="x", sampling_params={"stop_regex": "a+("})
    assert r.status_code == 400 and "stop_regex" in error_message(r)
    r = generate(url, text="x", sampling_params={"structural_tag": "{}"})
    assert r.status_code == 400 and "structural_tag needs a 'format'" in error_message(r)
    r = generate(url, text="x", sampling_params={"custom_params": {"a": 1}})
    assert r.status_code == 400 and "custom_params" in error_message(r)
    for fields, name in (({"top_k": 2**70}, "top_k"), ({"seed": 2**64}, "seed"),
                         ({"seed": 2**64 - 1, "n": 2}, "seed")):  # fmt: skip
        r = generate(url, text="x", sampling_params=fields)
        assert r.status_code == 400 and r.json()["error"]["param"] == name, r.text
    assert generate(url, text="x", sampling_params=greedy(2)).status_code == 200


def test_metrics_exposition(url: str) -> None:
    generate(url, text="metrics", sampling_params=greedy(4))
    text = httpx.get(url + "/metrics").text
    assert "# TYPE plait_time_to_first_token_seconds histogram" in text
    m = metrics(url)
    for name in (
        "plait_requests_running",
        "plait_requests_waiting",
        "plait_generation_tokens_total",
        "plait_prompt_tokens_total",
        "plait_cache_hit_tokens_total",
        "plait_kv_used_tokens",
        "plait_kv_usage",
        "plait_inter_token_latency_seconds_count",
    ):
        assert name in m, name
    assert m["plait_time_to_first_token_seconds_count"] >= 1
    assert (
        m['plait_time_to_first_token_seconds_bucket{le="+Inf"}']
        == (m["plait_time_to_first_token_seconds_count"])
    )
    assert m["plait_kv_total_tokens"] == 16384


def test_start_and_stop_profile_write_a_trace(url: str, profile_dir: Path) -> None:
    r = httpx.post(url + "/start_profile", json={"output_dir": "run1"}, timeout=30)
    assert r.status_code == 200, r.text
    assert generate(url, text="profiled", sampling_params=greedy(3)).status_code == 200
    r = httpx.post(url + "/stop_profile", timeout=120)
    assert r.status_code == 200, r.text
    traces = list((profile_dir / "run1").glob("plait-trace-*.json"))
    assert len(traces) == 1 and str(traces[0]) in r.text
    again = httpx.post(url + "/stop_profile", timeout=30)
    assert again.status_code == 400 and "no profile" in error_message(again)
    bad = httpx.post(url + "/start_profile", json={"num_steps": -1}, timeout=30)
    assert bad.status_code == 400 and "num_steps" in error_message(bad)
    for outside in ("/proc/self/nope", "../escape", "a/../../b"):
        r = httpx.post(url + "/start_profile", json={"output_dir": outside}, timeout=30)
        assert r.status_code == 400 and "output_dir" in error_message(r), r.text
    (profile_dir / "a-file").write_text("not a directory")
    r = httpx.post(url + "/start_profile", json={"output_dir": "a-file/sub"}, timeout=30)
    assert r.status_code == 400 and "cannot create" in error_message(r), r.text
    assert generate(url, text="still serving", sampling_params=greedy(2)).status_code == 200

"""Reliability: 200 concurrent requests, client disconnects, bad input."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from server_helpers import MODEL, completion, error_message, metrics, sse_events, wait_until

from plait.runtime import Runtime

CONCURRENT = 200
DISTINCT_PROMPTS = 20
TOKENS = 12


@pytest.fixture(scope="module")
def url(plait_server: Runtime) -> str:
    return plait_server.url


def body(i: int, *, stream: bool) -> dict[str, Any]:
    prompt = f"Request number {i % DISTINCT_PROMPTS}: tell me"
    return {"model": MODEL, "prompt": prompt, "max_tokens": TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": stream}  # fmt: skip


async def one(client: httpx.AsyncClient, i: int) -> str:
    """The text of request i (odd ones streamed), checking it is complete."""
    if i % 2 == 0:
        r = await client.post("/v1/completions", json=body(i, stream=False))
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "length"
        assert r.json()["usage"]["completion_tokens"] == TOKENS
        return str(choice["text"])
    async with client.stream("POST", "/v1/completions", json=body(i, stream=True)) as r:
        assert r.status_code == 200
        events = sse_events([line async for line in r.aiter_lines()])
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    return "".join(e["choices"][0]["text"] for e in events)


async def run_all(url: str) -> list[str]:
    limits = httpx.Limits(max_connections=CONCURRENT + 10, max_keepalive_connections=CONCURRENT)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        return await asyncio.gather(*(one(client, i) for i in range(CONCURRENT)))


def test_200_concurrent_requests_get_what_they_get_alone(url: str) -> None:
    alone = []
    for i in range(DISTINCT_PROMPTS):
        r = httpx.post(url + "/v1/completions", json=body(i, stream=False), timeout=60)
        alone.append(r.json()["choices"][0]["text"])
    together = asyncio.run(run_all(url))
    assert together == [alone[i % DISTINCT_PROMPTS] for i in range(CONCURRENT)]


async def abandon_stream(url: str) -> None:
    """Read a few chunks of a long stream, then drop the connection."""
    long = {"model": MODEL, "prompt": "never ending", "max_tokens": 3000, "ignore_eos": True,
            "stream": True}  # fmt: skip
    async with (
        httpx.AsyncClient(base_url=url, timeout=60) as client,
        client.stream("POST", "/v1/completions", json=long) as r,
    ):
        seen = 0
        async for line in r.aiter_lines():
            seen += line.startswith("data:")
            if seen == 5:
                break


async def disconnect_among_others(url: str) -> list[str]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        others = [one(client, i) for i in range(6)]
        results = await asyncio.gather(abandon_stream(url), *others)
    return list(results[1:])


def test_client_disconnect_aborts_and_frees_kv(url: str) -> None:
    assert wait_until(lambda: metrics(url)["plait_requests_running"] == 0, 30)
    before = metrics(url)
    alone = [completion(url, body(i, stream=False)["prompt"], TOKENS, ignore_eos=True)
             for i in range(6)]  # fmt: skip
    texts = asyncio.run(disconnect_among_others(url))
    assert texts == [r.json()["choices"][0]["text"] for r in alone]

    def settled() -> bool:
        m = metrics(url)
        return m["plait_requests_running"] == 0 and m["plait_kv_used_tokens"] == 0

    assert wait_until(settled, 10)
    after = metrics(url)
    assert after["plait_kv_used_tokens"] == before["plait_kv_used_tokens"] == 0
    aborted = 'plait_requests_finished_total{reason="abort"}'
    assert after.get(aborted, 0) >= before.get(aborted, 0) + 1
    assert after["plait_generation_tokens_total"] < before["plait_generation_tokens_total"] + 2000


BAD_REQUESTS = [
    ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, "model"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 10**9}, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": [7] * 5000}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": -0.5}, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 0}, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 1.5}, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "many"}, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": "two"}, "n"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {"5": 500}}, "logit_bias"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {"a": 1}}, "logit_bias"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {"99999": 1}},
     "logit_bias"),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, "prompt"),
    ("/v1/completions", {"model": MODEL}, "prompt"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
     "messages.0.role"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": 5}]},
     "messages.0.content"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                              "stream": "yes please"}, "stream"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "payload", "field"), BAD_REQUESTS)
def test_bad_input_gets_400_naming_the_field(
    url: str, path: str, payload: dict[str, Any], field: str
) -> None:
    r = httpx.post(url + path, json=payload, timeout=30)
    assert r.status_code == 400, r.text
    assert field in error_message(r), error_message(r)
    assert r.json()["error"]["param"] == field or field in (r.json()["error"]["param"] or "")


def test_malformed_json_and_the_server_goes_on(url: str) -> None:
    headers = {"content-type": "application/json"}
    r = httpx.post(url + "/v1/completions", content=b'{"model": "plait', headers=headers)
    assert r.status_code == 400 and "JSON" in error_message(r)
    r = httpx.post(url + "/generate", content=b"not json", headers=headers)
    assert r.status_code == 400
    ok = completion(url, "still alive?", 3, ignore_eos=True)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
    assert json.loads(ok.text)["choices"][0]["finish_reason"] == "length"

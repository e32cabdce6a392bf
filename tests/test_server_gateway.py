"""Two `plait serve` workers behind SGLang's Model Gateway (PyPI `sglang-router`, its Rust
binary inside the wheel) with the cache_aware policy, all on loopback: OpenAI chat, a
streamed completion, /generate with a JSON schema, a DSL program, a shared prefix landing on
one worker
(cached tokens), and the served name in the gateway's /v1/models. Skipped without the
package."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from server_helpers import MODEL, server_args, sse_events, wait_until

import plait
from plait.clients.http import HttpBackend
from plait.runtime import Runtime, free_port

pytest.importorskip("sglang_router")

SCHEMA = {
    "type": "object",
    "properties": {"pet": {"enum": ["cat", "dog"]}, "good": {"type": "boolean"}},
    "required": ["pet", "good"],
    "additionalProperties": False,
}


@plait.program
def pet_card(s: plait.ProgramState) -> None:
    s += "Pet card. Kind: " + plait.gen("kind", regex="(cat|dog)", temperature=0)
    s += "\nName: " + plait.gen("name", max_tokens=4, temperature=0)


PREFIX = "A long system prompt that every request of this tenant shares, word for word. " * 6


@pytest.fixture(scope="module")
def workers() -> Iterator[list[Runtime]]:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runtimes = list(pool.map(lambda _: Runtime(**server_args()), range(2)))
    yield runtimes
    for rt in runtimes:
        rt.close()


def models_listed(url: str) -> bool:
    try:
        data = httpx.get(url + "/v1/models", timeout=5).json().get("data") or []
    except (httpx.HTTPError, ValueError):
        return False
    return [card.get("id") for card in data] == [MODEL]


@pytest.fixture(scope="module")
def gateway(workers: list[Runtime]) -> Iterator[str]:
    """The gateway, started as its docs say (it names the model by the workers'
    `served_model_name` and loads the tokenizer from their `model_path`, a local
    directory here, so it never looks for one online), its Prometheus exporter on a free
    loopback port (on a taken one, 29000 by default, it exits at start)."""
    port = free_port()
    command = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
               "--port", str(port), "--policy", "cache_aware", "--log-level", "warn",
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
               "--worker-urls", *(rt.url for rt in workers)]  # fmt: skip
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: models_listed(url), 60, interval=0.2), "gateway not ready"
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    r = httpx.post(url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r


def test_openai_chat_through_the_gateway(gateway: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}],
            "max_tokens": 5, "temperature": 0}  # fmt: skip
    out = post(gateway, "/v1/chat/completions", body).json()
    choice = out["choices"][0]
    assert out["model"] == MODEL and choice["message"]["role"] == "assistant"
    assert out["usage"]["completion_tokens"] == 5 and choice["finish_reason"] == "length"


def test_streamed_completion_through_the_gateway(gateway: str) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 6,
            "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", gateway + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        events = sse_events(list(r.iter_lines()))
    whole = post(gateway, "/v1/completions", {**body, "stream": False}).json()
    text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
    assert text == whole["choices"][0]["text"] and whole["usage"]["completion_tokens"] == 6
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_generate_with_a_json_schema_through_the_gateway(gateway: str) -> None:
    params = {"max_new_tokens": 64, "temperature": 0, "json_schema": json.dumps(SCHEMA)}
    out = post(gateway, "/generate", {"text": "A person:", "sampling_params": params}).json()
    jsonschema.validate(json.loads(out["text"]), SCHEMA)
    assert out["meta_info"]["finish_reason"]["type"] == "stop"


def test_a_shared_prefix_lands_on_one_worker(gateway: str, workers: list[Runtime]) -> None:
    params = {"max_new_tokens": 2, "temperature": 0}
    first = post(gateway, "/generate", {"text": PREFIX + "first", "sampling_params": params})
    again = post(gateway, "/generate", {"text": PREFIX + "second", "sampling_params": params})
    prompt = first.json()["meta_info"]["prompt_tokens"]
    assert again.json()["meta_info"]["cached_tokens"] >= prompt // 2, again.json()["meta_info"]


def test_a_dsl_program_through_the_gateway(gateway: str, workers: list[Runtime]) -> None:
    """`HttpBackend` pointed at the gateway runs a program as against one worker. (Not
    `select`: it sends its choices as one batch of texts, and the gateway's /generate takes
    a single `text` only: 422.)"""
    via = pet_card.run(backend=HttpBackend(gateway))
    direct = pet_card.run(backend=HttpBackend(workers[0].url))
    assert via["kind"] in ("cat", "dog") and via.text() == direct.text()

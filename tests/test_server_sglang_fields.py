"""/generate takes every field of SGLang's `GenerateReqInput` (sglang 0.5.23): each at its
default answers exactly as without it; hostile values are 400s naming the field; the roles
in docs/server.md are the ones the code declares; the info endpoints give the served name;
what `sglang.bench_serving --backend sglang` sends and reads, replayed."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import MODEL

from plait.backend.server.native_protocol import GenerateRequest, fields_with, is_off, role_of
from plait.runtime import Runtime

ROOT = Path(__file__).resolve().parents[1]
SGLANG_FIELDS: dict[str, Any] = json.loads(
    (ROOT / "tests/data/sglang_generate_req_input.json").read_text()
)["fields"]
DOC_ROW = re.compile(r"^\| `(\w+)` \| (used|ignored|off) \|", re.MULTILINE)
BASE = {"text": "Fields at their defaults", "sampling_params": {"max_new_tokens": 4,
        "temperature": 0, "ignore_eos": True}}  # fmt: skip


@pytest.fixture(scope="module")
def url(plait_server: Runtime) -> str:
    return plait_server.url


def generate(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + "/generate", json=body, timeout=60)


def test_every_sglang_field_is_declared_with_sglangs_default() -> None:
    declared = GenerateRequest.model_fields
    assert len(SGLANG_FIELDS) == 72
    assert set(declared) == set(SGLANG_FIELDS) | {"model"}
    assert {name: declared[name].default for name in SGLANG_FIELDS} == SGLANG_FIELDS
    roles = fields_with("used") + fields_with("ignored") + fields_with("off")
    assert sorted(roles) == sorted(declared)
    assert "model" in fields_with("used") and "session_id" in fields_with("ignored")
    assert "image_data" in fields_with("off") and "lora_path" in fields_with("off")


def test_docs_table_matches_the_declared_roles() -> None:
    rows = dict(DOC_ROW.findall((ROOT / "docs/server.md").read_text()))
    assert rows == {name: role_of(info) for name, info in GenerateRequest.model_fields.items()}


def test_off_values() -> None:
    assert all(is_off(v, d) for v, d in ((None, False), (False, None), ([], None), ({}, None),
                                         ([None, False], None), (0, 0)))  # fmt: skip
    assert not any(is_off(v, d) for v, d in (("x", None), (True, False), ([None, "a"], None),
                                             ("last", False), (1, 0)))  # fmt: skip


async def each_field_alone(url: str) -> dict[str, httpx.Response]:
    """One request per field at its default, all in flight together."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        sent = [client.post("/generate", json={name: default, **BASE})
                for name, default in SGLANG_FIELDS.items()]  # fmt: skip
        return dict(zip(SGLANG_FIELDS, await asyncio.gather(*sent), strict=True))


def test_each_field_at_its_default_answers_as_without_it(url: str) -> None:
    baseline = generate(url, BASE).json()
    for name, r in asyncio.run(each_field_alone(url)).items():
        assert r.status_code == 200, (name, r.text)
        assert r.json()["output_ids"] == baseline["output_ids"], name
    every = {**SGLANG_FIELDS, **BASE, "model": MODEL}  # all at once, as bench_serving sends
    assert generate(url, every).json()["output_ids"] == baseline["output_ids"]


def test_ignored_fields_take_real_values(url: str) -> None:
    hints = {"session_id": "s1", "priority": 3, "routing_key": "tenant-a", "cache_salt": None,
             "bootstrap_host": "10.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 7,
             "data_parallel_rank": 1, "routed_dp_rank": 0, "conversation_id": "c",
             "custom_labels": {"team": "x"}, "no_logs": True, "log_metrics": False,
             "external_trace_header": {"traceparent": "00-ab-cd-01"}, "received_time": 1.5,
             "lora_path": [None], "return_hidden_states": [False]}  # fmt: skip
    baseline = generate(url, BASE).json()
    r = generate(url, {**BASE, **hints})
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == baseline["output_ids"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"lora_path": "my-adapter"}, "lora_path"),
        ({"image_data": "http://example.invalid/cat.png"}, "image_data"),
        ({"return_hidden_states": "last"}, "return_hidden_states"),
        ({"return_routed_experts": True}, "return_routed_experts"),
        ({"token_ids_logprob": [1, 2]}, "token_ids_logprob"),
        ({"cache_salt": "tenant-a"}, "cache_salt"),
        ({"priority": "high"}, "priority"),
        ({"bootstrap_port": "x"}, "bootstrap_port"),
        ({"custom_labels": {"a": 1}}, "custom_labels.a"),
        ({"return_hidden_states": "first"}, "return_hidden_states"),
        ({"model": "someone-else"}, "model"),
        ({"return_logprob": True, "top_logprobs_num": -1}, "top_logprobs_num"),
        ({"rid": "r" * 257}, "rid"),
        ({"stream": "maybe"}, "stream"),
        ({"no_such_field": 1}, "no_such_field"),
    ],
)
def test_hostile_values_are_400s_naming_the_field(
    url: str, fields: dict[str, Any], param: str
) -> None:
    r = generate(url, {**BASE, **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"].startswith(param), error


def test_info_endpoints_give_the_served_name(url: str) -> None:
    for path in ("/get_model_info", "/model_info"):
        info = httpx.get(url + path, timeout=30).json()
        assert info["model_path"] == MODEL == info["served_model_name"]
        assert Path(info["tokenizer_path"], "tokenizer.json").is_file()
    for path in ("/get_server_info", "/server_info"):
        server = httpx.get(url + path, timeout=30).json()
        assert server["served_model_name"] == MODEL == server["model"]
        assert server["model_path"] == server["tokenizer_path"] == info["tokenizer_path"]
    card = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]
    assert (card["id"], card["root"]) == (MODEL, MODEL)


# --- sglang.bench_serving --backend sglang, replayed ---------------------------------------
def bench_serving_body(prompt: str | list[int], output_len: int) -> dict[str, Any]:
    """The body `sglang.bench_serving --backend sglang` posts to /generate at its defaults
    (sglang 0.5.23, `async_request_sglang_generate`): `text` or `input_ids`, greedy,
    `ignore_eos`, streamed, and four fields it always sends."""
    return {
        ("text" if isinstance(prompt, str) else "input_ids"): prompt,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True},
        "stream": True, "lora_path": None, "return_logprob": False,
        "return_routed_experts": False, "logprob_start_len": -1,
    }  # fmt: skip


def read_as_bench_serving(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The stream parsed line by line as its client does: blank lines skipped, `data: `
    stripped, `[DONE]` passed over, every other line a JSON object."""
    chunks = []
    with httpx.stream("POST", url + "/generate", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = [line.strip() for line in r.iter_lines() if line.strip()]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        chunks.append(json.loads(line.removeprefix("data: ")))
    return chunks


def test_what_bench_serving_sends_and_reads(url: str) -> None:
    """Its calls in order: /v1/models (the model id), /model_info (the tokenizer), a warm-up
    request (at most 32 tokens), /flush_cache?timeout=, the measured requests (a text and
    token ids), /server_info; from each stream it reads the cumulative `text`,
    `meta_info.completion_tokens` (the output length), `meta_info.prompt_tokens` and
    `meta_info.cached_tokens` (`--cache-report`)."""
    assert httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"] == MODEL
    assert Path(httpx.get(url + "/model_info", timeout=30).json()["tokenizer_path"]).is_dir()
    warm = read_as_bench_serving(url, bench_serving_body("Warm up with this prompt", 32))
    assert warm[-1]["meta_info"]["completion_tokens"] == 32
    flushed = httpx.post(url + "/flush_cache", params={"timeout": 300.0}, timeout=60)
    assert flushed.status_code == 200, flushed.text
    ids = [100 + 7 * i for i in range(40)]
    for prompt, prompt_len in (("Tell me a story about a lighthouse", None), (ids, 40)):
        chunks = read_as_bench_serving(url, bench_serving_body(prompt, 24))
        texts = [c["text"] for c in chunks if c.get("text")]
        assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))
        counts = [c["meta_info"]["completion_tokens"] for c in chunks]
        assert counts == sorted(counts) and counts[-1] == 24
        meta = chunks[-1]["meta_info"]
        assert meta["prompt_tokens"] == prompt_len if prompt_len else meta["prompt_tokens"] > 0
        assert 0 <= meta["cached_tokens"] < meta["prompt_tokens"]
        whole = generate(url, {**bench_serving_body(prompt, 24), "stream": False}).json()
        assert whole["text"] == texts[-1] and whole["meta_info"]["completion_tokens"] == 24
    assert httpx.get(url + "/server_info", timeout=30).status_code == 200

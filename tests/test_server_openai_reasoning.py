"""Reasoning models on the OpenAI chat endpoint (--reasoning-parser): reasoning_content apart
from the content (streamed deltas concatenate to the same), the grammar only after the
reasoning, enable_thinking passed to the real Qwen3 template, DeepSeek-R1's template."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient
from server_helpers import MODEL, sse_events

from helpers import tiny_engine
from plait.backend.server.app import create_app
from plait.backend.server.args import ServerSettings

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
A = 67  # plait-tiny's "a", which JSON cannot start with


def template(name: str) -> str:
    return str(json.loads((TEMPLATES / f"{name}.json").read_text())["chat_template"])


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = ServerSettings(allow_request_chat_template=True)
    with (
        tiny_engine(reasoning_parser="qwen3") as eng,
        TestClient(create_app(eng, settings=settings)) as c,
    ):
        yield c


def body(name: str, **extra: Any) -> dict[str, Any]:
    kwargs = {"chat_template": template(name), **extra.pop("kwargs", {})}
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40,
            "temperature": 0, "logit_bias": {str(A): 100}, "max_reasoning_tokens": 5,
            "response_format": fmt, "chat_template_kwargs": kwargs, **extra}  # fmt: skip


def message(client: TestClient, req: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/chat/completions", json=req)
    assert r.status_code == 200, r.text
    return dict(r.json()["choices"][0]["message"])


def streamed(client: TestClient, req: dict[str, Any]) -> tuple[str, str]:
    with client.stream("POST", "/v1/chat/completions", json={**req, "stream": True}) as r:
        assert r.status_code == 200
        events = sse_events(list(r.iter_lines()))
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    return reasoning, "".join(d.get("content") or "" for d in deltas)


def valid(text: str) -> None:
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("name", ["qwen3", "deepseek-r1-distill-qwen"])
def test_reasoning_content_is_apart_and_the_answer_is_valid_json(
    client: TestClient, name: str
) -> None:
    req = body(name)
    msg = message(client, req)
    assert msg["reasoning_content"] == "aaaaa"
    assert msg["content"].startswith('{"name": "')
    valid(msg["content"])
    assert streamed(client, req) == (msg["reasoning_content"], msg["content"])


def test_enable_thinking_false_applies_the_grammar_from_the_first_token(
    client: TestClient,
) -> None:
    req = body("qwen3", kwargs={"enable_thinking": False})
    msg = message(client, req)
    assert msg["reasoning_content"] == ""
    assert msg["content"].startswith('{"name": "')
    valid(msg["content"])
    assert streamed(client, req) == ("", msg["content"])


def test_a_request_may_turn_reasoning_off(client: TestClient) -> None:
    msg = message(client, body("qwen3", reasoning=False))
    assert "reasoning_content" not in msg
    assert msg["content"].startswith('{"name": "')
    valid(msg["content"])


def test_free_text_without_an_end_marker_is_all_reasoning(client: TestClient) -> None:
    req = body("deepseek-r1-distill-qwen", max_tokens=6)
    del req["response_format"], req["max_reasoning_tokens"]
    msg = message(client, req)
    assert msg == {"role": "assistant", "content": "", "reasoning_content": "aaaaaa"}
    assert streamed(client, req) == ("aaaaaa", "")

"""Warnings for schema keywords the grammar cannot enforce reach every API (body and the
X-Plait-Warnings header, streamed and not), and --strict-schemas turns them into 400s."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from server_helpers import MODEL, sse_events

from helpers import tiny_engine
from plait.backend.engine.engine import Engine
from plait.backend.server.app import create_app
from plait.backend.server.serving import WARNINGS_HEADER, warnings_header

UNIQUE = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
WARNING = (
    "json_schema keyword 'uniqueItems' is not enforced (duplicate items are not rejected) at /"
)
PLAIN = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


def chat_body(schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "numbers"}]
    return {"model": MODEL, "messages": messages, "max_tokens": 24, "temperature": 0,
            "response_format": schema_format(schema), **extra}  # fmt: skip


def completion_body(schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "numbers:", "max_tokens": 24, "temperature": 0,
            "response_format": schema_format(schema), **extra}  # fmt: skip


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with tiny_engine() as eng:
        yield eng


@pytest.fixture(scope="module")
def client(engine: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine)) as c:
        yield c


def streamed(client: TestClient, path: str, body: dict[str, Any]) -> tuple[Any, list[Any]]:
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        return r.headers, sse_events(list(r.iter_lines()))


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_openai_responses_carry_the_warnings_in_body_and_header(
    client: TestClient, path: str
) -> None:
    body = (chat_body if "chat" in path else completion_body)(UNIQUE)
    r = client.post(path, json=body)
    assert r.status_code == 200
    assert r.json()["warnings"] == [WARNING]
    assert json.loads(r.headers[WARNINGS_HEADER]) == [WARNING]
    json.loads(r.json()["choices"][0].get("text") or r.json()["choices"][0]["message"]["content"])
    headers, events = streamed(client, path, body)
    assert json.loads(headers[WARNINGS_HEADER]) == [WARNING]
    finals = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert [e["warnings"] for e in finals] == [[WARNING]]
    assert all("warnings" not in e for e in events if e not in finals)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_schema_without_gaps_has_no_warnings_and_no_header(client: TestClient, path: str) -> None:
    body = (chat_body if "chat" in path else completion_body)(PLAIN)
    r = client.post(path, json=body)
    assert r.status_code == 200 and r.json()["warnings"] == []
    assert WARNINGS_HEADER not in r.headers
    headers, events = streamed(client, path, body)
    assert WARNINGS_HEADER not in headers
    assert [e["warnings"] for e in events if e["choices"] and e["choices"][0]["finish_reason"]] == [
        []
    ]


def test_native_generate_reports_warnings_in_meta_info_and_header(client: TestClient) -> None:
    params = {"json_schema": json.dumps(UNIQUE), "max_new_tokens": 24, "temperature": 0}
    r = client.post("/generate", json={"text": "numbers:", "sampling_params": params})
    assert r.status_code == 200
    assert r.json()["meta_info"]["warnings"] == [WARNING]
    assert json.loads(r.headers[WARNINGS_HEADER]) == [WARNING]
    body = {"text": "numbers:", "sampling_params": params, "stream": True}
    with client.stream("POST", "/generate", json=body) as s:
        assert json.loads(s.headers[WARNINGS_HEADER]) == [WARNING]
        events = sse_events(list(s.iter_lines()))
    assert events[-1]["meta_info"]["warnings"] == [WARNING]


def test_the_header_stays_ascii_and_bounded() -> None:
    many = [f"keyword 'x' is not enforced at /p\u00e9{i}" + "y" * 200 for i in range(40)]
    value = warnings_header(many)[WARNINGS_HEADER]
    assert value.isascii() and len(value) <= 4096
    shown = json.loads(value)
    assert shown[:-1] == many[: len(shown) - 1]
    assert shown[-1] == f"... {40 - len(shown) + 1} more in the response's warnings"
    assert warnings_header([]) == {}


@pytest.fixture(scope="module")
def strict_client() -> Iterator[TestClient]:
    with tiny_engine(strict_schemas=True) as eng, TestClient(create_app(eng)) as c:
        yield c


def test_strict_schemas_refuse_unenforced_keywords_naming_the_field(
    strict_client: TestClient,
) -> None:
    message = "{field}: the grammar cannot enforce this schema (strict schemas): " + WARNING
    field = "response_format.json_schema.schema"
    for path, make in (("/v1/chat/completions", chat_body), ("/v1/completions", completion_body)):
        for stream in (False, True):
            r = strict_client.post(path, json=make(UNIQUE, stream=stream))
            assert r.status_code == 400
            assert r.json()["error"]["param"] == field
            assert r.json()["error"]["message"] == message.format(field=field)
    params = {"json_schema": json.dumps(UNIQUE), "max_new_tokens": 8}
    r = strict_client.post("/generate", json={"text": "x", "sampling_params": params})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "json_schema"
    assert r.json()["error"]["message"] == message.format(field="json_schema")


def test_strict_schemas_leave_other_requests_alone(strict_client: TestClient) -> None:
    r = strict_client.post("/v1/chat/completions", json=chat_body(PLAIN))
    assert r.status_code == 200 and r.json()["warnings"] == []
    assert json.loads(r.json()["choices"][0]["message"]["content"])["a"] is not None
    plain = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
    assert strict_client.post("/v1/completions", json=plain).status_code == 200

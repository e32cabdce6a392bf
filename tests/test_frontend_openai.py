"""OpenAIBackend against plait's own OpenAI-compatible endpoints."""

from __future__ import annotations

import json

import pytest

import plait
from plait.clients.base import UnsupportedError
from plait.clients.openai import to_messages

# uniqueItems: a keyword neither grammar backend enforces, so the server's `auto` keeps
# xgrammar and its warning
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    },
    "required": ["city"],
}
WARNING = (
    "json_schema keyword 'maxLength' is enforced more strictly (length-bounded strings cannot "
    "hold escape sequences) at /properties/city"
)
UNIQUE = (
    "json_schema keyword 'uniqueItems' is not enforced (duplicate items are not rejected) at "
    "/properties/tags"
)


@pytest.fixture(scope="module")
def backend(plait_server: plait.Runtime) -> plait.OpenAIBackend:
    return plait.OpenAIBackend(f"{plait_server.url}/v1", model="plait-tiny")


@plait.program
def chat(s):  # type: ignore[no-untyped-def]
    s += plait.system("Be brief.")
    s += plait.user("Name a city.")
    s += plait.assistant(plait.gen("answer", max_tokens=8))
    s += plait.user("As JSON please.")
    s += plait.assistant(plait.gen("record", json_schema=SCHEMA, max_tokens=64))
    s += plait.user("Pick one.")
    s += plait.assistant(plait.select("pick", ["Paris", "Rome"]))


@plait.program
def with_regex(s):  # type: ignore[no-untyped-def]
    s += plait.user("A number?")
    s += plait.assistant(plait.gen("n", regex=r"[0-9]+"))


@plait.program
def plain_text(s):  # type: ignore[no-untyped-def]
    s += "Once upon a time " + plait.gen("story", max_tokens=6, min_tokens=6)


def test_roles_become_chat_messages(backend: plait.OpenAIBackend) -> None:
    state = chat.run(backend=backend, temperature=0.7, seed=1)
    roles = [m["role"] for m in state.messages()]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert json.loads(state["record"])["city"] is not None
    assert state["pick"] in ("Paris", "Rome")
    assert state.meta("answer")["usage"]["prompt_tokens"] > 0
    assert state.meta("record")["warnings"] == [WARNING, UNIQUE]
    assert state.meta("answer")["warnings"] == []
    streamed = chat.run(backend=backend, temperature=0.7, seed=1, stream=True)
    assert streamed.meta("record")["warnings"] == [WARNING, UNIQUE]


def test_text_without_roles_uses_completions(backend: plait.OpenAIBackend) -> None:
    state = plain_text.run(backend=backend, temperature=0)
    assert state.text() == "Once upon a time " + state["story"]
    assert state.meta("story")["usage"]["completion_tokens"] == 6


def test_what_the_api_cannot_do_is_a_clear_error(backend: plait.OpenAIBackend) -> None:
    with pytest.raises(plait.ProgramError, match="cannot constrain output to a regex"):
        with_regex.run(backend=backend)

    @plait.program
    def stop_at_digit(s):  # type: ignore[no-untyped-def]
        s += "Count: " + plait.gen("n", max_tokens=8, stop_regex=r"\d")

    with pytest.raises(plait.ProgramError, match="cannot stop at a regex"):
        stop_at_digit.run(backend=backend)

    @plait.program
    def with_lark(s):  # type: ignore[no-untyped-def]
        s += "Code: " + plait.gen("n", max_tokens=8, lark="start: /[0-9]{3}/")

    with pytest.raises(plait.ProgramError, match="cannot constrain output to a Lark grammar"):
        with_lark.run(backend=backend)


def test_streaming_through_openai(backend: plait.OpenAIBackend) -> None:
    state = plain_text.run(backend=backend, stream=True, temperature=0)
    assert "".join(state.text_iter()) == state.text()


def test_to_messages_parses_chatml() -> None:
    text = "<|im_start|>system\nA<|im_end|>\n<|im_start|>user\nB<|im_end|>\n<|im_start|>assistant\n"
    assert to_messages(text) == [
        {"role": "system", "content": "A"},
        {"role": "user", "content": "B"},
    ]
    assert to_messages("no roles here") is None
    with pytest.raises(UnsupportedError):
        to_messages(text + "partial answer")

"""The DSL end to end: every construct, on LocalBackend and on a plait server (HttpBackend)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator

import jsonschema
import pytest
from pydantic import BaseModel, Field

import plait
from helpers import TEST_KV_TOKENS
from plait.clients.base import Backend

DATE = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
    "required": ["name", "n"],
    "additionalProperties": False,
}


class City(BaseModel):
    name: str = Field(max_length=20)
    population: int


@pytest.fixture(scope="module", params=["local", "http"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "local":
        with plait.LocalBackend(kv_tokens=TEST_KV_TOKENS, check_integrity=True) as local:
            yield local
        return
    from plait.clients.http import HttpBackend

    server = request.getfixturevalue("plait_server")  # one server shared by the session
    yield HttpBackend(server.url)


# --- programs ---------------------------------------------------------------------------
@plait.program
def plain(s, topic):  # type: ignore[no-untyped-def]
    s += f"A short note about {topic}: "
    s += plait.gen("note", max_tokens=12, min_tokens=12)


@plait.program
def constrained(s):  # type: ignore[no-untyped-def]
    s += "Date: " + plait.gen("date", regex=DATE, max_tokens=16) + "\n"
    s += "Record: " + plait.gen("record", json_schema=SCHEMA, max_tokens=512) + "\n"
    s += "City: " + plait.gen("city", json_schema=City, max_tokens=512) + "\n"
    s += "Count: " + plait.gen("count", dtype=int) + "\n"
    s += "Color: " + plait.gen("color", choices=["red", "green", "blue"])


@plait.program
def chooser(s, method):  # type: ignore[no-untyped-def]
    s += "The best season is " + plait.select(
        "season", ["spring", "summer", "autumn"], method=method
    )


@plait.program
def chat(s):  # type: ignore[no-untyped-def]
    s += plait.system("Be brief.")
    s += plait.user("Hi!")
    s += plait.assistant(plait.gen("a1", max_tokens=8))
    with s.user():
        s += "And now " + plait.gen("u2", max_tokens=4, min_tokens=1)
    with s.assistant():
        s += plait.gen("a2", max_tokens=8)


@plait.program
def forked(s, n):  # type: ignore[no-untyped-def]
    s += "A long shared introduction that all branches continue from. " * 4
    forks = s.fork(n)
    forks += lambda i: f"Branch {i}: " + plait.gen("idea", max_tokens=6, min_tokens=6)
    forks[0] += " and more " + plait.gen("extra", max_tokens=3, min_tokens=3)
    forks.join()
    s += "Done."


@plait.program
def helper_body(s, word):  # type: ignore[no-untyped-def]
    s += f"[{word}] " + plait.gen("inner", max_tokens=4, min_tokens=4)


@plait.program
def caller(s):  # type: ignore[no-untyped-def]
    s += "Start. "
    helper_body(s, "nested")
    s += " End."


@plait.program
def branching(s):  # type: ignore[no-untyped-def]
    s += "Pick: " + plait.select("pick", ["left", "right"])
    if s["pick"] == "left":  # reading a variable mid-program
        s += " went left " + plait.gen("after", max_tokens=3, min_tokens=3)
    else:
        s += " went right " + plait.gen("after", max_tokens=3, min_tokens=3)


@plait.program
def stopping(s):  # type: ignore[no-untyped-def]
    s += "List: " + plait.gen("items", max_tokens=40, stop=["e"], min_tokens=0)
    s += " Then: " + plait.gen("more", max_tokens=40, stop_regex=r"[aeiou]{2}|\d")


@plait.program
def broken(s):  # type: ignore[no-untyped-def]
    s += "x" + plait.gen("bad", regex="[unclosed", max_tokens=4)


# --- tests --------------------------------------------------------------------------------
def test_plain_gen_text_and_usage(backend: Backend) -> None:
    state = plain.run(topic="owls", backend=backend, temperature=0)
    assert state.text() == "A short note about owls: " + state["note"]
    usage = state.meta("note")["usage"]
    assert usage["completion_tokens"] == 12
    assert state.meta("note")["finish_reason"]["type"] == "length"


def test_constraints_hold(backend: Backend) -> None:
    state = constrained.run(backend=backend, temperature=1.0, seed=5)
    assert re.fullmatch(DATE, state["date"])
    assert state.meta("record")["finish_reason"]["type"] == "stop"
    jsonschema.validate(json.loads(state["record"], strict=False), SCHEMA)
    assert isinstance(state["city"], City)
    assert isinstance(state["count"], int)
    assert state["color"] in ("red", "green", "blue")


@plait.program
def unique_numbers(s):  # type: ignore[no-untyped-def]
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    s += "Numbers: " + plait.gen("nums", json_schema=schema, max_tokens=16)


def test_schema_warnings_reach_the_gen_meta(backend: Backend) -> None:
    state = unique_numbers.run(backend=backend, temperature=0)
    assert state.meta("nums")["warnings"] == [
        "json_schema keyword 'uniqueItems' is not enforced (duplicate items are not rejected) at /"
    ]


@plait.program
def reasoned(s):  # type: ignore[no-untyped-def]
    s += "Q: " + plait.gen(
        "answer", json_schema=SCHEMA, reasoning=True, max_reasoning_tokens=5, max_tokens=64,
        logit_bias={67: 100.0}, temperature=0,  # "a" (67), which JSON cannot start with
    )  # fmt: skip
    s += "\nPlain: " + plait.gen("plain", max_tokens=3)


def test_gen_keeps_its_reasoning_in_its_own_variable(backend: Backend) -> None:
    state = reasoned.run(backend=backend)
    assert state["answer_reasoning"] == "aaaaa"
    assert state.meta("answer")["reasoning"] == "aaaaa"
    jsonschema.validate(json.loads(state["answer"]), SCHEMA)
    assert state.text().startswith("Q: aaaaa</think>" + state["answer"] + "\nPlain: ")
    assert "plain_reasoning" not in state and "reasoning" not in state.meta("plain")


@plait.program
def short_city(s):  # type: ignore[no-untyped-def]
    s += "City: " + plait.gen("city", json_schema=City, max_tokens=24)


def test_typed_gen_closed_at_max_tokens_is_a_value(backend: Backend) -> None:
    """The engine closes the JSON before max_tokens; the closed output parses into the model
    and its meta says so."""
    state = short_city.run(backend=backend, temperature=1.0, seed=5)
    reason = state.meta("city")["finish_reason"]
    assert reason["type"] == "length" and reason["closed"] is True
    assert isinstance(state["city"], City)


METHODS = ["token_length_normalized", "greedy_token", "unconditional_likelihood_normalized"]


@pytest.mark.parametrize("method", METHODS)
def test_select_methods(backend: Backend, method: str) -> None:
    state = chooser.run(method=method, backend=backend)
    assert state["season"] in ("spring", "summer", "autumn")
    meta = state.meta("season")
    assert len(meta["scores"]) == 3
    assert state.text() == "The best season is " + state["season"]


def test_roles_build_messages(backend: Backend) -> None:
    state = chat.run(backend=backend, temperature=0.5, seed=2)
    roles = [m["role"] for m in state.messages()]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert state.messages()[3]["content"] == "And now " + state["u2"]
    assert state.messages()[4]["content"] == state["a2"]
    system = [{"role": "system", "content": "Be brief."}]
    assert state.text().startswith(backend.chat_template.render(system))


def test_fork_shares_the_prefix_and_join_gathers(backend: Backend) -> None:
    state = forked.run(n=3, backend=backend, temperature=0.8, seed=1)
    ideas = state["idea"]
    assert isinstance(ideas, list) and len(ideas) == 3
    assert all(isinstance(i, str) and i for i in ideas)
    assert state["extra"][0] is not None and state["extra"][1:] == [None, None]
    cached = [m["usage"]["cached_tokens"] for m in state.meta("idea")]
    prefix_tokens = state.meta("idea")[0]["usage"]["prompt_tokens"] - 4
    assert all(c >= prefix_tokens - 2 for c in cached), (cached, prefix_tokens)
    assert state.text().endswith("Done.")


@plait.program
def tree(s, seen):  # type: ignore[no-untyped-def]
    s += "Question: how?"
    plans = s.fork(2)
    plans += lambda i: f" Plan {i}:" + plait.gen("plan", max_tokens=3, min_tokens=3)
    groups = [plan.fork(2) for plan in plans]
    for group in groups:
        group += lambda j: f" Step {j}:" + plait.gen("step", max_tokens=2, min_tokens=2)
        group.join()
    seen["inner"] = [plan["step"] for plan in plans]  # read before the outer join has run
    plans.join()
    seen["outer"] = s["step"]  # read right after the join is queued


def test_fork_of_a_fork_joins_and_its_variables_are_readable(backend: Backend) -> None:
    seen: dict[str, list[list[str]]] = {}
    state = tree.run(seen=seen, backend=backend, temperature=0)
    steps = state["step"]
    assert len(steps) == 2 and all(len(group) == 2 for group in steps)
    assert all(isinstance(x, str) and x for group in steps for x in group)
    assert seen == {"inner": steps, "outer": steps}
    assert len(state["plan"]) == 2 and state.text() == "Question: how?"


def test_nested_program_call_and_bind(backend: Backend) -> None:
    state = caller.run(backend=backend, temperature=0)
    assert state.text().startswith("Start. [nested] ") and state.text().endswith(" End.")
    bound = helper_body.bind(word="bound")
    assert bound.run(backend=backend, temperature=0).text().startswith("[bound] ")


def test_reading_a_variable_mid_program(backend: Backend) -> None:
    state = branching.run(backend=backend)
    assert f"went {state['pick']} " in state.text()


def test_stop_string_trims(backend: Backend) -> None:
    state = stopping.run(backend=backend, temperature=1.0, seed=9)
    assert "e" not in state["items"]
    assert re.search(r"[aeiou]{2}|\d", state["more"]) is None
    assert state.meta("more")["finish_reason"]["type"] == "stop"  # the regex ended it
    assert state.text().endswith(" Then: " + state["more"])


def test_errors_name_the_program_line(backend: Backend) -> None:
    with pytest.raises(plait.ProgramError, match=r"test_frontend_programs.py:\d+"):
        broken.run(backend=backend)


def test_streaming_concatenates_to_the_text(backend: Backend) -> None:
    state = plain.run(topic="rivers", backend=backend, stream=True, temperature=0)
    pieces = list(state.text_iter())
    assert "".join(pieces) == state.text()
    var_pieces = list(state.text_iter("note"))
    assert "".join(var_pieces) == state["note"]


def test_async_streaming(backend: Backend) -> None:
    state = plain.run(topic="lakes", backend=backend, stream=True, temperature=0)

    async def collect() -> str:
        return "".join([piece async for piece in state.text_async_iter()])

    assert asyncio.run(collect()) == state.text()


def test_run_batch_caches_the_shared_prefix(backend: Backend) -> None:
    @plait.program
    def shot(s, q):  # type: ignore[no-untyped-def]
        s += "Example questions and answers follow. " * 10
        s += f"Q: {q}\nA: " + plait.gen("a", max_tokens=3, min_tokens=3)

    batch = [{"q": f"question {i}"} for i in range(6)]
    states = shot.run_batch(batch, backend=backend, temperature=0)
    cached = [st.meta("a")["usage"]["cached_tokens"] for st in states]
    assert all(c >= 60 for c in cached), cached
    assert [len(st.variables()) for st in states] == [1] * 6


def test_trace_gives_the_ir() -> None:
    from plait.ir import Gen, Select, Text

    nodes = branching.trace()
    assert isinstance(nodes[0], Text) and nodes[0].value == "Pick: "
    assert isinstance(nodes[1], Select) and nodes[1].choices == ("left", "right")
    nodes = plain.trace(topic="x")
    assert isinstance(nodes[-1], Gen) and nodes[-1].name == "note"


def test_unknown_keyword_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="bogus"):
        plain.run(topic="x", bogus=1)

"""Every example runs on the default model and produces what it promises."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import plait
from helpers import TEST_KV_TOKENS
from plait.runtime import Runtime

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", autouse=True)
def default_backend() -> Iterator[None]:
    """The examples use the default backend; give them one small engine for the module."""
    with plait.LocalBackend(kv_tokens=TEST_KV_TOKENS, check_integrity=True) as backend:
        plait.set_default_backend(backend)
        yield
        plait.set_default_backend(None)


def test_multi_turn_chat() -> None:
    state = load("multi_turn_chat").main()
    roles = [m["role"] for m in state.messages()]
    assert roles == ["system"] + ["user", "assistant"] * 3
    cached = [state.meta(f"answer_{i}")["usage"]["cached_tokens"] for i in range(3)]
    assert cached[1] > 0 and cached[2] > cached[1]  # each turn reuses the conversation so far


def test_parallel_tips() -> None:
    module = load("parallel_tips")
    state = module.main()
    assert isinstance(state["tip"], list) and len(state["tip"]) == len(module.TOPICS)
    for i, topic in enumerate(module.TOPICS):
        assert f"{i + 1}. {topic}: " in state.text()


def test_few_shot() -> None:
    module = load("few_shot")
    states = module.main()
    assert len(states) == len(module.REVIEWS)
    assert {s["label"] for s in states} <= {"positive", "negative", "neutral"}
    prefix_tokens = min(min(s.meta("label")["cached_tokens"]) for s in states)
    assert prefix_tokens > 100  # the five shots were prefilled once and reused


def test_json_extraction() -> None:
    module = load("json_extraction")
    states = module.main()
    assert len(states) == 50
    assert all(isinstance(s["person"], module.Person) for s in states)


def test_agent_react() -> None:
    module = load("agent_react")
    state = module.react.run(question="What is 2 + 2?", temperature=0.9, seed=4)
    steps = [k for k in state.variables() if k.startswith("action_")]
    assert steps, "the agent took no step"
    for key in steps:
        action = state[key]
        assert action in (*module.TOOLS, "finish")
        step = key.split("_")[1]
        if action != "finish":
            assert re.fullmatch(module.TOOLS[action][1], state[f"input_{step}"])
    assert "Final answer: " in state.text()


def test_tool_calling(plait_server: Runtime) -> None:
    messages = load("tool_calling").main(plait_server.url)
    assert [m["role"] for m in messages[:2]] == ["user", "assistant"]
    calls = messages[1]["tool_calls"]
    assert calls and all(c["function"]["name"] == "get_weather" for c in calls)
    assert [m["role"] for m in messages[2:]] == ["tool"] * len(calls) + ["assistant"]
    assert "tool_calls" not in messages[-1]  # tool_choice "none": a plain answer

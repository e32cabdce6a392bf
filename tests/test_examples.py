"""Every example runs and produces what it promises: those that need real answers on
SmolLM2-135M-Instruct (the real-model tier), the others on the default model."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import plait
from helpers import TEST_KV_TOKENS
from plait.backend.engine.engine import Engine
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


@pytest.fixture(scope="module")
def smollm2(smollm2_engine: Engine) -> plait.LocalBackend:
    """The examples that need real answers run on SmolLM2-135M-Instruct."""
    return plait.LocalBackend(engine=smollm2_engine)


@pytest.mark.real_model
def test_multi_turn_chat(smollm2: plait.LocalBackend) -> None:
    state = load("multi_turn_chat").main(smollm2)
    roles = [m["role"] for m in state.messages()]
    assert roles == ["system"] + ["user", "assistant"] * 3
    assert "Paris" in state["answer_0"] and "Louvre" in state["answer_2"]
    cached = [state.meta(f"answer_{i}")["usage"]["cached_tokens"] for i in range(3)]
    assert cached[1] > 0 and cached[2] > cached[1]  # each turn reuses the conversation so far


def test_parallel_tips() -> None:
    module = load("parallel_tips")
    state = module.main()
    assert isinstance(state["tip"], list) and len(state["tip"]) == len(module.TOPICS)
    for i, topic in enumerate(module.TOPICS):
        assert f"{i + 1}. {topic}: " in state.text()


@pytest.mark.real_model
def test_few_shot(smollm2: plait.LocalBackend) -> None:
    module = load("few_shot")
    reviews = module.REVIEWS[:4]
    states = module.main(smollm2, reviews)
    assert [s["label"] for s in states] == [label for _, label in reviews]
    prefix_tokens = min(min(s.meta("label")["cached_tokens"]) for s in states)
    assert prefix_tokens > 50  # the shots were prefilled once and reused


@pytest.mark.real_model
def test_json_extraction(smollm2: plait.LocalBackend) -> None:
    module = load("json_extraction")
    states = module.main(smollm2, n=6)
    assert [s["person"] for s in states] == module.people(6)


@pytest.mark.real_model
def test_agent_react(smollm2: plait.LocalBackend) -> None:
    module = load("agent_react")
    states = module.main(smollm2)
    assert [s["answer"] for s in states] == ["84", "14 million"]
    for state, tool in zip(states, ["calculator", "lookup"], strict=True):
        assert state["action_0"] == tool and state["action_1"] == "finish"
        assert re.fullmatch(module.TOOLS[tool][1], state["input_0"])


def test_tool_calling(plait_server: Runtime) -> None:
    messages = load("tool_calling").main(plait_server.url)
    assert [m["role"] for m in messages[:2]] == ["user", "assistant"]
    calls = messages[1]["tool_calls"]
    assert calls and all(c["function"]["name"] == "get_weather" for c in calls)
    assert [m["role"] for m in messages[2:]] == ["tool"] * len(calls) + ["assistant"]
    assert "tool_calls" not in messages[-1]  # tool_choice "none": a plain answer

"""OpenAI tool calling: plans, prompts, parsing, streaming, and calls made on random weights."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
import xgrammar as xgr
from grammar_cases import LlgStringChecker, validates
from server_helpers import MODEL

from plait.backend.grammar.compiler import build_grammar, grammar_key
from plait.backend.request.sampling_params import SamplingParams
from plait.backend.server.protocol import ApiError, ChatCompletionRequest
from plait.backend.server.tool_calls import (
    BEGIN,
    END,
    ToolCallStream,
    plan_tools,
    split_tool_calls,
    structural_tag,
    template_messages,
)
from plait.runtime import Runtime

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"enum": ["C", "F"]},
    },
    "required": ["city", "unit"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a zone",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}},
                "required": ["zone"],
            },
        },
    },
]
PARAMS = {"get_weather": WEATHER, "get_time": TOOLS[1]["function"]["parameters"]}


def request(**fields: Any) -> ChatCompletionRequest:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}
    return ChatCompletionRequest.model_validate(body)


def test_plans_follow_tool_choice() -> None:
    assert plan_tools(request()) is None
    assert plan_tools(request(tools=TOOLS, tool_choice="none")) is None
    auto = plan_tools(request(tools=TOOLS))
    assert auto is not None and not auto.required and auto.parallel
    assert [f.name for f in auto.functions] == ["get_weather", "get_time"]
    named = {"type": "function", "function": {"name": "get_time"}}
    one = plan_tools(request(tools=TOOLS, tool_choice=named, parallel_tool_calls=False))
    assert one is not None and one.required and not one.parallel
    assert [f.name for f in one.functions] == ["get_time"]
    tag = structural_tag(one)["format"]
    assert tag["type"] == "tags_with_separator" and tag["at_least_one"] and tag["stop_after_first"]
    assert tag["tags"][0]["begin"] == BEGIN + '\n{"name": "get_time", "arguments": '
    free = structural_tag(auto)["format"]
    assert free["type"] == "triggered_tags" and free["triggers"] == [BEGIN]
    assert not free["stop_after_first"] and len(free["tags"]) == 2


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"tools": TOOLS + TOOLS[:1]}, "tools"),
        ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_bad_plans_name_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as info:
        plan_tools(request(**fields))
    assert info.value.param == param


def test_prompt_lists_the_tools_and_rewrites_earlier_calls() -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'},
    }
    req = request(
        tools=TOOLS,
        messages=[
            {"role": "user", "content": "time?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
        ],
    )
    messages, extra = template_messages(req.messages, plan_tools(req), template="plain")
    assert extra == {}
    assert messages[0]["role"] == "system" and "<tools>" in messages[0]["content"]
    assert '"name": "get_time"' in messages[0]["content"]
    assert (
        messages[2]["content"]
        == f'{BEGIN}\n{{"name": "get_time", "arguments": {{"zone": "UTC"}}}}\n{END}'
    )
    assert messages[3] == {"role": "tool", "content": "12:00", "tool_call_id": "c1"}
    llama_like = "{{ tools }} (its own call format)"
    assert template_messages(req.messages, plan_tools(req), template=llama_like)[1] == {}
    qwen_like = "{{ tools }} ... <tool_call> ..."
    native, extra = template_messages(req.messages, plan_tools(req), template=qwen_like)
    assert [t["function"]["name"] for t in extra["tools"]] == ["get_weather", "get_time"]
    assert native[1]["tool_calls"][0]["function"]["arguments"] == {"zone": "UTC"}


def accepts(plan_fields: dict[str, Any], text: str, backend: str = "xgrammar") -> bool:
    """Whether the request's tool constraint, built for `backend`, accepts `text` as a whole
    output."""
    plan = plan_tools(request(tools=TOOLS, **plan_fields))
    assert plan is not None
    params = SamplingParams(structural_tag=json.dumps(structural_tag(plan)))
    built = build_grammar(grammar_key(params, backend=backend))
    if backend == "llguidance":
        checker = LlgStringChecker()
        return checker.accepts(checker.compile(built.data), text)
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)
    compiled = compiler.compile_grammar(xgr.Grammar.deserialize_json(built.data))
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return bool(matcher.accept_string(text)) and bool(matcher.is_terminated())


def call_text(name: str, arguments: str) -> str:
    return f'{BEGIN}\n{{"name": "{name}", "arguments": {arguments}}}\n{END}'


def test_the_constraint_admits_exactly_valid_calls(grammar_backend: str) -> None:
    b = grammar_backend
    paris = call_text("get_weather", '{"city": "Paris", "unit": "C"}')
    tokyo = call_text("get_time", '{"zone": "JST"}')
    assert accepts({}, "Just text.", b)
    assert accepts({}, "Let me look.\n" + paris + " Done.", b)
    assert not accepts({}, "x" + call_text("get_weather", '{"city": "Paris", "unit": "K"}'), b)
    assert not accepts({}, call_text("get_time", '{"zone": "tokyo"}'), b)  # pattern ^[A-Z]{3}$
    assert not accepts({}, call_text("launch", "{}"), b)  # not an offered function
    required = {"tool_choice": "required"}
    assert not accepts(required, "Just text.", b)
    assert accepts(required, paris, b)
    assert accepts(required, paris + "\n" + tokyo, b)
    assert not accepts({**required, "parallel_tool_calls": False}, paris + "\n" + tokyo, b)
    named = {"tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    assert accepts(named, tokyo, b) and not accepts(named, paris, b)


def test_calls_are_split_from_the_content() -> None:
    text = f'Sure. {BEGIN}\n{{"name": "f", "arguments": {{"a": 1}}}}\n{END}{BEGIN}\nnot json\n{END}'
    content, calls = split_tool_calls(text)
    assert content == f"Sure. {BEGIN}\nnot json\n{END}"
    assert [c["function"] for c in calls] == [{"name": "f", "arguments": '{"a": 1}'}]
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert split_tool_calls("") == (None, [])
    assert split_tool_calls(" no calls \n") == (" no calls \n", [])  # left as it is


def test_streaming_holds_back_from_a_possible_call() -> None:
    stream = ToolCallStream()
    assert stream.feed("Hello <tool") == "Hello "
    assert stream.feed("box> and") == "<toolbox> and"
    assert stream.feed(f' {BEGIN}\n{{"name": "f", "arguments": {{}}}}') == " "
    assert stream.feed(f"\n{END} bye") == ""
    rest, calls = stream.finish()
    assert rest == "bye" and [c["function"]["name"] for c in calls] == ["f"]


# --- through the server, on plait-tiny's random weights ------------------------------------
@pytest.fixture(scope="module")
def client(plait_server: Runtime) -> openai.OpenAI:
    return openai.OpenAI(base_url=plait_server.url + "/v1", api_key="unused")


def check_calls(calls: Any) -> list[str]:
    names = []
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        args = json.loads(call.function.arguments)
        assert validates(PARAMS[call.function.name], args), (call.function.name, args)
        names.append(call.function.name)
    return names


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_required_tool_call_is_valid(client: openai.OpenAI, seed: int) -> None:
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        max_tokens=160,
        seed=seed,
        temperature=1.0,
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert check_calls(choice.message.tool_calls)
    assert choice.message.content is None  # calls only


def test_named_tool_and_streaming_agree(client: openai.OpenAI) -> None:
    args: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What time is it in Tokyo?"}],
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        "parallel_tool_calls": False,
        "max_tokens": 160,
        "seed": 5,
        "temperature": 1.0,
    }
    whole = client.chat.completions.create(**args)
    message = whole.choices[0].message
    assert check_calls(message.tool_calls) == ["get_time"]
    chunks = list(client.chat.completions.create(stream=True, **args))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    streamed = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert content.strip() == (message.content or "")
    assert [tc.function.arguments for tc in streamed] == [
        tc.function.arguments for tc in message.tool_calls or []
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_may_answer_or_call_and_history_is_accepted(plait_server: Runtime) -> None:
    messages = [
        {"role": "user", "content": "time in UTC?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
    ]
    for seed in range(3):
        body = {
            "model": MODEL,
            "messages": messages,
            "tools": TOOLS,
            "max_tokens": 64,
            "seed": seed,
        }
        r = httpx.post(plait_server.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        for call in choice["message"].get("tool_calls", []):
            args = json.loads(call["function"]["arguments"])
            assert validates(PARAMS[call["function"]["name"]], args)
        if choice["finish_reason"] == "tool_calls":
            assert choice["message"]["tool_calls"]
    bad = {"model": MODEL, "messages": messages, "tool_choice": "required"}
    r = httpx.post(plait_server.url + "/v1/chat/completions", json=bad, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"

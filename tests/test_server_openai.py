"""The OpenAI-compatible API through the official `openai` client, streaming and not."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import openai
import pytest
from server_helpers import MODEL, completion, sse_events

from plait.runtime import Runtime

GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def client(plait_server: Runtime) -> openai.OpenAI:
    return openai.OpenAI(base_url=plait_server.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_completion_matches_its_stream(client: openai.OpenAI) -> None:
    full = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=12, **GREEDY)
    choice = full.choices[0]
    assert choice.finish_reason == "length"
    assert full.usage.completion_tokens == 12
    assert full.usage.total_tokens == full.usage.prompt_tokens + 12
    stream = client.completions.create(
        model=MODEL, prompt="Once upon", max_tokens=12, stream=True, **GREEDY
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_completion_and_stream_with_usage(client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, **GREEDY)
    assert full.choices[0].message.role == "assistant"
    assert full.usage.completion_tokens == 10
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    # the prompt was just computed: the second request found it in the radix cache
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_n_seed_and_stop(client: openai.OpenAI) -> None:
    args = {"model": MODEL, "prompt": "abc", "max_tokens": 8, "temperature": 1.0}
    first = client.completions.create(n=3, seed=11, **args)
    again = client.completions.create(n=3, seed=11, **args)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    greedy = client.completions.create(model=MODEL, prompt="abc", max_tokens=16, **GREEDY)
    text = greedy.choices[0].text
    stop = text[3:5]
    if stop.strip():
        cut = client.completions.create(
            model=MODEL, prompt="abc", max_tokens=16, stop=[stop], **GREEDY
        )
        assert cut.choices[0].finish_reason == "stop"
        assert cut.choices[0].text == text[: text.find(stop)]
    pattern = re.escape(text[3]) + "."
    regex_cut = client.completions.create(
        model=MODEL,
        prompt="abc",
        max_tokens=16,
        temperature=0,
        extra_body={"ignore_eos": True, "stop_regex": pattern, "no_stop_trim": True},
    )
    end = re.search(pattern, text)
    assert end is not None and regex_cut.choices[0].finish_reason == "stop"
    assert regex_cut.choices[0].text == text[: end.end()]


def test_logit_bias_forces_and_bans_tokens(client: openai.OpenAI, plait_server: Runtime) -> None:
    def native(bias: dict[str, float]) -> dict[str, Any]:
        params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True, "logit_bias": bias}
        body = {"text": "abc", "sampling_params": params}
        return httpx.post(plait_server.url + "/generate", json=body, timeout=60).json()

    forced = native({"300": 100})
    assert forced["output_ids"] == [300] * 6  # +100 wins every greedy step
    first = native({})["output_ids"][0]
    assert native({str(first): -100})["output_ids"][0] != first  # -100 bans it
    args = {"model": MODEL, "prompt": "abc", "max_tokens": 6, **GREEDY}
    out = client.completions.create(logit_bias={"300": 100}, **args)  # type: ignore[arg-type]
    assert out.choices[0].text == forced["text"]


def test_batch_prompts_number_choices_prompt_major(plait_server: Runtime) -> None:
    r = completion(plait_server.url, ["one", "two"], 4, n=2, ignore_eos=True)
    assert r.status_code == 200
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert choices[0]["text"] == choices[1]["text"]  # greedy: both samples of "one"
    assert r.json()["usage"]["completion_tokens"] == 16


def test_logprobs(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model=MODEL, prompt="Hello there", max_tokens=5, logprobs=3, **GREEDY
    )
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 5
    assert all(len(top) >= 1 for top in lp.top_logprobs)
    assert all(v <= 0 for v in lp.token_logprobs)
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
        **GREEDY,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(t.top_logprobs) == 2 for t in content)
    assert content[0].top_logprobs[0].logprob >= content[0].top_logprobs[1].logprob


def test_echo_returns_prompt_logprobs(plait_server: Runtime) -> None:
    r = completion(plait_server.url, "one two three", 2, echo=True, logprobs=1, ignore_eos=True)
    choice = r.json()["choices"][0]
    assert choice["text"].startswith("one two three")
    usage = r.json()["usage"]
    assert len(choice["logprobs"]["tokens"]) == usage["prompt_tokens"] + 2
    assert choice["logprobs"]["token_logprobs"][0] is None


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
    ],
)
def test_response_format_is_constrained_or_clearly_unavailable(
    client: openai.OpenAI, response_format: dict[str, object]
) -> None:
    try:
        out = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "json please"}],
            max_tokens=64,
            response_format=response_format,  # type: ignore[arg-type]
        )
    except openai.BadRequestError as exc:
        assert "constrained decoding is not available" in str(exc)
        return
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(out.choices[0].message.content or ""), dict)


def test_constrained_output_is_closed_at_max_tokens_unless_turned_off(
    plait_server: Runtime,
) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    args: dict[str, Any] = {"response_format": fmt, "temperature": 1.0, "seed": 3}
    closed = completion(plait_server.url, "json:", 12, **args).json()["choices"][0]
    assert closed["finish_reason"] == "length"
    assert isinstance(json.loads(closed["text"], strict=False)["a"], str)
    cut = completion(plait_server.url, "json:", 12, close_on_length=False, **args).json()
    assert cut["choices"][0]["finish_reason"] == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut["choices"][0]["text"], strict=False)


@pytest.mark.parametrize("spelling", ["legacy", "format"])
def test_response_format_structural_tag(plait_server: Runtime, spelling: str) -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["n"],
    }
    if spelling == "legacy":  # "(" is frequent in plait-tiny's output: the trigger fires
        fmt = {
            "structures": [{"begin": "(count ", "schema": schema, "end": ")"}],
            "triggers": ["("],
        }
        pattern = r"\(count (\{.*?\})\)"
    else:  # a single tag and nothing else
        content = {"type": "json_schema", "json_schema": schema}
        fmt = {"format": {"type": "tag", "begin": "<n>", "content": content, "end": "</n>"}}
        pattern = r"<n>(\{.*?\})</n>"
    calls = 0
    for seed in range(1, 6):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "count"}],
            "max_tokens": 96,
            "ignore_eos": True,
            "seed": seed,
            "response_format": {"type": "structural_tag", **fmt},
        }
        r = httpx.post(plait_server.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        text = choice["message"]["content"]
        for call in re.findall(pattern, text, re.S):
            assert 0 <= json.loads(call)["n"] <= 99
            calls += 1
        if spelling == "format":
            assert choice["finish_reason"] == "stop" and re.fullmatch(pattern, text, re.S)
    assert calls >= 2
    bad = {**body, "response_format": {"type": "structural_tag"}}
    r = httpx.post(plait_server.url + "/v1/chat/completions", json=bad, timeout=60)
    assert r.status_code == 400 and "structural_tag" in r.json()["error"]["message"]


DIGITS = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3}


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"guided_choice": ["red", "green"]}, lambda t: t in ("red", "green")),
        ({"guided_regex": "[0-9]{3}-[a-z]{2}"}, lambda t: re.fullmatch("[0-9]{3}-[a-z]{2}", t)),
        (
            {"guided_json": {"type": "object", "properties": {"ok": {"type": "boolean"}}}},
            lambda t: isinstance(json.loads(t), dict),
        ),
        ({"guided_grammar": 'root ::= "yes" | "no"'}, lambda t: t in ("yes", "no")),
        ({"structured_outputs": {"choice": ["up", "down"]}}, lambda t: t in ("up", "down")),
        ({"structured_outputs": {"regex": "[A-Z]{4}"}}, lambda t: re.fullmatch("[A-Z]{4}", t)),
        (
            {"structured_outputs": {"json": json.dumps(DIGITS)}},
            lambda t: len(json.loads(t)) <= 3 and all(0 <= x <= 9 for x in json.loads(t)),
        ),
    ],
)
def test_vllm_constraint_fields(client: openai.OpenAI, extra: dict[str, Any], check: Any) -> None:
    out = client.completions.create(
        model=MODEL, prompt="answer:", max_tokens=48, seed=1, extra_body=extra
    )
    choice = out.choices[0]
    assert choice.finish_reason == "stop", choice
    assert check(choice.text), choice.text


def test_vllm_constraint_field_errors(plait_server: Runtime) -> None:
    both = {"guided_regex": "a", "structured_outputs": {"regex": "b"}}
    r = completion(plait_server.url, "x", 4, **both)
    assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs"
    r = completion(plait_server.url, "x", 4, structured_outputs={"whitespace_pattern": " "})
    assert r.status_code == 400 and "whitespace_pattern" in r.json()["error"]["message"]
    r = completion(plait_server.url, "x", 4, guided_regex="a", guided_choice=["b"])
    assert r.status_code == 400 and "at most one constraint" in r.json()["error"]["message"]
    for twice in (
        {"regex": "a+", "guided_regex": "b+"},
        {"response_format": {"type": "json_object"}, "structured_outputs": {"json_object": True}},
    ):
        r = completion(plait_server.url, "x", 4, **twice)
        assert r.status_code == 400 and "given twice" in r.json()["error"]["message"], twice
    r = completion(plait_server.url, "x", 4, structured_outputs={})
    assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs"


def test_regex_extension_field(plait_server: Runtime) -> None:
    r = completion(plait_server.url, "digits:", 8, regex="[0-9]+")
    if r.status_code == 400:
        assert "not available" in r.json()["error"]["message"]
    else:
        assert r.json()["choices"][0]["text"].isdigit()


def test_raw_sse_format(plait_server: Runtime) -> None:
    body = {"model": MODEL, "prompt": "sse", "max_tokens": 3, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", plait_server.url + "/v1/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = list(r.iter_lines())
    assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]"
    events = sse_events(lines)
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_tokenize_and_detokenize(plait_server: Runtime) -> None:
    url = plait_server.url
    prompt = "The quick brown fox"
    tok = httpx.post(url + "/tokenize", json={"prompt": prompt, "return_token_strs": True}).json()
    usage = completion(url, prompt, 1).json()["usage"]
    assert tok["count"] == len(tok["tokens"]) == usage["prompt_tokens"]
    assert "".join(tok["token_strs"]).endswith("fox") and tok["max_model_len"] > 0
    back = httpx.post(url + "/detokenize", json={"model": MODEL, "tokens": tok["tokens"]}).json()
    assert back["prompt"].endswith(prompt)
    messages = chat_body()["messages"]
    chat = httpx.post(url + "/tokenize", json=chat_body()).json()
    body = {"model": MODEL, "max_tokens": 1, **chat_body()}
    used = httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()["usage"]
    assert chat["count"] == used["prompt_tokens"]  # tools and earlier calls counted alike
    no_prompt = httpx.post(url + "/tokenize", json={**chat_body(), "add_generation_prompt": False})
    assert no_prompt.json()["count"] < chat["count"]
    for path, bad, param in [
        ("/tokenize", {"messages": []}, "messages"),
        ("/tokenize", {"prompt": "a", "messages": messages}, "prompt"),
        ("/tokenize", {"prompt": "a", "model": "other"}, "model"),
        ("/detokenize", {"tokens": [1, -5]}, "tokens"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
    ]:
        r = httpx.post(url + path, json=bad)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, r.text)


def chat_body() -> dict[str, Any]:
    """A conversation with a tool, an earlier call and its result."""
    call = {"name": "clock", "arguments": '{"zone": "UTC"}'}
    tool = {"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}}}
    messages = [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": call}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
    ]
    return {"messages": messages, "tools": [tool]}


def test_streamed_chat_keeps_every_logprob(client: openai.OpenAI) -> None:
    args: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "count"}],
        "max_tokens": 20,
        "temperature": 0,
        "logprobs": True,
        "stop": ["qqqqqqqqqqqq"],  # never matches, but holds text back while streaming
        "extra_body": {"ignore_eos": True},
    }
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(stream=True, **args))
    streamed = [
        t
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content or []
    ]
    assert len(streamed) == len(whole.choices[0].logprobs.content or []) == 20
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"top_k": 2**70}, "top_k"),
        ({"seed": 2**64}, "seed"),
        ({"seed": 2**64 - 1, "n": 2}, "seed"),
        ({"temperature": 1e308}, "temperature"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"n": 0}, "n"),
    ],
)
def test_numbers_out_of_range_are_400s_naming_the_field(
    plait_server: Runtime, extra: dict[str, Any], param: str
) -> None:
    r = completion(plait_server.url, "x", 4, **extra)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert completion(plait_server.url, "x", -1).json()["error"]["param"] == "max_tokens"
    ok = completion(plait_server.url, "x", 4, ignore_eos=True)  # the server is unharmed
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4


def test_max_completion_tokens_is_checked_under_its_own_name(plait_server: Runtime) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": -5}  # fmt: skip
    r = httpx.post(plait_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens"


def test_plait_extension_fields_on_the_openai_endpoints(plait_server: Runtime) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}}
    r = completion(plait_server.url, "JSON:", 3, response_format=fmt, close_on_length=False)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
    r = completion(plait_server.url, "JSON:", 64, response_format=fmt, any_whitespace=True)
    assert r.status_code == 200 and json.loads(r.json()["choices"][0]["text"])["a"] is not None


def test_openai_fields_are_converted_as_openai_servers_do(plait_server: Runtime) -> None:
    r = completion(plait_server.url, "x", 3.0, temperature="0", ignore_eos=1, n=2.0)  # type: ignore[arg-type]
    assert r.status_code == 200, r.text
    assert [c["index"] for c in r.json()["choices"]] == [0, 1]
    assert r.json()["usage"]["completion_tokens"] == 6
    bad = completion(plait_server.url, "x", 3, logit_bias=[[[1], 5]])  # unhashable key
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "logit_bias"


def test_vllm_field_errors_name_the_field_as_sent(plait_server: Runtime) -> None:
    r = completion(plait_server.url, "x", 3, guided_choice="abc")
    assert r.status_code == 400 and r.json()["error"]["param"] == "guided_choice", r.text
    r = completion(plait_server.url, "x", 3, structured_outputs={"choice": []})
    assert r.json()["error"]["param"] == "structured_outputs.choice", r.text
    r = completion(plait_server.url, "JSON:", 8, structured_outputs={"json": {}})
    assert r.status_code == 200, r.text  # the empty schema: any JSON value
    json.loads(r.json()["choices"][0]["text"])


def test_a_chat_prompt_that_fills_the_context_is_a_400(plait_server: Runtime) -> None:
    word = "hello " * 4200  # more tokens than plait-tiny's 4096-token context
    body = {"model": MODEL, "messages": [{"role": "user", "content": word}]}
    r = httpx.post(plait_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text


def test_a_request_picks_its_grammar_backend_and_bad_choices_are_a_400(
    plait_server: Runtime,
) -> None:
    url = plait_server.url + "/v1/completions"
    base = {"model": MODEL, "prompt": "Digits:", "max_tokens": 24, "temperature": 0}
    fmt = {"type": "json_schema", "json_schema": {"name": "d", "schema": DIGITS}}
    for backend in ("xgrammar", "llguidance", "auto"):
        r = httpx.post(url, json={**base, "response_format": fmt, "grammar_backend": backend},
                       timeout=60)  # fmt: skip
        assert r.status_code == 200, r.text
        values = json.loads(r.json()["choices"][0]["text"])
        assert len(values) <= 3 and all(0 <= v <= 9 for v in values)
    lark = {**base, "lark": 'start: "n=" /[0-9]{2}/'}
    r = httpx.post(url, json=lark, timeout=60)
    assert r.status_code == 200 and re.fullmatch("n=[0-9]{2}", r.json()["choices"][0]["text"])
    for bad in ({"grammar_backend": "outlines"}, {**lark, "grammar_backend": "xgrammar"}):
        r = httpx.post(url, json={**base, **bad}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "grammar_backend", r.text

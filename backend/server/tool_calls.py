"""OpenAI tool calling on /v1/chat/completions, in the Hermes format Qwen models use.

The model sees its tools as a system prompt (or through the chat template when the template
renders `tools` itself) and calls one by writing::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Generation is constrained with a structural tag. With `tool_choice` "auto" (the default) text
is free until `<tool_call>`, after which the model must name one of the offered functions and
write arguments valid for its `parameters` schema; "required" or a named function allows
calls only (at least one). `parallel_tool_calls=false` stops after the first call. The calls
are parsed out of the text into `message.tool_calls` with `finish_reason` "tool_calls".
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from plait.backend.server.protocol import ApiError, ChatCompletionRequest, ChatMessage, FunctionDef

BEGIN, END = "<tool_call>", "</tool_call>"
CALL = re.compile(re.escape(BEGIN) + r"\s*(.*?)\s*" + re.escape(END), re.S)
ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class ToolPlan:
    """The functions a request may call and whether it must call one."""

    functions: tuple[FunctionDef, ...]
    required: bool
    parallel: bool


def plan_tools(req: ChatCompletionRequest) -> ToolPlan | None:
    """The request's tool plan; None without tools or with tool_choice "none"."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise ApiError(400, "tool_choice: needs tools", param="tool_choice")
        return None
    if choice == "none":
        return None
    functions = tuple(tool.function for tool in req.tools)
    if len({f.name for f in functions}) != len(functions):
        raise ApiError(400, "tools: function names must be unique", param="tools")
    if req.response_format is not None and req.response_format.type != "text":
        raise ApiError(
            400, "response_format: cannot be combined with tools", param="response_format"
        )
    if choice is None or isinstance(choice, str):
        return ToolPlan(functions, required=choice == "required", parallel=req.parallel_tool_calls)
    named = [f for f in functions if f.name == choice.function.get("name")]
    if not named:
        raise ApiError(
            400, f"tool_choice: no tool named {choice.function.get('name')!r}", param="tool_choice"
        )
    return ToolPlan((named[0],), required=True, parallel=req.parallel_tool_calls)


def structural_tag(plan: ToolPlan) -> dict[str, Any]:
    """The constraint. "auto": free text, and after `<tool_call>` a call of one of the
    functions; "required" / a named function: calls only, one per line, at least one."""
    tags = [
        {
            "type": "tag",
            "begin": f'{BEGIN}\n{{"name": {json.dumps(f.name)}, "arguments": ',
            "content": {"type": "json_schema", "json_schema": f.parameters or ANY_OBJECT},
            "end": "}\n" + END,
        }
        for f in plan.functions
    ]
    fmt: dict[str, Any] = {"tags": tags, "stop_after_first": not plan.parallel}
    if plan.required:
        fmt.update(type="tags_with_separator", separator="\n", at_least_one=True)
    else:
        fmt.update(type="triggered_tags", triggers=[BEGIN])
    return {"type": "structural_tag", "format": fmt}


def system_prompt(functions: tuple[FunctionDef, ...]) -> str:
    """How the model learns its tools when the chat template does not render them."""
    listed = "\n".join(json.dumps(_tool_json(f), ensure_ascii=False) for f in functions)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listed}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        f'{BEGIN}{END} XML tags:\n{BEGIN}\n{{"name": <function-name>, "arguments": '
        f"<args-json-object>}}\n{END}"
    )


def template_messages(
    messages: list[ChatMessage], plan: ToolPlan | None, *, template: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Messages for the chat template and the extra template arguments. A template that
    renders `tools` itself in this format (it mentions `<tool_call>`, as Qwen's do) gets tools
    and earlier calls as data; otherwise the tools become a system prompt and earlier calls are
    written into the assistant text as the model writes them."""
    native = "tools" in template and BEGIN in template
    out = [_message(m, native=native) for m in messages]
    if plan is None:
        return out, {}
    if native:
        return out, {"tools": [_tool_json(f) for f in plan.functions]}
    prompt = system_prompt(plan.functions)
    if out and out[0]["role"] in ("system", "developer"):
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}"}
    else:
        out.insert(0, {"role": "system", "content": prompt})
    return out, {}


def split_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of an output; a call that does not parse stays in the content.
    Without calls the content is the text as it is; with calls, what is left, stripped."""
    calls: list[dict[str, Any]] = []

    def take(m: re.Match[str]) -> str:
        call = _parse_call(m.group(1))
        if call is None:
            return m.group(0)
        calls.append(call)
        return ""

    content = CALL.sub(take, text)
    if calls:
        content = content.strip()
    return content or None, calls


def _parse_call(body: str) -> dict[str, Any] | None:
    try:
        value = json.loads(body, strict=False)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": value["name"], "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _tool_json(f: FunctionDef) -> dict[str, Any]:
    function: dict[str, Any] = {"name": f.name, "parameters": f.parameters or ANY_OBJECT}
    if f.description:
        function["description"] = f.description
    return {"type": "function", "function": function}


def _message(m: ChatMessage, *, native: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.text()}
    if m.role == "tool" and m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if not m.tool_calls:
        return out
    calls = [
        {"name": c.function.name, "arguments": _arguments(c.function.arguments)}
        for c in m.tool_calls
    ]
    if native:
        out["tool_calls"] = [{"type": "function", "function": c} for c in calls]
        return out
    written = "".join(f"\n{BEGIN}\n{json.dumps(c, ensure_ascii=False)}\n{END}" for c in calls)
    out["content"] = (out["content"] + written).lstrip("\n")
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ApiError(
            400, f"messages: tool call arguments are not valid JSON: {exc}", param="messages"
        ) from exc


class ToolCallStream:
    """One streamed choice: content goes out until a tool call may begin (`<tool_call>` or a
    prefix of it at the end); from there text is held, and the end yields the calls."""

    def __init__(self) -> None:
        self.text = ""
        self.sent = 0

    def feed(self, delta: str) -> str:
        """Content that is safe to stream now."""
        self.text += delta
        held = self.text.find(BEGIN, self.sent)
        if held < 0:
            held = len(self.text) - _partial_begin(self.text)
        out = self.text[self.sent : max(held, self.sent)]
        self.sent += len(out)
        return out

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """The remaining content and the calls, once the choice has ended."""
        content, calls = split_tool_calls(self.text[self.sent :])
        self.sent = len(self.text)
        return content or "", calls


def _partial_begin(text: str) -> int:
    """Length of the longest end of `text` that starts `<tool_call>`."""
    for n in range(min(len(BEGIN) - 1, len(text)), 0, -1):
        if BEGIN.startswith(text[-n:]):
            return n
    return 0

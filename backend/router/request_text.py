"""The text a request is routed by: what the worker's prompt will begin with, as a string.

- `/generate`: `text`; or `input_ids`, one character per token id (`chr(id)`), so a prefix
  of ids is a prefix of the string.
- `/v1/completions`: `prompt` (a string, or token ids as above).
- `/v1/chat/completions`: the tools (JSON with sorted keys), then each message as
  `<|role|>` followed by its content (text parts joined, tool calls as JSON) and a newline:
  a canonical rendering that, like the chat template, starts with the system prompt and grows
  by one message per turn.

A batch (a list of prompts) is routed by its first prompt; every prompt is remembered by
the chosen worker's tree. Text and token-id prompts never match each other. Other paths
have no routing text (they go to the least loaded worker).
"""

from __future__ import annotations

import json
from typing import Any

GENERATION_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
MAX_CODE_POINT = 0x10FFFF


def routing_texts(path: str, body: Any) -> list[str]:
    """The prompts of a generation request, as strings (empty when there are none)."""
    if not isinstance(body, dict):
        return []
    if path == "/generate":
        return _prompts(body.get("text")) or _prompts(body.get("input_ids"))
    if path == "/v1/completions":
        return _prompts(body.get("prompt"))
    if path == "/v1/chat/completions":
        messages = body.get("messages")
        return [chat_text(messages, body.get("tools"))] if isinstance(messages, list) else []
    return []


def _prompts(value: Any) -> list[str]:
    """A prompt or a batch of prompts (strings or token ids) -> one string per prompt."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        return []
    if all(isinstance(v, int) for v in value):
        return [ids_text(value)]
    return [p for v in value for p in _prompts(v)[:1]]


def ids_text(ids: list[int]) -> str:
    """Token ids as a string, one character each (ids outside Unicode: their digits)."""
    return "".join(chr(i) if 0 <= i <= MAX_CODE_POINT else f"<{i}>" for i in ids)


def chat_text(messages: list[Any], tools: Any = None) -> str:
    """The canonical string of a chat request (see the module's docstring)."""
    parts = [_json(tools) + "\n"] if tools else []
    for message in messages:
        if not isinstance(message, dict):
            continue
        parts.append(f"<|{message.get('role', '')}|>{_content(message.get('content'))}")
        if message.get("tool_calls"):
            parts.append(_json(message["tool_calls"]))
        parts.append("\n")
    return "".join(parts)


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else _json(content)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)

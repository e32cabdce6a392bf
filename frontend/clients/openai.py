"""`OpenAIBackend`: programs on any OpenAI-compatible server (chat templates server-side).

Role text is kept in the state as ChatML markers and turned back into `messages` for each
request. What the OpenAI API cannot express is refused with a clear error: regex and EBNF
constraints, prompt-token scoring. `select` becomes a JSON-schema enum over the choices,
`json_schema` and `json_object` become `response_format`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from plait.backend.request.sampling_params import OPENAI_STANDARD
from plait.backend.text.reasoning import Split
from plait.chat_template import CHATML, ChatTemplate
from plait.clients.base import Backend, ChoiceLogprobs, GenOutput, OnText, UnsupportedError
from plait.clients.transport import HttpError, LoopClients

TURN = re.compile(r"<\|im_start\|>(system|user|assistant)\n(.*?)(<\|im_end\|>\n|$)", re.S)
UNSUPPORTED = {
    "regex": "constrain output to a regex",
    "ebnf": "constrain output to an EBNF grammar",
    "lark": "constrain output to a Lark grammar",
    "structural_tag": "constrain output to a structural tag",
    "stop_regex": "stop at a regex",
}


class OpenAIBackend(Backend):
    """Chat completions when the program uses roles, completions otherwise."""

    def __init__(
        self, base_url: str, model: str, api_key: str | None = None, *, timeout: float = 600.0
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout
        self._template = ChatTemplate.from_jinja(CHATML)
        self._http = LoopClients(headers=self.headers, timeout=timeout)

    @property
    def chat_template(self) -> ChatTemplate:
        return self._template

    async def generate(
        self, text: str, params: dict[str, Any], *, on_text: OnText | None = None
    ) -> GenOutput:
        body = self._body(text, params)
        path = "/chat/completions" if "messages" in body else "/completions"
        if on_text is not None:
            return await self._stream(path, {**body, "stream": True}, on_text)
        data = await self._http.post(self.base_url + path, body)
        choice = data["choices"][0]
        content = choice["message"]["content"] if "message" in choice else choice["text"]
        meta = _meta(choice, data.get("usage"), warnings=data.get("warnings"))
        reasoning = choice.get("message", {}).get("reasoning_content")
        if reasoning is not None:
            meta["reasoning"] = reasoning
        return GenOutput(content or "", meta)

    async def _stream(self, path: str, body: dict[str, Any], on_text: OnText) -> GenOutput:
        pieces: list[str] = []
        choice: dict[str, Any] = {}
        warnings: list[str] | None = None
        thoughts: list[str] = []
        async for chunk in self._http.events(self.base_url + path, body):
            if not chunk.get("choices"):
                continue
            choice = chunk["choices"][0]
            warnings = chunk.get("warnings", warnings)  # on the chunk that ends the choice
            thoughts.append(choice.get("delta", {}).get("reasoning_content") or "")
            piece = choice.get("delta", {}).get("content") or choice.get("text") or ""
            if piece:
                pieces.append(piece)
                on_text(piece)
        meta = _meta(choice, None, warnings=warnings)
        if any(thoughts):
            meta["reasoning"] = "".join(thoughts)
        return GenOutput("".join(pieces), meta)

    def _body(self, text: str, params: dict[str, Any]) -> dict[str, Any]:
        for key, what in UNSUPPORTED.items():
            if params.get(key) is not None:
                raise UnsupportedError(
                    f"the OpenAI API cannot {what}; use a plait or SGLang server (HttpBackend)"
                )
        body: dict[str, Any] = {"model": self.model}
        body.update({OPENAI_STANDARD[k]: v for k, v in params.items() if k in OPENAI_STANDARD})
        if params.get("json_schema") is not None:
            schema = json.loads(params["json_schema"])
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": schema},
            }
        elif params.get("json_object"):
            body["response_format"] = {"type": "json_object"}
        if params.get("choices"):
            raise UnsupportedError("gen(choices=...) needs a plait server; use plait.select")
        messages = to_messages(text)
        if messages is None:
            body["prompt"] = text
        else:
            body["messages"] = messages
        return body

    def split_reasoning(self, prompt: str, params: dict[str, Any], out: GenOutput) -> Split | None:
        """The server splits it (`reasoning_content`); the text is the content alone."""
        reasoning = out.meta.get("reasoning")
        return None if reasoning is None else Split(reasoning, out.text)

    async def score(
        self, prefix: str, choices: Sequence[str], *, unconditional: bool = False
    ) -> list[ChoiceLogprobs]:
        raise UnsupportedError("the OpenAI chat API does not return prompt-token logprobs")

    async def select(
        self, prefix: str, choices: Sequence[str], *, method: str
    ) -> tuple[int, dict[str, Any]]:
        """Ask for one of `choices` through a JSON-schema enum (no likelihood scores)."""
        schema = {"type": "string", "enum": list(choices)}
        params = {"json_schema": json.dumps(schema), "temperature": 0.0, "max_new_tokens": 64}
        out = await self.generate(prefix, params)
        value = json.loads(out.text)
        if value not in choices:
            raise HttpError(f"server answered {value!r}, not one of {list(choices)}")
        return list(choices).index(value), {
            "method": "json_schema_enum",
            "usage": out.meta["usage"],
        }

    async def cache_prefix(self, text: str) -> dict[str, Any]:
        return {}  # the OpenAI API has no explicit prefix caching; servers cache on their own


def to_messages(text: str) -> list[dict[str, str]] | None:
    """ChatML text -> messages, or None if the text has no roles. The text must end in an
    open assistant turn with nothing generated yet (the API cannot continue a partial one)."""
    turns = list(TURN.finditer(text))
    if not turns:
        return None
    last = turns[-1]
    if last.group(1) != "assistant" or last.group(3) or last.group(2):
        raise UnsupportedError("OpenAIBackend generates only at the start of an assistant turn")
    return [{"role": m.group(1), "content": m.group(2)} for m in turns[:-1]]


def _meta(
    choice: dict[str, Any], usage: dict[str, Any] | None, *, warnings: list[str] | None
) -> dict[str, Any]:
    """A gen's meta from an OpenAI choice; `warnings`: a plait server's (others send none)."""
    reason = choice.get("finish_reason")
    usage = usage or {}
    details = usage.get("prompt_tokens_details") or {}
    return {
        "finish_reason": {"type": reason} if reason else None,
        "usage": {
            "prompt_tokens": usage.get("prompt_tokens", 0),
            "completion_tokens": usage.get("completion_tokens", 0),
            "cached_tokens": details.get("cached_tokens", 0),
        },
        "logprobs": choice.get("logprobs"),
        "warnings": list(warnings or []),
    }

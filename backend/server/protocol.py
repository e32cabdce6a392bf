"""Wire formats of the HTTP server: pydantic request models and the error body.

OpenAI-compatible requests (`CompletionRequest`, `ChatCompletionRequest`) ignore unknown
fields, as OpenAI's own clients send a few more than any server implements; SGLang's native
`GenerateRequest` (`native_protocol`) forbids them. Every validation error becomes HTTP 400
with a message that names the field (`validation_message`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from plait.backend.request.sampling_params import (
    MAX_TOP_LOGPROBS,
    OPENAI_FIELDS,
    VLLM_FIELDS,
    VLLM_GUIDED,
)

OPENAI_NAMES = {name: openai for openai, name in OPENAI_FIELDS.items()}
ErrorKind = Literal["invalid_request_error", "server_error"]
UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


class ApiError(Exception):
    """An HTTP error with an OpenAI-style body; `param` names the offending field."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


class ErrorDetail(BaseModel):
    """What went wrong: `param` names the offending field (null when none is to blame)."""

    message: str
    type: ErrorKind
    param: str | None
    code: int


class ErrorBody(BaseModel):
    """Every error's body, as OpenAI sends it (SGLang's clients read `error.message`)."""

    error: ErrorDetail


def error_body(status: int, message: str, *, param: str | None = None) -> dict[str, Any]:
    """The `ErrorBody` of an error, as JSON-ready data."""
    kind: ErrorKind = "invalid_request_error" if status < 500 else "server_error"
    detail = ErrorDetail(message=message, type=kind, param=param, code=status)
    return ErrorBody(error=detail).model_dump()


class SafeJSONResponse(JSONResponse):
    """JSON that is always valid UTF-8: a lone surrogate a client sent (and that an error
    message quotes back) is written as its JSON escape instead of failing the response."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def validation_message(errors: Sequence[Any]) -> tuple[str, str | None]:
    """(message, field) for the first pydantic error, e.g. "messages.0.role: Input should..."."""
    if not errors:
        return "invalid request", None
    err = errors[0]
    parts = [str(p) for p in err.get("loc", ()) if p != "body" and not _is_union_tag(p)]
    field = ".".join(parts) or "body"
    if err.get("type") == "json_invalid":
        return f"body: malformed JSON ({err.get('ctx', {}).get('error', 'decode error')})", "body"
    return f"{field}: {err.get('msg', 'invalid value')}", field


def _is_union_tag(part: object) -> bool:
    """A union member's tag in an error's location: `list[int]`, `str`, `constrained-int`."""
    if not isinstance(part, str):
        return False
    return "[" in part or part in UNION_TAGS or part.startswith("constrained-")


# --- shared OpenAI request fields ---------------------------------------------------------
class StreamOptions(BaseModel):
    """`stream_options`: with include_usage, a last chunk carries the usage."""

    include_usage: bool = False


class JsonSchemaSpec(BaseModel):
    """`response_format.json_schema`: the schema under `schema`."""

    model_config = ConfigDict(populate_by_name=True)

    name: str = "output"
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """`response_format`: text (no constraint), json_object, json_schema, or structural_tag
    (SGLang's extension: `structures` + `triggers`, or xgrammar's `format`)."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaSpec | None = None
    structures: list[dict[str, Any]] | None = None
    triggers: list[str] | None = None
    format: dict[str, Any] | None = None


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` extra field: one constraint."""

    model_config = ConfigDict(extra="forbid")

    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None
    disable_any_whitespace: bool = False  # plait's JSON is compact unless any_whitespace
    disable_additional_properties: bool = False  # strict mode, plait's default

    def constraints(self) -> dict[str, Any]:
        """The constraints given, by engine field name (an empty schema `{}` is one)."""
        given = self.model_dump(by_alias=True)
        picked = {k: v for k, v in given.items() if k in VLLM_FIELDS and v is not None}
        return {VLLM_FIELDS[k]: v for k, v in picked.items() if v is not False}


class OpenAISampling(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions.

    The engine's sampling fields (OpenAI's plus the usual extensions of open-source servers:
    top_k, min_p, regex, ebnf, ...; `OPENAI_FIELDS`) and vLLM's `guided_*` constraints are
    not declared again here: `sampling()` picks them out by name and `SamplingParams`
    validates them (`OPENAI_NAMES` spells its errors the client's way). Other unknown
    fields are ignored, as OpenAI's own clients send a few more than any server implements.
    """

    model_config = ConfigDict(extra="allow")

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None

    def sampling(self) -> dict[str, Any]:
        """The engine's fields given by their OpenAI names (None values left out)."""
        return self._picked(OPENAI_FIELDS)

    def guided(self) -> dict[str, Any]:
        """vLLM's `guided_*` constraints, by engine field name."""
        return self._picked(VLLM_GUIDED)

    def _picked(self, names: Mapping[str, str]) -> dict[str, Any]:
        extra = self.model_extra or {}
        return {names[k]: v for k, v in extra.items() if k in names and v is not None}


class CompletionRequest(OpenAISampling):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    suffix: str | None = None
    best_of: int | None = None


class TextPart(BaseModel):
    """A text part of a message's content (other part types are rejected)."""

    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    """A call the assistant made: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


class ToolCall(BaseModel):
    """`tool_calls[i]` of an assistant message."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDef(BaseModel):
    """A function the model may call; `parameters` is a JSON Schema of its arguments."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    """`tools[i]`: a function tool."""

    type: Literal["function"]
    function: FunctionDef


class NamedToolChoice(BaseModel):
    """`tool_choice: {"type": "function", "function": {"name": ...}}`."""

    type: Literal["function"]
    function: dict[Literal["name"], str]


class ChatMessage(BaseModel):
    """One message of a chat request."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(OpenAISampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Any = None  # max_tokens' newer name: validated as max_tokens is
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class TokenizeRequest(BaseModel):
    """POST /tokenize (vLLM's): a prompt, or chat messages through the chat template."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ToolDef] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    """POST /detokenize (vLLM's): token ids back to text."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    tokens: list[int]


# --- SGLang's native API (GenerateRequest: native_protocol) ---------------------------
class AbortBody(BaseModel):
    """POST /abort_request."""

    model_config = ConfigDict(strict=True)

    rid: str = ""
    abort_all: bool = False

"""OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions, /v1/models.

Requests map onto SamplingParams (max_tokens -> max_new_tokens, response_format ->
json_schema / json_object, plus the regex/ebnf/top_k/... extensions); `openai_format` maps
results back onto OpenAI's objects. Choices are numbered prompt-major: prompt i, sample j ->
i * n + j.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from plait.backend.request.checks import check_text, prompt_batch
from plait.backend.request.sampling_params import CONSTRAINT_FIELDS, WIRE
from plait.backend.server.openai_format import (
    chat_chunks,
    chat_response,
    completion_chunks,
    completion_response,
)
from plait.backend.server.openapi import errors, json_or_sse
from plait.backend.server.protocol import (
    OPENAI_NAMES,
    ApiError,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    DetokenizeRequest,
    OpenAISampling,
    ResponseFormat,
    TokenizeRequest,
)
from plait.backend.server.serving import (
    Job,
    ServerContext,
    collect,
    make_params,
    open_stream,
    sse,
    warnings_header,
)
from plait.backend.server.tool_calls import (
    ToolPlan,
    plan_tools,
    structural_tag,
    template_messages,
)

DEFAULT_COMPLETION_TOKENS = 16
# the constraint fields response_format sets, as errors name them
FORMAT_NAMES = {
    "json_schema": "response_format.json_schema.schema",
    "json_object": "response_format",
    "structural_tag": "response_format",
}


class OpenAIApi:
    """The OpenAI-compatible handlers, bound to one ServerContext."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx

    def router(self) -> APIRouter:
        router = APIRouter()
        add = router.add_api_route
        generation = {**json_or_sse("the response, or its chunks"), **errors(400, 503)}
        add("/v1/models", self.models, methods=["GET"])
        for path, handler in (("/v1/completions", self.completions),
                              ("/v1/chat/completions", self.chat)):  # fmt: skip
            add(path, handler, methods=["POST"], response_model=None, responses=generation)
        add("/tokenize", self.tokenize, methods=["POST"], responses=errors(400))
        add("/detokenize", self.detokenize, methods=["POST"], responses=errors(400))
        return router

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [model_card(self.ctx)]}

    async def completions(self, body: CompletionRequest, request: Request) -> Any:
        ctx = self.ctx
        jobs = await ctx.offload(completion_jobs, ctx, body)
        if body.stream:
            opened = await open_stream(ctx, request, jobs)
            chunks = completion_chunks(ctx, body, jobs=jobs, opened=opened)
            return sse(chunks, headers=warnings_header(opened.warnings))
        results = await collect(ctx, request, jobs=jobs)
        content = completion_response(ctx, body, jobs=jobs, results=results)
        return JSONResponse(content, headers=warnings_header(content["warnings"]))

    async def chat(self, body: ChatCompletionRequest, request: Request) -> Any:
        ctx = self.ctx
        jobs = await ctx.offload(chat_jobs, ctx, body)
        if body.stream:
            opened = await open_stream(ctx, request, jobs)
            chunks = chat_chunks(ctx, body, jobs=jobs, opened=opened)
            return sse(chunks, headers=warnings_header(opened.warnings))
        results = await collect(ctx, request, jobs=jobs)
        content = chat_response(ctx, body, jobs=jobs, results=results)
        return JSONResponse(content, headers=warnings_header(content["warnings"]))

    async def tokenize(self, body: TokenizeRequest) -> dict[str, Any]:
        return await self.ctx.offload(tokenize, self.ctx, body)

    async def detokenize(self, body: DetokenizeRequest) -> dict[str, Any]:
        return await self.ctx.offload(detokenize, self.ctx, body)


def tokenize(ctx: ServerContext, body: TokenizeRequest) -> dict[str, Any]:
    """Token ids of a prompt (or of chat messages rendered by the template)."""
    ctx.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise ApiError(400, "prompt: give prompt or messages, not both", param="prompt")
    if body.messages is not None:
        functions = tuple(t.function for t in body.tools or ())
        plan = ToolPlan(functions, required=False, parallel=True)
        ids = render_chat(
            ctx, body.messages, plan if body.tools else None,
            add_generation_prompt=body.add_generation_prompt,
        )  # fmt: skip
    else:
        prompt = body.prompt or ""
        check_text(prompt, field="prompt")
        if len(prompt) > ctx.max_prompt_chars:
            raise ApiError(400, "prompt: longer than the model's context can hold", param="prompt")
        ids = [int(t) for t in ctx.engine.tokenizer.encode(
            prompt, add_special_tokens=body.add_special_tokens
        )]  # fmt: skip
    out: dict[str, Any] = {
        "count": len(ids),
        "max_model_len": ctx.engine.info.context_len,
        "tokens": ids,
    }
    if body.return_token_strs:
        out["token_strs"] = ctx.engine.tokenizer.convert_ids_to_tokens(ids)
    return out


def detokenize(ctx: ServerContext, body: DetokenizeRequest) -> dict[str, Any]:
    """The text of token ids."""
    ctx.check_model(body.model)
    ctx.check_ids(body.tokens, field="tokens")
    return {"prompt": str(ctx.engine.tokenizer.decode(body.tokens))}


def model_card(ctx: ServerContext) -> dict[str, Any]:
    info = ctx.engine.info
    return {
        "id": ctx.model_name,
        "object": "model",
        "created": ctx.created,
        "owned_by": "plait",
        "root": info.model,
        "max_model_len": info.context_len,
    }


# --- requests -> jobs ---------------------------------------------------------------------
def sampling_fields(req: OpenAISampling) -> tuple[dict[str, Any], dict[str, str]]:
    """The engine's fields of an OpenAI request (its sampling fields, plus the constraint
    given through response_format or vLLM's fields, each constraint at most once), and how
    the client spelled each one (for error messages)."""
    fields, names = req.sampling(), dict(OPENAI_NAMES)
    vllm, vllm_names = vllm_fields(req)
    names.update(vllm_names)
    formatted = format_fields(req.response_format)
    names.update({field: FORMAT_NAMES[field] for field in formatted})
    for more in (formatted, vllm):
        clash = sorted(k for k in more if fields.get(k) is not None)
        if clash:
            raise ApiError(
                400, f"{clash[0]}: the same constraint is given twice (directly, through "
                "response_format or through vLLM's fields)", param=clash[0],
            )  # fmt: skip
        fields.update(more)
    return fields, names


def vllm_fields(req: OpenAISampling) -> tuple[dict[str, Any], dict[str, str]]:
    """vLLM's constraint fields (`guided_*`, or `structured_outputs`) -> plait's, and the
    name each came under."""
    given = req.guided()
    names = {field: f"guided_{WIRE[field].vllm}" for field in given}
    so = req.structured_outputs
    if so is not None:
        if given:
            raise ApiError(
                400, "structured_outputs: give it or the guided_* fields, not both",
                param="structured_outputs",
            )  # fmt: skip
        given = so.constraints()
        names = {field: f"structured_outputs.{WIRE[field].vllm}" for field in given}
        if not given:
            raise ApiError(
                400, "structured_outputs: needs one of json, regex, choice, grammar, "
                "json_object, structural_tag", param="structured_outputs",
            )  # fmt: skip
    return given, names  # dict schemas and tags become JSON text in SamplingParams


def format_fields(fmt: ResponseFormat | None) -> dict[str, Any]:
    """`response_format` -> the json_object / json_schema / structural_tag constraint."""
    if fmt is None or fmt.type == "text":
        return {}
    if fmt.type == "json_object":
        return {"json_object": True}
    if fmt.type == "structural_tag":
        tag = fmt.model_dump(
            include={"type", "structures", "triggers", "format"}, exclude_none=True
        )
        return {"structural_tag": tag}
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise ApiError(
            400, "response_format.json_schema.schema: required for type json_schema",
            param="response_format.json_schema.schema",
        )  # fmt: skip
    return {"json_schema": json.dumps(fmt.json_schema.schema_)}


def completion_jobs(ctx: ServerContext, req: CompletionRequest) -> list[Job]:
    ctx.check_model(req.model)
    if req.suffix:
        raise ApiError(400, "suffix: not supported by plait", param="suffix")
    fields, names = sampling_fields(req)
    fields.setdefault("max_new_tokens", DEFAULT_COMPLETION_TOKENS)
    if req.logprobs is not None:
        start = 0 if req.echo else -1
        fields.update(return_logprob=True, top_logprobs_num=req.logprobs, logprob_start_len=start)
    params = make_params(fields, names=names, lax=True)
    if req.best_of not in (None, params.n):
        raise ApiError(400, "best_of: only best_of == n is supported", param="best_of")
    jobs = []
    given = prompt_fields(req.prompt)
    prompts = prompt_batch(**given, encode=ctx.encode, max_chars=ctx.max_prompt_chars)
    for ids in prompts.ids:
        if given["input_ids"] is not None:
            ctx.check_ids(ids, field="prompt")
        ctx.check_lengths(
            len(ids), max_new=params.max_new_tokens, prompt_field="prompt", max_field="max_tokens"
        )
        jobs.append(Job(ids, params, names=names))
    return jobs


def prompt_fields(prompt: str | list[str] | list[int] | list[list[int]]) -> dict[str, Any]:
    """OpenAI's `prompt` (text, texts, ids or id lists) as text or input_ids, both named
    "prompt" in errors."""
    textual = isinstance(prompt, str) or any(isinstance(p, str) for p in prompt)
    given = {"text": prompt, "input_ids": None} if textual else {"text": None, "input_ids": prompt}
    return {**given, "text_field": "prompt", "ids_field": "prompt"}


def chat_jobs(ctx: ServerContext, req: ChatCompletionRequest) -> list[Job]:
    ctx.check_model(req.model)
    plan = plan_tools(req)
    if req.top_logprobs and not req.logprobs:
        raise ApiError(400, "top_logprobs: requires logprobs=true", param="top_logprobs")
    ids = render_chat(ctx, req.messages, plan, **template_kwargs(ctx, req))
    fields, names = sampling_fields(req)
    if req.max_completion_tokens is not None:
        fields["max_new_tokens"] = req.max_completion_tokens
        names = {**names, "max_new_tokens": "max_completion_tokens"}
    if plan is not None:
        if any(fields.get(name) not in (None, False) for name in CONSTRAINT_FIELDS):
            raise ApiError(400, "tools: cannot be combined with a constraint", param="tools")
        fields["structural_tag"] = structural_tag(plan)
        names = {**names, "structural_tag": "tools"}
    if req.logprobs:
        fields.update(return_logprob=True, top_logprobs_num=req.top_logprobs or 0)
    params = make_params(fields, names=names, lax=True)
    if "max_new_tokens" not in fields:  # the rest of the context
        room = min(ctx.context_len, ctx.engine.info.kv_tokens) - len(ids)
        if room <= 0:
            raise ApiError(
                400, f"messages: the prompt has {len(ids)} tokens and leaves no room to "
                f"generate (context {ctx.context_len}, KV pool {ctx.engine.info.kv_tokens})",
                param="messages",
            )  # fmt: skip
        params = params.replace(max_new_tokens=room)
    field = names["max_new_tokens"]
    ctx.check_lengths(
        len(ids), max_new=params.max_new_tokens, prompt_field="messages", max_field=field
    )
    return [Job(ids, params, names=names)]


def template_kwargs(ctx: ServerContext, req: ChatCompletionRequest) -> dict[str, Any]:
    """`chat_template_kwargs`; a template of the request's own (`chat_template`) only when
    the server allows it (`--allow-request-chat-template`)."""
    kwargs = dict(req.chat_template_kwargs or {})
    if "chat_template" in kwargs and not ctx.allow_request_chat_template:
        raise ApiError(
            400, "chat_template_kwargs.chat_template: this server does not run chat templates "
            "sent by clients (--allow-request-chat-template)",
            param="chat_template_kwargs.chat_template",
        )  # fmt: skip
    return kwargs


def render_chat(
    ctx: ServerContext,
    messages: list[ChatMessage],
    plan: ToolPlan | None,
    *,
    chat_template: Any = None,
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> list[int]:
    """Token ids of `messages` (and the tools of `plan`) through the model's chat template
    (or the request's `chat_template`: a template, or the name of one of the model's),
    rendered in the bounded sandbox. (Runs on the preparation threads.)"""
    if not messages:
        raise ApiError(400, "messages: must not be empty", param="messages")
    tokenizer = ctx.engine.tokenizer
    model_template = str(getattr(tokenizer, "chat_template", None) or "")
    rendered, extra = template_messages(messages, plan, template=model_template)
    try:
        template = tokenizer.get_chat_template(chat_template, extra.get("tools"))
        text = ctx.renderer.render(
            template, rendered, add_generation_prompt=add_generation_prompt, **{**extra, **kwargs}
        )
    except Exception as exc:  # noqa: BLE001 - template errors are the request's fault
        raise ApiError(400, f"messages: chat template failed: {exc}", param="messages") from exc
    check_text(text, field="messages")
    return list(tokenizer.encode(text, add_special_tokens=False))

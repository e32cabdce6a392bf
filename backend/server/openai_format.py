"""Engine results -> OpenAI response and stream-chunk objects.

Completions and chat completions, with `usage` (cached prompt tokens under
`prompt_tokens_details`), legacy and chat-style logprobs, and SSE chunks (the first chat
chunk of a choice carries the role; with `stream_options.include_usage`, a last chunk with
no choices carries the usage). Choice i is flat sample i (prompt-major).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Sequence
from typing import Any

from plait.backend.server.protocol import ChatCompletionRequest, CompletionRequest, OpenAISampling
from plait.backend.server.serving import (
    Chunks,
    Job,
    OpenStream,
    ServerContext,
    job_of,
    raise_if_error,
    request_warnings,
)
from plait.backend.server.tool_calls import ToolCallStream, plan_tools, split_tool_calls
from plait.backend.text.reasoning import (
    PROMPT_TAIL_TOKENS,
    ReasoningSplitter,
    Split,
    request_format,
    starts_in_reasoning,
)

Token = tuple[float, int]


def finish_name(item: dict[str, Any]) -> str | None:
    reason = item.get("finish_reason")
    return None if reason is None else str(reason["type"])


def usage(jobs: Sequence[Job], results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Prompt tokens once per prompt (cached: what every sample found), completion tokens
    of every sample."""
    prompt = completion = cached = 0
    start = 0
    for job in jobs:
        samples = [r["usage"] for r in results[start : start + job.params.n]]
        start += job.params.n
        prompt += samples[0]["prompt_tokens"]
        cached += min(s["cached_tokens"] for s in samples)
        completion += sum(s["completion_tokens"] for s in samples)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _envelope(req: OpenAISampling, *, kind: str, prefix: str) -> dict[str, Any]:
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": req.model,
    }


# --- completions --------------------------------------------------------------------------
def completion_logprobs(
    ctx: ServerContext, logprobs: dict[str, Any], *, echo: bool, top: int
) -> dict[str, Any]:
    """OpenAI's legacy logprobs object (prompt tokens first with `echo`); `text_offset`
    indexes the choice's text."""
    entries = list(logprobs.get("output") or [])
    tops: list[Any] = list(logprobs.get("output_top") or [None] * len(entries))
    if echo and logprobs.get("input"):
        prompt = list(logprobs["input"])
        entries = prompt + entries
        tops = list(logprobs.get("input_top") or [None] * len(prompt)) + tops
    tokens = [ctx.token_text(tid) for _, tid in entries]
    offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    return {
        "tokens": tokens,
        "token_logprobs": [value for value, _ in entries],
        "top_logprobs": [_top_dict(ctx, t) for t in tops] if top else None,
        "text_offset": offsets,
    }


def _top_dict(ctx: ServerContext, top: list[Token] | None) -> dict[str, float] | None:
    return None if top is None else {ctx.token_text(tid): value for value, tid in top}


def completion_choice(
    ctx: ServerContext, req: CompletionRequest, *, item: dict[str, Any], index: int, prefix: str
) -> dict[str, Any]:
    """One choice (or chunk choice) from a result or an increment; `prefix` is the echo."""
    logprobs = None
    if req.logprobs is not None:
        logprobs = completion_logprobs(ctx, item["logprobs"], echo=req.echo, top=req.logprobs)
    text = prefix + item["text"]
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_name(item)}


def echo_prefix(ctx: ServerContext, req: CompletionRequest, *, job: Job) -> str:
    """The prompt's text when `echo` is set, else nothing."""
    return str(ctx.engine.tokenizer.decode(job.input_ids)) if req.echo else ""


def completion_response(
    ctx: ServerContext, req: CompletionRequest, *, jobs: list[Job], results: list[Any]
) -> dict[str, Any]:
    choices = [
        completion_choice(ctx, req, item=res, index=i, prefix=echo_prefix(ctx, req, job=job))
        for i, (job, res) in enumerate(zip(job_of(jobs), results, strict=True))
    ]
    envelope = _envelope(req, kind="text_completion", prefix="cmpl")
    warnings = request_warnings(results)
    return {**envelope, "choices": choices, "usage": usage(jobs, results), "warnings": warnings}


# --- chat completions ---------------------------------------------------------------------
def chat_logprobs(ctx: ServerContext, logprobs: dict[str, Any], *, top: int) -> dict[str, Any]:
    """OpenAI's chat logprobs object: one entry per output token."""
    entries = logprobs.get("output") or []
    tops = logprobs.get("output_top") or [[] for _ in entries]
    content = []
    for token, alternatives in zip(entries, tops, strict=True):
        entry = _chat_token(ctx, token)
        entry["top_logprobs"] = [_chat_token(ctx, t) for t in alternatives] if top else []
        content.append(entry)
    return {"content": content}


def _chat_token(ctx: ServerContext, token: Token) -> dict[str, Any]:
    value, tid = token
    text = ctx.token_text(tid)
    return {"token": text, "logprob": value, "bytes": list(text.encode())}


def _chat_logprobs_of(
    ctx: ServerContext, req: ChatCompletionRequest, *, item: dict[str, Any]
) -> dict[str, Any] | None:
    if not req.logprobs:
        return None
    return chat_logprobs(ctx, item["logprobs"], top=req.top_logprobs or 0)


def chat_response(
    ctx: ServerContext, req: ChatCompletionRequest, *, jobs: list[Job], results: list[Any]
) -> dict[str, Any]:
    tools = plan_tools(req) is not None
    choices = []
    for index, (job, res) in enumerate(zip(job_of(jobs), results, strict=True)):
        message: dict[str, Any] = {"role": "assistant", "content": res["text"]}
        splitter = reasoning_splitter(ctx, job)
        if splitter is not None:
            split = splitter.split(res["text"])
            message.update(content=split.content, reasoning_content=split.reasoning)
        calls: list[dict[str, Any]] = []
        if tools:
            message["content"], calls = split_tool_calls(message["content"])
            if calls:
                message["tool_calls"] = calls
        choice = {"index": index, "message": message}
        choice["logprobs"] = _chat_logprobs_of(ctx, req, item=res)
        choice["finish_reason"] = _chat_finish(res, calls)
        choices.append(choice)
    envelope = _envelope(req, kind="chat.completion", prefix="chatcmpl")
    warnings = request_warnings(results)
    return {**envelope, "choices": choices, "usage": usage(jobs, results), "warnings": warnings}


def reasoning_splitter(ctx: ServerContext, job: Job) -> ReasoningSplitter | None:
    """How a chat choice's text splits into `reasoning_content` and `content` (None: the
    server has no reasoning parser, or the request turned reasoning off)."""
    fmt = request_format(ctx.engine.config.reasoning_parser, reasoning=job.params.reasoning)
    if fmt is None:
        return None
    prompt = str(ctx.engine.tokenizer.decode(job.input_ids[-PROMPT_TAIL_TOKENS:]))
    return ReasoningSplitter(fmt, in_reasoning=starts_in_reasoning(fmt, prompt))


def _chat_finish(item: dict[str, Any], calls: list[dict[str, Any]]) -> str | None:
    """OpenAI's finish reason: "tool_calls" when a finished choice called tools."""
    name = finish_name(item)
    return "tool_calls" if calls and name == "stop" else name


def _reasoning_delta(splitter: ReasoningSplitter | None, item: dict[str, Any]) -> Split:
    """The increment's reasoning and content (all content without a splitter)."""
    if splitter is None:
        return Split("", item["text"])
    part = splitter.feed(item["text"])
    if item["finish_reason"] is None:
        return part
    rest = splitter.finish()
    return Split(part.reasoning + rest.reasoning, part.content + rest.content)


def _chat_delta(
    stream: ToolCallStream | None, text: str, item: dict[str, Any]
) -> tuple[str, list[dict[str, Any]]]:
    """Content to stream now and, when the choice ends, its tool calls."""
    if stream is None:
        return text, []
    content = stream.feed(text)
    if item["finish_reason"] is None:
        return content, []
    rest, calls = stream.finish()
    return content + rest, calls


# --- streaming ----------------------------------------------------------------------------
class ChunkWriter:
    """One stream's chunk envelope, which choices have started, and their usage; the chunk
    that ends a choice carries the request's `warnings`."""

    def __init__(self, req: OpenAISampling, *, kind: str, prefix: str, warnings: list[str]) -> None:
        self.base = _envelope(req, kind=kind, prefix=prefix)
        self.warnings = warnings
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)
        self.usage: dict[int, dict[str, Any]] = {}
        self.started: set[int] = set()

    def chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        self.started.add(choice["index"])
        out = {**self.base, "choices": [choice]}
        if choice["finish_reason"] is not None:
            out["warnings"] = self.warnings
        return {**out, "usage": None} if self.include_usage else out

    def track(self, index: int, item: dict[str, Any]) -> bool:
        """Record the increment's usage; True if it has nothing to send."""
        if item.get("usage"):
            self.usage[index] = item["usage"]
        return not item["text"] and not item["output_ids"] and item["finish_reason"] is None

    def final(self, jobs: Sequence[Job]) -> dict[str, Any] | None:
        if not self.include_usage:
            return None
        results = [{"usage": self.usage[i]} for i in sorted(self.usage)]
        return {**self.base, "choices": [], "usage": usage(jobs, results)}


async def completion_chunks(
    ctx: ServerContext, req: CompletionRequest, *, jobs: list[Job], opened: OpenStream
) -> Chunks:
    writer = ChunkWriter(req, kind="text_completion", prefix="cmpl", warnings=opened.warnings)
    by_index = job_of(jobs)
    async with contextlib.aclosing(opened.events) as events:
        async for index, item in events:
            raise_if_error(ctx, item)
            first = index not in writer.started
            if writer.track(index, item) and not (first and req.echo):
                continue
            prefix = echo_prefix(ctx, req, job=by_index[index]) if first else ""
            yield writer.chunk(completion_choice(ctx, req, item=item, index=index, prefix=prefix))
    final = writer.final(jobs)
    if final is not None:
        yield final


async def chat_chunks(
    ctx: ServerContext, req: ChatCompletionRequest, *, jobs: list[Job], opened: OpenStream
) -> Chunks:
    kind, warnings = "chat.completion.chunk", opened.warnings
    writer = ChunkWriter(req, kind=kind, prefix="chatcmpl", warnings=warnings)
    by_index = job_of(jobs)
    samples = range(len(by_index))
    streams = {} if plan_tools(req) is None else {i: ToolCallStream() for i in samples}
    splitters = {i: reasoning_splitter(ctx, by_index[i]) for i in samples}
    async with contextlib.aclosing(opened.events) as events:
        async for index, item in events:
            raise_if_error(ctx, item)
            first = index not in writer.started
            if writer.track(index, item) and not first:
                continue
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            part = _reasoning_delta(splitters[index], item)
            if part.reasoning:
                delta["reasoning_content"] = part.reasoning
            delta["content"], calls = _chat_delta(streams.get(index), part.content, item)
            logprobs = _chat_logprobs_of(ctx, req, item=item)
            tokens = bool(logprobs and logprobs["content"])
            said = delta["content"] or part.reasoning or calls
            if not (first or said or item["finish_reason"] or tokens):
                continue  # text held back (a tool call or a marker may be starting)
            if calls:
                delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(calls)]
            choice = {"index": index, "delta": delta, "logprobs": logprobs}
            yield writer.chunk({**choice, "finish_reason": _chat_finish(item, calls)})
    final = writer.final(jobs)
    if final is not None:
        yield final

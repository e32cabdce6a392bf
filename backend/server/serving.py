"""Glue between HTTP handlers and the Engine, shared by the OpenAI and the native API.

A handler turns its request into `Job`s (token ids + SamplingParams), then either collects
every sample's final result (`collect`, which aborts everything if the client goes away)
or iterates increments (`open_stream`, which peeks at the first event so that a request the
engine rejects still gets an HTTP error instead of a 200 stream). Engine errors map onto
HTTP statuses in one place (`error_status`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

from plait.backend.engine import Engine
from plait.backend.req import INTERNAL_ERROR
from plait.backend.request_checks import check_lengths, check_token_ids
from plait.backend.sampling_params import SamplingParams
from plait.backend.server.auth import caller_of
from plait.backend.server.chat_render import ChatRenderer
from plait.backend.server.metrics import ServerMetrics
from plait.backend.server.protocol import ApiError, error_body

T = TypeVar("T")
LEADING_FIELD = re.compile(r"^(?:sampling_params\.)?([A-Za-z_][\w.]*(?:\[\d+\])?): ")
PREP_THREADS = 4
Event = tuple[int, dict[str, Any]]
Events = AsyncGenerator[Event, None]
Chunks = AsyncGenerator[dict[str, Any], None]


@dataclass(frozen=True)
class Job:
    """One prompt of a request: its token ids, params and (optional) request id."""

    input_ids: list[int]
    params: SamplingParams
    rid: str | None = None


@dataclass
class ServerContext:
    """What every handler needs: the engine, the served model name, metrics, the chat
    template renderer, and the thread pool that tokenizes and renders off the event loop."""

    engine: Engine
    model_name: str
    renderer: ChatRenderer
    allow_request_chat_template: bool = False
    health_stall_s: float = 30.0
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    created: int = field(default_factory=lambda: int(time.time()))
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(PREP_THREADS, thread_name_prefix="plait-prep")
    )

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the preparation threads (tokenization, chat templates), so the
        event loop (and /health) never waits on it."""
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, functools.partial(fn, *args)
        )

    @property
    def context_len(self) -> int:
        return self.engine.info.context_len

    def known_model(self, name: str) -> bool:
        info = self.engine.info
        return name in (self.model_name, info.model, info.model_path, "default")

    def encode(self, text: str) -> list[int]:
        return self.engine.tokenizer_manager.encode(text)

    @property
    def max_prompt_chars(self) -> int:
        return self.engine.max_prompt_chars

    def check_ids(self, ids: Sequence[int], *, field: str) -> None:
        """A RequestError naming `field` unless every id is in the model's vocabulary."""
        check_token_ids(ids, vocab_size=self.engine.info.vocab_size, field=field)

    def check_lengths(
        self, prompt_len: int, *, max_new: int, prompt_field: str, max_field: str
    ) -> None:
        """A RequestError (HTTP 400 naming the field) unless the request fits the model's
        context and the KV pool."""
        check_lengths(
            prompt_len=prompt_len,
            max_new_tokens=max_new,
            context_len=self.context_len,
            pool_size=self.engine.info.kv_tokens,
            prompt_field=prompt_field,
            max_field=max_field,
        )

    def token_text(self, token_id: int) -> str:
        return str(self.engine.tokenizer.decode([token_id]))


def job_of(jobs: Sequence[Job]) -> list[Job]:
    """The job of each flat sample index (sample j of job i follows all samples of 0..i-1)."""
    return [job for job in jobs for _ in range(job.params.n)]


# --- request checks -------------------------------------------------------------------
def make_params(
    fields: Mapping[str, Any], *, names: Mapping[str, str] | None = None, lax: bool = False
) -> SamplingParams:
    """SamplingParams from engine-named fields (None values dropped); an invalid one raises
    a SamplingError, an HTTP 400 naming the field as the client spelled it (`names`: engine
    name -> its name). `lax`: scalars converted as OpenAI-compatible servers do."""
    given = {k: v for k, v in fields.items() if v is not None}
    return SamplingParams.from_dict(given, names=names, lax=lax)


def field_named(message: str) -> str | None:
    """The field an error message names (for the error's `param`): the `field:` it starts
    with, as every request check writes it, else the first sampling-parameter name in it."""
    lead = LEADING_FIELD.match(message)
    if lead:
        return lead.group(1)
    fields = SamplingParams.model_fields
    hits = [(m.start(), f) for f in fields if (m := re.search(rf"\b{f}\b", message))]
    return min(hits)[1] if hits else None


def error_status(ctx: ServerContext, message: str) -> int:
    """503 once the runtime is gone or shutting down, 500 for internal errors, else 400."""
    if ctx.engine.failure is not None or ctx.engine.tokenizer_manager.closed is not None:
        return 503
    return 500 if message.startswith(INTERNAL_ERROR) else 400


def raise_if_error(ctx: ServerContext, item: dict[str, Any]) -> None:
    reason = item.get("finish_reason") or {}
    if reason.get("type") == "error":
        message = str(reason.get("message", "request failed"))
        raise ApiError(error_status(ctx, message), message, param=field_named(message))


# --- running jobs -------------------------------------------------------------------------
def _stream(ctx: ServerContext, jobs: Sequence[Job], *, stream: bool, owner: str) -> Events:
    requests = [(job.input_ids, job.params) for job in jobs]
    rids = [job.rid for job in jobs]
    return ctx.engine.stream_batch(requests, rids=rids, stream=stream, owner=owner)


async def collect(ctx: ServerContext, request: Request, *, jobs: Sequence[Job]) -> list[Any]:
    """Final result of every sample (flat, job-major); 499 if the client disconnects."""
    results: list[Any] = [None] * sum(job.params.n for job in jobs)
    owner = caller_of(request).identity

    async def run() -> None:
        async with contextlib.aclosing(_stream(ctx, jobs, stream=False, owner=owner)) as events:
            async for index, item in events:
                raise_if_error(ctx, item)
                results[index] = item

    task = asyncio.ensure_future(_submitting(run))
    gone = asyncio.ensure_future(wait_disconnect(request))
    await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    gone.cancel()
    if not task.done():
        task.cancel()
        raise ApiError(499, "client disconnected")
    task.result()
    return results


async def _submitting(run: Callable[[], Any]) -> None:
    """Run `run()`, turning a refused submission (duplicate rid, ...) into HTTP 400."""
    try:
        await run()
    except ValueError as exc:
        raise ApiError(400, str(exc), param=field_named(str(exc))) from exc


async def wait_disconnect(request: Request) -> None:
    """Return once the client has closed the connection (the body is already read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def open_stream(ctx: ServerContext, request: Request, jobs: Sequence[Job]) -> Events:
    """The increments of `jobs`; raises ApiError before any event if the first one is an
    error. Close it (aclosing) to abort what still runs."""
    events = _stream(ctx, jobs, stream=True, owner=caller_of(request).identity)
    try:
        first = await anext(events)
    except ValueError as exc:
        await events.aclose()
        raise ApiError(400, str(exc)) from exc
    except BaseException:
        await events.aclose()
        raise
    try:
        raise_if_error(ctx, first[1])
    except ApiError:
        await events.aclose()
        raise
    return _chain(first, events)


async def _chain(first: Event, rest: Events) -> Events:
    try:
        yield first
        async for event in rest:
            yield event
    finally:
        await rest.aclose()


# --- server-sent events -------------------------------------------------------------------
def sse(chunks: Chunks) -> StreamingResponse:
    """`data: {json}` per chunk, then `data: [DONE]`; an ApiError mid-stream becomes an
    error event."""

    async def body() -> AsyncIterator[bytes]:
        try:
            async with contextlib.aclosing(chunks) as it:
                async for chunk in it:
                    yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
        except ApiError as exc:
            error = error_body(exc.status, exc.message, param=exc.param)
            yield b"data: " + json.dumps(error).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)

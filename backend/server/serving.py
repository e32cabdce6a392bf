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

from plait.backend.engine.engine import Engine
from plait.backend.request.checks import check_lengths, check_token_ids
from plait.backend.request.req import INTERNAL_ERROR
from plait.backend.request.sampling_params import SamplingParams
from plait.backend.server.auth import caller_of
from plait.backend.server.metrics import ServerMetrics
from plait.backend.server.protocol import ApiError, error_body
from plait.backend.text.chat_template import ChatRenderer

T = TypeVar("T")
LEADING_FIELD = re.compile(r"^(?:sampling_params\.)?([A-Za-z_][\w.]*(?:\[\d+\])?): ")
PREP_THREADS = 4
WARNINGS_HEADER = "X-Plait-Warnings"
WARNINGS_HEADER_CHARS = 4096
Event = tuple[int, dict[str, Any]]
Events = AsyncGenerator[Event, None]
Chunks = AsyncGenerator[dict[str, Any], None]


@dataclass(frozen=True)
class Job:
    """One prompt of a request: its token ids, params, (optional) request id, and how the
    client spelled the engine's fields (errors name the field as the client sent it)."""

    input_ids: list[int]
    params: SamplingParams
    rid: str | None = None
    names: Mapping[str, str] = field(default_factory=dict)  # engine field -> client's name


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

    def check_model(self, model: str | None) -> None:
        """A 400 unless `model` (when given) is the one this server serves."""
        if model is not None and not self.known_model(model):
            message = f"model: unknown model {model!r}; this server serves {self.model_name!r}"
            raise ApiError(400, message, param="model")

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


def raise_if_error(
    ctx: ServerContext, item: dict[str, Any], *, names: Mapping[str, str] | None = None
) -> None:
    """An ApiError if `item` failed, naming the field as `names` spells it."""
    reason = item.get("finish_reason") or {}
    if reason.get("type") == "error":
        message = str(reason.get("message", "request failed"))
        param = field_named(message)
        if param is not None and names and param in names:
            if message.startswith(f"{param}: "):
                message = f"{names[param]}: {message[len(param) + 2 :]}"
            param = names[param]
        raise ApiError(error_status(ctx, message), message, param=param)


# --- warnings -----------------------------------------------------------------------------
def request_warnings(items: Sequence[dict[str, Any] | None]) -> list[str]:
    """The warnings of a request's results (each once, in order): what the grammar layer
    reported about its constraint (`plait.backend.grammar.schema.warnings`)."""
    found = (w for item in items if item is not None for w in item.get("warnings") or ())
    return list(dict.fromkeys(found))


def warnings_header(warnings: Sequence[str]) -> dict[str, str]:
    """`X-Plait-Warnings`: the warnings as a JSON list in ASCII, at most WARNINGS_HEADER_CHARS
    long (the ones left out are counted in a last entry; the body has them all)."""
    if not warnings:
        return {}
    kept = list(warnings)
    while kept:
        more = len(warnings) - len(kept)
        shown = kept + ([f"... {more} more in the response's warnings"] if more else [])
        value = json.dumps(shown)
        if len(value) <= WARNINGS_HEADER_CHARS:
            return {WARNINGS_HEADER: value}
        kept.pop()
    return {WARNINGS_HEADER: json.dumps([f"{len(warnings)} warnings in the response"])}


# --- running jobs -------------------------------------------------------------------------
def _stream(ctx: ServerContext, jobs: Sequence[Job], *, stream: bool, owner: str) -> Events:
    requests = [(job.input_ids, job.params) for job in jobs]
    rids = [job.rid for job in jobs]
    return ctx.engine.stream_batch(requests, rids=rids, stream=stream, owner=owner)


async def collect(ctx: ServerContext, request: Request, *, jobs: Sequence[Job]) -> list[Any]:
    """Final result of every sample (flat, job-major); 499 if the client disconnects."""
    results: list[Any] = [None] * sum(job.params.n for job in jobs)
    owner = caller_of(request).identity
    by_index = job_of(jobs)

    async def run() -> None:
        async with contextlib.aclosing(_stream(ctx, jobs, stream=False, owner=owner)) as events:
            async for index, item in events:
                raise_if_error(ctx, item, names=by_index[index].names)
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


@dataclass(frozen=True)
class OpenStream:
    """A started stream: its events (the first one included) and the request's warnings,
    known from the first event (they come with every request's first output), so that they
    can go into the response's headers."""

    events: Events
    warnings: list[str]


async def open_stream(ctx: ServerContext, request: Request, jobs: Sequence[Job]) -> OpenStream:
    """The increments of `jobs`; raises ApiError before any event if the first one is an
    error. Close the events (aclosing) to abort what still runs."""
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
        raise_if_error(ctx, first[1], names=job_of(jobs)[first[0]].names)
    except ApiError:
        await events.aclose()
        raise
    return OpenStream(_chain(first, events), request_warnings([first[1]]))


async def _chain(first: Event, rest: Events) -> Events:
    try:
        yield first
        async for event in rest:
            yield event
    finally:
        await rest.aclose()


# --- server-sent events -------------------------------------------------------------------
def sse(chunks: Chunks, *, headers: Mapping[str, str] | None = None) -> StreamingResponse:
    """`data: {json}` per chunk, then `data: [DONE]`; an ApiError mid-stream becomes an
    error event. `headers`: more response headers (warnings)."""

    async def body() -> AsyncIterator[bytes]:
        try:
            async with contextlib.aclosing(chunks) as it:
                async for chunk in it:
                    yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
        except ApiError as exc:
            error = error_body(exc.status, exc.message, param=exc.param)
            yield b"data: " + json.dumps(error).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    sent = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})}
    return StreamingResponse(body(), media_type="text/event-stream", headers=sent)

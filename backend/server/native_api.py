"""SGLang's native API, so that programs written for `sgl.RuntimeEndpoint` run unchanged.

/generate takes SGLang's `GenerateReqInput` (text or input_ids, single or batch, a
sampling_params dict or list, return_logprob, logprob_start_len, top_logprobs_num,
return_text_in_logprobs, stream) and answers `{"text", "output_ids", "meta_info"}` (a list
for a batch or n > 1), streaming as SSE with the cumulative text in every event. Logprobs are
`[logprob, token_id, token_text | None]` triples. Also /get_model_info, /get_server_info,
/flush_cache, /abort_request, /health and /health_generate.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from importlib import metadata
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from plait.backend.request.checks import prompt_batch
from plait.backend.scheduler.profiler import ProfileRequest
from plait.backend.server.auth import caller_of
from plait.backend.server.native_protocol import GenerateRequest, ProfileBody
from plait.backend.server.openapi import empty, errors, json_or_sse, optional_json_body, text
from plait.backend.server.protocol import AbortBody, ApiError, error_body
from plait.backend.server.serving import (
    Chunks,
    Events,
    Job,
    ServerContext,
    collect,
    job_of,
    make_params,
    open_stream,
    raise_if_error,
    request_warnings,
    sse,
    warnings_header,
)

HEALTH_TIMEOUT_S = 20.0
MAX_RID_CHARS = 256
# SGLang sampling fields plait accepts only at their "off" value, and ones it ignores.
UNSUPPORTED_FIELDS = ("custom_params",)
IGNORED_FIELDS = ("spaces_between_special_tokens", "stream_interval")


class NativeApi:
    """SGLang-compatible handlers, bound to one ServerContext."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx

    def router(self) -> APIRouter:
        router = APIRouter()

        def add(path: str, handler: Any, *methods: str, **options: Any) -> None:
            for method in methods:  # one route per method: each its own operation id
                router.add_api_route(path, handler, methods=[method], **options)

        generation = {**json_or_sse("a result, or a list of them; or their events"),
                      **errors(400, 503)}  # fmt: skip
        add("/generate", self.generate, "POST", "PUT", response_model=None, responses=generation)
        for path in ("/get_model_info", "/model_info"):  # SGLang's old and new names
            add(path, self.get_model_info, "GET")
        for path in ("/get_server_info", "/server_info"):
            add(path, self.get_server_info, "GET")
        flushed = {**text(200, "flushed"), **text(400, "not flushed: requests are running")}
        plain = {"response_class": PlainTextResponse}
        add("/flush_cache", self.flush_cache, "GET", "POST", responses=flushed, **plain)
        bare = {"response_class": Response}
        add("/abort_request", self.abort_request, "POST", **bare,
            responses={**empty("aborted (or nothing to abort)"), **errors(400, 403)})  # fmt: skip
        health = {**empty("serving"), **errors(503)}
        add("/health", self.health, "GET", responses=health, **bare)
        add("/health_generate", self.health_generate, "GET", responses=health, **bare)
        profile = {**text(200, "done"), **errors(400)}
        add("/start_profile", self.start_profile, "GET", responses=profile, **plain)
        add("/start_profile", self.start_profile, "POST", responses=profile, **plain,
            openapi_extra=optional_json_body(ProfileBody))  # fmt: skip
        add("/stop_profile", self.stop_profile, "GET", "POST", responses=profile, **plain)
        add("/concate_and_append_request", self.concate_and_append, "POST",
            include_in_schema=False)  # answers 501: not part of plait's API  # fmt: skip
        return router

    async def generate(self, body: GenerateRequest, request: Request) -> Any:
        ctx = self.ctx
        jobs, single = await ctx.offload(generate_jobs, ctx, body)
        started, text = time.monotonic(), body.return_text_in_logprobs
        if body.stream:
            opened = await open_stream(ctx, request, jobs)
            chunks = generate_chunks(ctx, jobs=jobs, events=opened.events, text=text, single=single)
            return sse(chunks, headers=warnings_header(opened.warnings))
        results = await collect(ctx, request, jobs=jobs)
        outs = [
            generate_output(ctx, job, result=res, text=text, started=started)
            for job, res in zip(job_of(jobs), results, strict=True)
        ]
        content = outs[0] if single and len(outs) == 1 else outs
        return JSONResponse(content, headers=warnings_header(request_warnings(results)))

    async def get_model_info(self) -> dict[str, Any]:
        """SGLang's fields, plus the chat template so plait's HttpBackend renders roles
        exactly as the model expects, and the reasoning parser its gens split by."""
        info, tok = self.ctx.engine.info, self.ctx.engine.tokenizer
        return {
            "model_path": info.model,
            "tokenizer_path": info.model_path,
            "is_generation": True,
            "served_model_name": self.ctx.model_name,
            "context_length": info.context_len,
            "chat_template": getattr(tok, "chat_template", None),
            "reasoning_parser": self.ctx.engine.config.reasoning_parser,
            "bos_token": tok.bos_token,
            "eos_token": tok.eos_token,
        }

    async def get_server_info(self) -> dict[str, Any]:
        """The engine config and live stats, with SGLang's names: `served_model_name` (SGLang's
        Model Gateway names the model by it) and `model_path` / `tokenizer_path`, the
        directory of the model's files (the gateway loads its tokenizer from there)."""
        engine = self.ctx.engine
        return {
            **dataclasses.asdict(engine.config),
            "model_path": engine.info.model_path,
            "served_model_name": self.ctx.model_name,
            "tokenizer_path": engine.info.model_path,
            "context_length": engine.info.context_len,
            "max_total_num_tokens": engine.info.kv_tokens,
            "stats": dataclasses.asdict(await engine.async_stats()),
            "version": _version(),
        }

    async def flush_cache(self) -> PlainTextResponse:
        if await self.ctx.engine.async_flush_cache():
            return PlainTextResponse("Cache flushed.\n")
        return PlainTextResponse("Cache not flushed: requests are running.\n", status_code=400)

    async def start_profile(self, request: Request) -> PlainTextResponse:
        """Torch-profile the scheduler: optional JSON `{"output_dir", "num_steps"}`."""
        body = await request.body()
        try:
            arg = ProfileRequest.from_dict(json.loads(body) if body.strip() else None)
            message = await self.ctx.engine.async_control("start_profile", arg)
        except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
            raise ApiError(400, f"start_profile: {exc}") from exc
        return PlainTextResponse(f"{message}\n")

    async def stop_profile(self) -> PlainTextResponse:
        """End the recording; answers with the Chrome trace's path."""
        try:
            path = await self.ctx.engine.async_control("stop_profile")
        except ValueError as exc:
            raise ApiError(400, f"stop_profile: {exc}") from exc
        return PlainTextResponse(f"profile written to {path}\n")

    async def abort_request(self, body: AbortBody, request: Request) -> Response:
        """Abort `rid` (and its samples `rid.i`) if the caller started it (an admin: any
        request), or everything with `abort_all` (admins only)."""
        caller = caller_of(request)
        if body.abort_all and not caller.admin:
            raise ApiError(403, "abort_all: needs the admin API key", param="abort_all")
        tm = self.ctx.engine.tokenizer_manager
        for rid in tm.in_flight(owner=None if caller.admin else caller.identity):
            if body.abort_all or rid == body.rid or rid.startswith(f"{body.rid}."):
                tm.abort(rid)
        return Response(status_code=200)

    async def health(self) -> Response:
        """200 while serving; 503 once a child process died, or while the scheduler has not
        reported for `health_stall_s` (it is stuck in a step)."""
        engine = self.ctx.engine
        failure = engine.failure
        silence = engine.scheduler_silence()
        if failure is None and silence > self.ctx.health_stall_s:
            failure = f"the scheduler has not reported for {silence:.0f}s"
        if failure is not None:
            return JSONResponse(error_body(503, failure), status_code=503)
        return Response(status_code=200)

    async def concate_and_append(self) -> JSONResponse:
        """SGLang's KV concatenation for `fork(...).join("concate_and_append")`: not in plait
        (the default join mode, gather_variable, works)."""
        message = "concate_and_append_request is not implemented by plait"
        return JSONResponse(error_body(501, message), status_code=501)

    async def health_generate(self, request: Request) -> Response:
        """Healthy if one token comes back within HEALTH_TIMEOUT_S."""
        probe = Job([0], make_params({"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}))
        try:
            await asyncio.wait_for(collect(self.ctx, request, jobs=[probe]), HEALTH_TIMEOUT_S)
        except (ApiError, TimeoutError) as exc:
            return JSONResponse(error_body(503, f"unhealthy: {exc}"), status_code=503)
        return Response(status_code=200)


def _version() -> str:
    try:
        return metadata.version("plait")
    except metadata.PackageNotFoundError:
        return "unknown"


# --- request -> jobs ----------------------------------------------------------------------
def generate_jobs(ctx: ServerContext, req: GenerateRequest) -> tuple[list[Job], bool]:
    """One Job per prompt; the flag says a single (non-batch) prompt was given. (Tokenizes:
    runs on the preparation threads.)"""
    ctx.check_model(req.model)
    req.check_supported()
    prompts = prompt_batch(
        text=req.text, input_ids=req.input_ids, encode=ctx.encode, max_chars=ctx.max_prompt_chars
    )
    count = len(prompts.ids)
    params = _per_item(req.sampling_params, count=count, name="sampling_params", default={})
    rids = _per_item(req.rid, count=count, name="rid", default=None)
    if any(rid is not None and len(rid) > MAX_RID_CHARS for rid in rids):
        raise ApiError(400, f"rid: at most {MAX_RID_CHARS} characters", param="rid")
    want_logprobs = _per_item(req.return_logprob, count=count, name="return_logprob", default=False)
    starts = _per_item(req.logprob_start_len, count=count, name="logprob_start_len", default=-1)
    tops = _per_item(req.top_logprobs_num, count=count, name="top_logprobs_num", default=0)
    jobs = []
    for i, ids in enumerate(prompts.ids):
        fields = sglang_sampling(params[i] or {})
        if want_logprobs[i]:
            start = starts[i] if starts[i] is not None and starts[i] >= 0 else len(ids) - 1
            fields.update(return_logprob=True, logprob_start_len=start)
            fields.update(top_logprobs_num=tops[i] or 0)
        if req.input_ids is not None:
            ctx.check_ids(ids, field=prompts.field)
        job = Job(ids, make_params(fields), rids[i])
        max_new, max_field = job.params.max_new_tokens, "sampling_params.max_new_tokens"
        ctx.check_lengths(
            len(ids), max_new=max_new, prompt_field=prompts.field, max_field=max_field
        )
        jobs.append(job)
    return jobs, prompts.single


def _per_item(value: Any, *, count: int, name: str, default: Any) -> list[Any]:
    """A per-prompt list from a scalar or a list (which must have one value per prompt)."""
    if isinstance(value, list):
        if len(value) != count:
            raise ApiError(400, f"{name}: expected {count} values, got {len(value)}", param=name)
        return value
    return [default if value is None else value] * count


def sglang_sampling(fields: dict[str, Any]) -> dict[str, Any]:
    """SGLang's sampling_params -> plait's: drop None, ignore or refuse SGLang-only keys."""
    out = {k: v for k, v in fields.items() if v is not None and k not in IGNORED_FIELDS}
    for name in UNSUPPORTED_FIELDS:
        if out.pop(name, None):
            raise ApiError(400, f"sampling_params.{name}: not supported by plait", param=name)
    if "sampling_seed" in out:
        out["seed"] = out.pop("sampling_seed")
    return out


# --- results -> SGLang's output format ----------------------------------------------------
def generate_output(
    ctx: ServerContext, job: Job, *, result: dict[str, Any], text: bool, started: float
) -> dict[str, Any]:
    """SGLang's `{"text", "output_ids", "meta_info"}` for one sample."""
    res = result
    usage = res.get("usage") or {}
    meta: dict[str, Any] = {
        "id": res["rid"],
        "finish_reason": sglang_finish(res["finish_reason"], usage),
        "prompt_tokens": usage.get("prompt_tokens", len(job.input_ids)),
        "completion_tokens": usage.get("completion_tokens", len(res["output_ids"])),
        "cached_tokens": usage.get("cached_tokens", 0),
        "e2e_latency": time.monotonic() - started,
        "warnings": list(res.get("warnings") or ()),
    }
    if job.params.return_logprob:
        top = job.params.top_logprobs_num
        meta.update(sglang_logprobs(ctx, res["logprobs"], top=top, text=text))
    return {"text": res["text"], "output_ids": list(res["output_ids"]), "meta_info": meta}


def sglang_finish(reason: dict[str, Any] | None, usage: dict[str, Any]) -> dict[str, Any] | None:
    if reason is not None and reason["type"] == "length":
        closed = {"closed": True} if reason.get("closed") else {}
        return {"type": "length", "length": usage.get("completion_tokens", 0), **closed}
    return reason


def sglang_logprobs(
    ctx: ServerContext, logprobs: dict[str, Any], *, top: int, text: bool
) -> dict[str, Any]:
    def triple(value: float | None, tid: int) -> list[Any]:
        return [value, tid, ctx.token_text(tid) if text else None]

    def tops(rows: list[Any] | None) -> list[Any]:
        return [None if row is None else [triple(v, t) for v, t in row] for row in rows or []]

    out = {
        "input_token_logprobs": [triple(v, t) for v, t in logprobs.get("input") or []],
        "output_token_logprobs": [triple(v, t) for v, t in logprobs.get("output") or []],
    }
    if top:
        out["input_top_logprobs"] = tops(logprobs.get("input_top"))
        out["output_top_logprobs"] = tops(logprobs.get("output_top"))
    return out


def fold(acc: dict[str, Any] | None, item: dict[str, Any]) -> dict[str, Any]:
    """Accumulate stream increments into a result of the shape of a final result."""
    if acc is None:
        acc = {"rid": item["rid"], "text": "", "output_ids": [], "logprobs": {}}
        acc["logprobs"] = {"output": [], "output_top": [], "input": None, "input_top": None}
    acc["text"] += item["text"]
    acc["output_ids"] += item["output_ids"]
    acc["warnings"] = acc.get("warnings", []) + list(item.get("warnings") or ())
    logprobs, mine = item.get("logprobs") or {}, acc["logprobs"]
    mine["output"] += logprobs.get("output", [])
    mine["output_top"] += logprobs.get("output_top", [])
    if "input" in logprobs:
        mine.update(input=logprobs["input"], input_top=logprobs.get("input_top"))
    acc.update(finish_reason=item["finish_reason"], usage=item["usage"])
    return acc


async def generate_chunks(
    ctx: ServerContext, *, jobs: list[Job], events: Events, text: bool, single: bool
) -> Chunks:
    """One SSE event per increment, each with the cumulative text so far."""
    by_index, started = job_of(jobs), time.monotonic()
    acc: dict[int, dict[str, Any]] = {}
    async with contextlib.aclosing(events):
        async for index, item in events:
            raise_if_error(ctx, item)
            acc[index] = fold(acc.get(index), item)
            if not item["text"] and not item["output_ids"] and item["finish_reason"] is None:
                continue
            out = generate_output(
                ctx, by_index[index], result=acc[index], text=text, started=started
            )
            yield out if single and len(by_index) == 1 else {**out, "index": index}

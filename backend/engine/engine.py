"""`Engine`: the runtime as a Python object — generate, stream, async, flush, shut down.

    with Engine() as engine:                          # plait-tiny, in-process
        out = engine.generate("Hello", {"max_new_tokens": 16, "temperature": 0})
        print(out["text"], out["usage"])

The same TokenizerManager serves the HTTP server; here its messages go to a scheduler
thread in this process, or with `processes=True` to scheduler and detokenizer processes
(the runtime of `plait serve`).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from typing import Any

from plait.backend.config import EngineConfig
from plait.backend.engine.inprocess import InProcessRuntime
from plait.backend.engine.multiprocess import MultiProcessRuntime
from plait.backend.engine.tokenizer_manager import TokenizerManager
from plait.backend.request.checks import RequestError, prompt_batch
from plait.backend.request.messages import ModelInfo, Stats
from plait.backend.request.sampling_params import SamplingParams
from plait.backend.scheduler.profiler import ProfileRequest
from plait.backend.text.tokenizer import max_token_chars

Prompt = str | Sequence[str] | None
InputIds = Sequence[int] | Sequence[Sequence[int]] | None
ParamsLike = SamplingParams | dict[str, Any] | None


class GenerationError(ValueError):
    """A request was rejected or failed (the message names the problem)."""


class Engine:
    """In-process LLM engine: radix-cached, continuously batched, on plait's own model code.

    `model` is a builtin name ("plait-tiny", "plait-small") or a local Hugging Face model
    directory; other keyword arguments are `EngineConfig` fields. With `processes=True` the
    scheduler and the detokenizer run in child processes (as in `plait serve`).
    """

    def __init__(self, model: str | None = None, *, processes: bool = False, **config: Any) -> None:
        if model is not None:
            config["model"] = str(model)
        self.config = EngineConfig.from_kwargs(**config)
        self._tm: TokenizerManager | None = None
        self.runtime: InProcessRuntime | MultiProcessRuntime
        if processes:
            self.runtime = MultiProcessRuntime(
                config=self.config, deliver=self._deliver, on_failure=self._runtime_failed
            )
        else:
            self.runtime = InProcessRuntime(
                config=self.config, deliver=self._deliver, on_failure=self._runtime_failed
            )
        self.tokenizer = self.runtime.tokenizer
        self.info: ModelInfo = self.runtime.info
        self._tm = TokenizerManager(tokenizer=self.tokenizer, send=self.runtime.send)
        # no text longer than this can fit the context, however it tokenizes
        self.max_prompt_chars = self.info.context_len * max_token_chars(self.tokenizer)
        if self.runtime.failure is not None:
            self._runtime_failed(self.runtime.failure)

    @property
    def tokenizer_manager(self) -> TokenizerManager:
        assert self._tm is not None, "engine is shut down"
        return self._tm

    def _deliver(self, msg: object) -> None:
        if self._tm is not None:
            self._tm.handle(msg)

    def _runtime_failed(self, message: str) -> None:
        if self._tm is not None:
            self._tm.fail_all(message, final=True)

    @property
    def failure(self) -> str | None:
        """Why the runtime is gone (a child process died), or None while it serves."""
        return self.runtime.failure

    def scheduler_silence(self) -> float:
        """Seconds since the scheduler loop last reported that it is alive (a heartbeat
        about every second, between steps)."""
        return time.monotonic() - self.tokenizer_manager.last_heartbeat

    # --- generation -------------------------------------------------------------------
    def generate(
        self,
        prompt: Prompt = None,
        sampling_params: ParamsLike | Sequence[ParamsLike] = None,
        *,
        input_ids: InputIds = None,
        stream: bool = False,
    ) -> Any:
        """One prompt -> one result dict (a list if n > 1); a list of prompts -> a flat list.
        With `stream=True`, an iterator of increments for a single prompt."""
        batch, single = self._requests(prompt, input_ids, sampling_params, stream=stream)
        if stream:
            return self._stream(*batch[0])
        sinks: list[queue.Queue[dict[str, Any]]] = []
        for ids, params in batch:
            mine: list[queue.Queue[dict[str, Any]]] = [queue.Queue() for _ in range(params.n)]
            sinks.extend(mine)
            self.tokenizer_manager.submit(
                input_ids=ids, params=params, stream=False, sinks=[q.put for q in mine]
            )
        return _shaped([_checked(q.get()) for q in sinks], single=single)

    def _stream(self, ids: list[int], params: SamplingParams) -> Iterator[dict[str, Any]]:
        sink: queue.Queue[dict[str, Any]] = queue.Queue()
        (rid,) = self.tokenizer_manager.submit(
            input_ids=ids, params=params, stream=True, sinks=[sink.put]
        )
        try:
            while True:
                item = _checked(sink.get())
                yield item
                if item["finish_reason"] is not None:
                    return
        finally:
            self.tokenizer_manager.abort(rid)

    async def async_generate(
        self,
        prompt: Prompt = None,
        sampling_params: ParamsLike | Sequence[ParamsLike] = None,
        *,
        input_ids: InputIds = None,
        stream: bool = False,
    ) -> Any:
        """Like `generate`, awaitable; with `stream=True` returns an async iterator."""
        batch, single = self._requests(prompt, input_ids, sampling_params, stream=stream)
        if stream:
            return self._astream(batch)
        results: dict[int, dict[str, Any]] = {}
        async with contextlib.aclosing(self.stream_batch(batch, stream=False)) as events:
            async for index, item in events:
                results[index] = _checked(item)
        return _shaped([results[i] for i in sorted(results)], single=single)

    async def _astream(
        self, batch: list[tuple[list[int], SamplingParams]]
    ) -> AsyncIterator[dict[str, Any]]:
        async with contextlib.aclosing(self.stream_batch(batch)) as events:
            async for _, item in events:
                yield _checked(item)

    async def stream_batch(
        self,
        requests: Sequence[tuple[list[int], SamplingParams]],
        *,
        rids: Sequence[str | None] | None = None,
        stream: bool = True,
        owner: str | None = None,
    ) -> AsyncGenerator[tuple[int, dict[str, Any]], None]:
        """Every sample of every (input_ids, params) request as (index, item) in arrival order,
        sample j of request i at index sum(n of requests before i) + j: increments with
        `stream=True`, else each sample's final result once. Errors come as items (never
        raised); closing the iterator early aborts the samples still running. `owner`: who
        may abort them (`TokenizerManager.in_flight`)."""
        inbox: asyncio.Queue[tuple[int, dict[str, Any]]] = asyncio.Queue()
        sent: list[str] = []
        running: set[int] = set()
        try:
            for (ids, params), rid in zip(requests, rids or [None] * len(requests), strict=True):
                new = self._submit_indexed(
                    ids, params, inbox=inbox, rid=rid, first=len(sent), stream=stream, owner=owner
                )
                running.update(range(len(sent), len(sent) + len(new)))
                sent.extend(new)
            while running:
                index, item = await inbox.get()
                if item["finish_reason"] is not None:
                    running.discard(index)
                yield index, item
        finally:
            for index in running:
                self.tokenizer_manager.abort(sent[index])

    def _submit_indexed(
        self,
        ids: list[int],
        params: SamplingParams,
        *,
        inbox: asyncio.Queue[tuple[int, dict[str, Any]]],
        rid: str | None,
        first: int,
        stream: bool,
        owner: str | None,
    ) -> list[str]:
        """Submit one request whose sample j reports to `inbox` as index first + j."""
        loop = asyncio.get_running_loop()
        sinks = [_indexed_sink(loop, inbox, index=first + j) for j in range(params.n)]
        return self.tokenizer_manager.submit(
            input_ids=ids, params=params, stream=stream, sinks=sinks, rid=rid, owner=owner
        )

    def _requests(
        self, prompt: Prompt, input_ids: InputIds, sampling_params: Any, *, stream: bool = False
    ) -> tuple[list[tuple[list[int], SamplingParams]], bool]:
        """Normalize inputs to [(ids, params)]; the flag says a single prompt was given. A
        stream takes one prompt with n=1."""
        try:
            prompts = prompt_batch(
                text=prompt, input_ids=input_ids, encode=self.tokenizer_manager.encode,
                text_field="prompt", max_chars=self.max_prompt_chars,
            )  # fmt: skip
        except RequestError as exc:
            raise GenerationError(str(exc)) from exc
        ids_list = prompts.ids
        if isinstance(sampling_params, list):
            if len(sampling_params) != len(ids_list):
                raise GenerationError("sampling_params list must match the number of prompts")
            params = [_as_params(p) for p in sampling_params]
        else:
            params = [_as_params(sampling_params)] * len(ids_list)
        batch = list(zip(ids_list, params, strict=True))
        if stream and (not prompts.single or batch[0][1].n != 1):
            raise GenerationError("stream=True takes one prompt with n=1")
        return batch, prompts.single

    # --- control ----------------------------------------------------------------------
    def flush_cache(self) -> bool:
        """Empty the radix cache (False while requests are running)."""
        return bool(self.tokenizer_manager.control("flush_cache").result(timeout=60))

    def stats(self) -> Stats:
        stats = self.tokenizer_manager.control("stats").result(timeout=60)
        assert isinstance(stats, Stats)
        return stats

    async def async_stats(self) -> Stats:
        stats = await self.async_control("stats")
        assert isinstance(stats, Stats)
        return stats

    async def async_flush_cache(self) -> bool:
        return bool(await self.async_control("flush_cache"))

    def start_profile(self, *, output_dir: str | None = None, num_steps: int | None = None) -> str:
        """Record the scheduler's steps with the torch profiler until `stop_profile()` (or for
        `num_steps` steps); the Chrome trace goes to `output_dir`, a relative path under the
        engine's `profile_dir` (default: that directory itself)."""
        request = ProfileRequest.from_dict({"output_dir": output_dir, "num_steps": num_steps})
        return str(self.tokenizer_manager.control("start_profile", request).result(timeout=60))

    def stop_profile(self) -> str:
        """End the recording; returns the trace file's path."""
        return str(self.tokenizer_manager.control("stop_profile").result(timeout=600))

    async def async_control(self, kind: str, arg: Any = None) -> Any:
        return await asyncio.wrap_future(self.tokenizer_manager.control(kind, arg))

    def shutdown(self) -> None:
        if self._tm is None:
            return
        self.runtime.close()
        self._tm.fail_all("engine shut down")
        self._tm = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _as_params(p: ParamsLike) -> SamplingParams:
    if isinstance(p, SamplingParams):
        return p
    try:
        return SamplingParams.from_dict(p)
    except (TypeError, ValueError) as exc:
        raise GenerationError(str(exc)) from exc


def _checked(result: dict[str, Any]) -> dict[str, Any]:
    reason = result.get("finish_reason")
    if reason and reason.get("type") == "error":
        raise GenerationError(reason.get("message", "request failed"))
    return result


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Any, arg: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(fn, arg)


def _indexed_sink(
    loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue[tuple[int, Any]], *, index: int
) -> Any:
    return lambda d: _call_soon(loop, inbox.put_nowait, (index, d))


def _shaped(results: list[dict[str, Any]], *, single: bool) -> Any:
    """One result for a single prompt with n=1, else the flat list."""
    return results[0] if single and len(results) == 1 else results

"""The client side of the runtime: tokenize, track requests, assemble their results.

Used by the in-process Engine and by the server's main process alike; only `send` (how a
message reaches the scheduler) differs. Results arrive through `handle`, called from whatever
thread receives the detokenizer's output, and are delivered to each request's sink.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from plait.backend.request.messages import (
    AbortRequest,
    BatchStrOut,
    ControlReply,
    ControlRequest,
    Heartbeat,
    ReqStrOut,
    TokenizedRequest,
)
from plait.backend.request.sampling_params import SamplingParams

Sink = Callable[[dict[str, Any]], None]
Observer = Callable[["RequestState", ReqStrOut], None]


@dataclass
class RequestState:
    """Everything received so far for one sequence."""

    rid: str
    stream: bool
    sink: Sink
    owner: str | None = None
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[tuple[float, int]] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs: list[tuple[float | None, int]] | None = None
    input_top_logprobs: list[Any] | None = None
    warnings: list[str] = field(default_factory=list)
    created_at: float = field(default_factory=time.monotonic)

    def update(self, item: ReqStrOut) -> dict[str, Any]:
        """Fold one increment in; returns the increment as a result dict."""
        out = item.out
        self.text += item.text_delta
        self.output_ids.extend(out.new_ids)
        self.output_logprobs.extend(out.output_logprobs)
        self.output_top_logprobs.extend(out.output_top_logprobs)
        if out.input_logprobs is not None:
            self.input_logprobs, self.input_top_logprobs = (
                out.input_logprobs,
                out.input_top_logprobs,
            )
        self.warnings.extend(out.warnings)
        delta: dict[str, Any] = {
            "rid": self.rid,
            "text": item.text_delta,
            "output_ids": list(out.new_ids),
            "finish_reason": out.finish.to_dict() if out.finish else None,
            "usage": _usage(item),
            "logprobs": {
                "output": list(out.output_logprobs),
                "output_top": list(out.output_top_logprobs),
            },
            "warnings": list(out.warnings),
        }
        if out.input_logprobs is not None:
            delta["logprobs"].update(input=out.input_logprobs, input_top=out.input_top_logprobs)
        return delta

    def result(self, item: ReqStrOut) -> dict[str, Any]:
        out = item.out
        return {
            "rid": self.rid,
            "text": self.text,
            "output_ids": list(self.output_ids),
            "finish_reason": out.finish.to_dict() if out.finish else None,
            "usage": _usage(item),
            "logprobs": {
                "output": self.output_logprobs,
                "output_top": self.output_top_logprobs,
                "input": self.input_logprobs,
                "input_top": self.input_top_logprobs,
            },
            "warnings": self.warnings,
        }


def _usage(item: ReqStrOut) -> dict[str, int]:
    """Token counts; with speculative decoding, the draft tokens verified and accepted."""
    out = item.out
    usage = {
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": out.completion_tokens,
        "cached_tokens": out.cached_tokens,
    }
    if out.speculation is not None:
        usage["spec_draft_tokens"], usage["spec_accepted_tokens"] = out.speculation
    return usage


class TokenizerManager:
    """Tokenizes requests, sends them on, and routes results back to their sinks."""

    def __init__(
        self,
        *,
        tokenizer: PreTrainedTokenizerBase,
        send: Callable[[object], None],
        observer: Observer | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.send = send
        self.observer = observer  # sees every increment (server metrics), receiving thread
        self.states: dict[str, RequestState] = {}
        self.calls: dict[str, Future[Any]] = {}
        self.closed: str | None = None  # set once the runtime is gone for good
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:12]  # control call ids: this prefix and a counter
        self.last_heartbeat = time.monotonic()  # when the scheduler last said it is alive

    # --- tokenization -----------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of a prompt text; a text that already starts with the BOS token (a
        rendered chat template's) gets no second one from the tokenizer."""
        ids = list(self.tokenizer.encode(text, add_special_tokens=True))
        bos = self.tokenizer.bos_token_id
        if bos is not None and ids[:2] == [bos, bos]:
            added = len(ids) - len(self.tokenizer.encode(text, add_special_tokens=False))
            return ids[1:] if added > 0 else ids
        return ids

    # --- requests ---------------------------------------------------------------------
    def new_rid(self) -> str:
        """A fresh request id: random, so no client can guess another's."""
        return uuid.uuid4().hex

    def submit(
        self,
        *,
        input_ids: list[int],
        params: SamplingParams,
        sinks: Sequence[Sink],
        stream: bool,
        rid: str | None = None,
        owner: str | None = None,
    ) -> list[str]:
        """Send one request; n > 1 becomes n sequences sharing the prompt, the i-th sample
        delivered to `sinks[i]` (seeded with seed + i). Returns the sequences' rids. `owner`
        is who may abort them (see `in_flight`)."""
        if len(sinks) != params.n:
            raise ValueError(f"need one sink per sample: n={params.n}, got {len(sinks)}")
        rid = rid or self.new_rid()
        if params.n == 1:
            return [self._send_one(rid, input_ids, params, sinks[0], stream, None, owner)]
        rids = []
        for i, sink in enumerate(sinks):
            seed = None if params.seed is None else params.seed + i
            one = params.replace(n=1, seed=seed)
            rids.append(self._send_one(f"{rid}.{i}", input_ids, one, sink, stream, rid, owner))
        return rids

    def _send_one(
        self,
        rid: str,
        ids: list[int],
        params: SamplingParams,
        sink: Sink,
        stream: bool,
        group: str | None,
        owner: str | None,
    ) -> str:
        with self._lock:
            if rid in self.states:
                raise ValueError(f"request id {rid!r} is already in flight")
            closed = self.closed
            if closed is None:
                self.states[rid] = RequestState(rid=rid, stream=stream, sink=sink, owner=owner)
        if closed is not None:
            sink(_error_result(rid, closed))
            return rid
        try:
            self.send(TokenizedRequest(rid=rid, input_ids=ids, params=params, group=group))
        except BaseException:  # never sent: it must not stay in flight
            with self._lock:
                self.states.pop(rid, None)
            raise
        return rid

    def abort(self, rid: str) -> None:
        if rid in self.states:
            self.send(AbortRequest(rid))

    def in_flight(self, owner: str | None = None) -> list[str]:
        """Ids of the sequences still running (only `owner`'s, if given)."""
        with self._lock:
            return [r for r, s in self.states.items() if owner is None or s.owner == owner]

    def control(self, kind: str, arg: Any = None) -> Future[Any]:
        call_id = f"{self._prefix}-call-{next(self._ids)}"
        fut: Future[Any] = Future()
        with self._lock:
            closed = self.closed
            if closed is None:
                self.calls[call_id] = fut
        if closed is not None:
            fut.set_exception(RuntimeError(closed))
            return fut
        self.send(ControlRequest(call_id, kind, arg))
        return fut

    # --- results ----------------------------------------------------------------------
    def handle(self, msg: object) -> None:
        """Deliver a BatchStrOut, ControlReply or Heartbeat (called on the receiving
        thread)."""
        if isinstance(msg, Heartbeat):
            self.last_heartbeat = time.monotonic()
            return
        if isinstance(msg, ControlReply):
            with self._lock:
                fut = self.calls.pop(msg.call_id, None)
            if fut is None:
                return
            if isinstance(msg.value, Exception):
                fut.set_exception(msg.value)
            else:
                fut.set_result(msg.value)
            return
        assert isinstance(msg, BatchStrOut), type(msg)
        for item in msg.outputs:
            self._deliver(item)

    def _deliver(self, item: ReqStrOut) -> None:
        state = self.states.get(item.out.rid)
        if state is None:
            return
        delta = state.update(item)
        if self.observer is not None:
            self.observer(state, item)
        done = item.out.finish is not None
        if done:
            with self._lock:
                self.states.pop(item.out.rid, None)
        if state.stream:
            state.sink(delta)
        elif done:
            state.sink(state.result(item))

    def fail_all(self, message: str, *, final: bool = False) -> None:
        """The runtime died: end every request in flight with an error (with `final`, also
        every request submitted from now on)."""
        with self._lock:
            if final:
                self.closed = message
            states, self.states = list(self.states.values()), {}
            calls, self.calls = list(self.calls.values()), {}
        for state in states:
            state.sink(_error_result(state.rid, message))
        for fut in calls:
            fut.set_exception(RuntimeError(message))


def _error_result(rid: str, message: str) -> dict[str, Any]:
    return {
        "rid": rid,
        "text": "",
        "output_ids": [],
        "finish_reason": {"type": "error", "message": message},
        "usage": None,
        "logprobs": {},
        "warnings": [],
    }

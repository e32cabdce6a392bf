"""The scheduler's event loop, shared by the in-process thread and the server process.

`recv` hands over incoming messages (blocking only when there is no work), `send` ships what
each step produced. An exception inside a step fails the requests in flight with an error
and resets the cache; the loop itself keeps serving.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any

from transformers import PreTrainedTokenizerBase

from plait.backend.config import EngineConfig
from plait.backend.grammar import make_grammar
from plait.backend.loader import load_tokenizer
from plait.backend.messages import (
    AbortRequest,
    BatchTokenOut,
    ControlReply,
    ControlRequest,
    ModelInfo,
    ReqOutput,
    TokenizedRequest,
)
from plait.backend.model_runner import ModelRunner
from plait.backend.profiler import ProfileRequest, StepProfiler
from plait.backend.scheduler import Scheduler
from plait.backend.tokenizer_utils import make_decoder

log = logging.getLogger("plait.scheduler")
Recv = Callable[[bool], list[object]]
Send = Callable[[object], None]


def build_scheduler(config: EngineConfig) -> tuple[Scheduler, PreTrainedTokenizerBase]:
    """Load the model and tokenizer and assemble a Scheduler (in whichever process owns the
    device)."""
    runner = ModelRunner(config)
    tokenizer = load_tokenizer(runner.model_path)
    scheduler = Scheduler(
        config=config,
        runner=runner,
        decode=make_decoder(tokenizer),
        grammar=make_grammar(config, tokenizer, runner.vocab_size),
    )
    return scheduler, tokenizer


def describe(scheduler: Scheduler) -> ModelInfo:
    """What the scheduler's process loaded, for the tokenizer side."""
    runner = scheduler.runner
    return ModelInfo(
        model=scheduler.config.model,
        model_path=str(runner.model_path),
        context_len=runner.context_len,
        vocab_size=runner.vocab_size,
        kv_tokens=runner.kv_pool.size,
    )


def handle_message(
    scheduler: Scheduler, msg: object, send: Send, profiler: StepProfiler
) -> list[ReqOutput]:
    """Apply one incoming message; control replies are sent at once."""
    if isinstance(msg, TokenizedRequest):
        return scheduler.add_request(msg)
    if isinstance(msg, AbortRequest):
        return scheduler.abort(msg.rid)
    if isinstance(msg, ControlRequest):
        try:
            value = answer_control(scheduler, profiler, msg)
        except (ValueError, RuntimeError, OSError) as exc:
            value = exc
        send(ControlReply(msg.call_id, value))
        return []
    raise TypeError(f"scheduler got an unknown message {type(msg).__name__}")


def answer_control(scheduler: Scheduler, profiler: StepProfiler, msg: ControlRequest) -> Any:
    if msg.kind == "flush_cache":
        return scheduler.flush_cache()
    if msg.kind == "stats":
        return scheduler.stats()
    if msg.kind == "start_profile":
        return profiler.start(msg.arg if msg.arg is not None else ProfileRequest())
    if msg.kind == "stop_profile":
        return profiler.stop()
    raise ValueError(f"unknown control {msg.kind!r}")


def run_loop(
    scheduler: Scheduler, *, recv: Recv, send: Send, should_stop: Callable[[], bool]
) -> None:
    """Serve until `should_stop()`; never dies on a bad request or a failed step."""
    profiler = StepProfiler()
    while not should_stop():
        outputs: list[ReqOutput] = []
        for msg in recv(not scheduler.has_work()):
            try:
                outputs.extend(handle_message(scheduler, msg, send, profiler))
            except Exception:  # noqa: BLE001 - a bad message must not stop the loop
                log.exception("bad message %r", type(msg).__name__)
        try:
            with profiler.region("plait.scheduler_step"):
                outputs.extend(scheduler.step())
        except Exception as exc:  # noqa: BLE001 - fail the batch, keep serving
            log.error("scheduler step failed:\n%s", traceback.format_exc())
            outputs.extend(scheduler.fail_all(f"internal error: {exc!r}"))
        if outputs:
            send(BatchTokenOut(outputs))
        if scheduler.has_work() or outputs:
            profiler.after_step()
    if profiler.active:
        log.warning("profile trace written at shutdown: %s", profiler.stop())

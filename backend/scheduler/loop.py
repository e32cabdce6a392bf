"""The scheduler's event loop, shared by the in-process thread and the server process.

`recv` hands over incoming messages (blocking only when there is no work), `send` ships what
each step produced. A request that fails is answered with an error by the scheduler (it
alone fails); an exception no request can be blamed for fails the requests in flight and
resets the cache; the loop itself keeps serving. Between steps it sends a `Heartbeat` about
once a second, so the main process can tell a scheduler stuck in a step.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from typing import Any

from transformers import PreTrainedTokenizerBase

from plait.backend.config import EngineConfig
from plait.backend.grammar import grammar_on_demand
from plait.backend.model.runner import ModelRunner
from plait.backend.request.messages import (
    AbortRequest,
    BatchTokenOut,
    ControlReply,
    ControlRequest,
    Heartbeat,
    ModelInfo,
    ReqOutput,
    TokenizedRequest,
)
from plait.backend.request.req import INTERNAL_ERROR, FinishReason
from plait.backend.scheduler.output_builder import ended
from plait.backend.scheduler.profiler import ProfileRequest, StepProfiler, profile_root
from plait.backend.scheduler.scheduler import Scheduler
from plait.backend.text.tokenizer import load_tokenizer, make_decoder

HEARTBEAT_S = 1.0

log = logging.getLogger("plait.scheduler")
Recv = Callable[[bool], list[object]]
Send = Callable[[object], None]


def build_scheduler(config: EngineConfig) -> tuple[Scheduler, PreTrainedTokenizerBase]:
    """Load the model and tokenizer and assemble a Scheduler (in whichever process owns the
    device)."""
    runner = ModelRunner(config)
    try:
        tokenizer = load_tokenizer(runner.model_path)
        scheduler = Scheduler(
            config=config,
            runner=runner,
            decode=make_decoder(tokenizer),
            grammar=grammar_on_demand(config, tokenizer, runner.vocab_size),
        )
    except BaseException:
        runner.abort()  # the tensor-parallel ranks it started, if any
        raise
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
    """Apply one incoming message. A request or an abort is always answered (with an error
    output if handling it fails); a control request always gets its reply."""
    if isinstance(msg, TokenizedRequest):
        return scheduler.add_request(msg)
    if isinstance(msg, AbortRequest):
        try:
            return scheduler.abort(msg.rid)
        except Exception as exc:  # noqa: BLE001 - answer it, keep serving
            log.exception("abort of %s failed", msg.rid)
            return [ended(msg.rid, FinishReason("error", message=f"{INTERNAL_ERROR}: {exc!r}"))]
    if isinstance(msg, ControlRequest):
        try:
            value = answer_control(scheduler, profiler, msg)
        except (ValueError, RuntimeError, OSError) as exc:
            value = exc
        except Exception as exc:  # noqa: BLE001 - the caller gets an error it can unpickle
            log.exception("control %s failed", msg.kind)
            value = RuntimeError(f"{INTERNAL_ERROR}: {exc!r}")
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


class Pulse:
    """Sends a `Heartbeat` at most every HEARTBEAT_S (the main process's /health reads it)."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.last = float("-inf")

    def beat(self, scheduler: Scheduler) -> None:
        now = time.monotonic()
        if now - self.last >= HEARTBEAT_S:
            self.last = now
            self.send(Heartbeat(has_work=scheduler.has_work()))


def run_loop(
    scheduler: Scheduler,
    *,
    recv: Recv,
    send: Send,
    should_stop: Callable[[], bool],
) -> None:
    """Serve until `should_stop()`; never dies on a bad request or a failed step."""
    profiler = StepProfiler(profile_root(scheduler.config.profile_dir))
    pulse = Pulse(send)
    while not should_stop():
        pulse.beat(scheduler)
        outputs: list[ReqOutput] = []
        for msg in recv(not scheduler.has_work()):
            try:
                outputs.extend(handle_message(scheduler, msg, send, profiler))
            except Exception:  # noqa: BLE001 - a bad message must not stop the loop
                log.exception("bad message %r", type(msg).__name__)
        outputs.extend(_step(scheduler, profiler))
        if outputs:
            send(BatchTokenOut(outputs))
        if scheduler.has_work() or outputs:
            _after_step(profiler)
    if profiler.active:
        _after_step(profiler, final=True)
    scheduler.close()


def _step(scheduler: Scheduler, profiler: StepProfiler) -> list[ReqOutput]:
    """One step; a failure no request can be blamed for fails the requests in flight."""
    try:
        with profiler.region("plait.scheduler_step"):
            return scheduler.step()
    except Exception as exc:  # noqa: BLE001 - fail the batch, keep serving
        log.error("scheduler step failed:\n%s", traceback.format_exc())
        return scheduler.fail_all(f"{INTERNAL_ERROR}: {exc!r}")


def _after_step(profiler: StepProfiler, *, final: bool = False) -> None:
    """Count a profiled step (or end the recording); a trace that cannot be written is
    logged, never fatal."""
    try:
        if final:
            log.warning("profile trace written at shutdown: %s", profiler.stop())
        else:
            profiler.after_step()
    except Exception:  # noqa: BLE001 - profiling must never stop the scheduler
        log.exception("profiling failed")

"""Typed messages between the tokenizer side, the scheduler and the detokenizer.

All are frozen dataclasses; `encode`/`decode` turn them into bytes for ZMQ (pickle of plain
dataclasses of builtins: every process on both ends is plait itself).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

from plait.backend.request.req import FinishReason
from plait.backend.request.sampling_params import SamplingParams

Logprob = tuple[float, int]


@dataclass(frozen=True)
class TokenizedRequest:
    """A request ready for the scheduler. `group` ties the n samples of one request."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    group: str | None = None


@dataclass(frozen=True)
class AbortRequest:
    rid: str


@dataclass(frozen=True)
class ControlRequest:
    """A question for the scheduler answered by one `ControlReply` with the same `call_id`:
    `kind` is "flush_cache" (value: bool), "stats" (value: Stats), "start_profile" (arg: a
    ProfileRequest; value: a message) or "stop_profile" (value: the trace's path). A refused
    request's value is the exception."""

    call_id: str
    kind: str
    arg: Any = None


@dataclass(frozen=True)
class ControlReply:
    call_id: str
    value: Any


@dataclass(frozen=True)
class Heartbeat:
    """The scheduler loop is alive (sent about once a second, between steps)."""

    has_work: bool = False


@dataclass(frozen=True)
class ReqOutput:
    """What one request produced in one step (ids since the previous emission; emitted ids
    never change)."""

    rid: str
    new_ids: list[int]
    finish: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    output_logprobs: list[Logprob] = field(default_factory=list)
    output_top_logprobs: list[list[Logprob]] = field(default_factory=list)
    input_logprobs: list[tuple[float | None, int]] | None = None
    input_top_logprobs: list[list[Logprob] | None] | None = None
    warnings: tuple[str, ...] = ()
    detok_options: DetokOptions | None = None  # sent with a request's first output only
    speculation: tuple[int, int] | None = None  # draft tokens verified, accepted (if any)


@dataclass(frozen=True)
class DetokOptions:
    """How to turn a request's ids into text: `hold_chars` is how many final characters
    to keep unsent while it runs (a stop string or regex match may begin in them)."""

    skip_special_tokens: bool
    hold_chars: int = 0


@dataclass(frozen=True)
class BatchTokenOut:
    outputs: list[ReqOutput]


@dataclass(frozen=True)
class ReqStrOut:
    """A ReqOutput plus its detokenized text increment."""

    out: ReqOutput
    text_delta: str


@dataclass(frozen=True)
class BatchStrOut:
    outputs: list[ReqStrOut]


@dataclass(frozen=True)
class Stats:
    """Scheduler counters for /metrics and /get_server_info."""

    running: int
    waiting: int
    kv_used_tokens: int
    kv_total_tokens: int
    cache_hit_tokens: int
    prompt_tokens: int
    generated_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelInfo:
    """What the process that owns the model loaded: reported once it is ready."""

    model: str
    model_path: str
    context_len: int
    vocab_size: int
    kv_tokens: int


@dataclass(frozen=True)
class ProcessReady:
    """A server child process finished starting (`info` from the scheduler only)."""

    name: str
    info: ModelInfo | None = None


@dataclass(frozen=True)
class ProcessFailed:
    """A server child process could not start; `error` says why."""

    name: str
    error: str


def encode(msg: object) -> bytes:
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> Any:
    return pickle.loads(data)  # noqa: S301 - only plait's own processes speak on these sockets

"""What every workload shares: scales, the result of one run, clocks, and running plait.

A workload module builds its data once (deterministic synthetic text), then runs it on each
system. plait runs through the DSL (`Program.run_batch`) on a `PlaitTarget`: an in-process
`LocalBackend` (optionally with an ablation) or a `plait serve` server through `HttpBackend`.
Latency of an item is the time from the start of the run (all items arrive at once) until
its result exists; cache hit rate is cached prompt tokens / prompt tokens over every request
the system made, and the optimum is the same ratio if every token seen before were reused.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

import plait
from plait.clients.base import Backend, ChoiceLogprobs, GenOutput, OnText

Scale = Literal["full", "quick", "smoke"]
MODEL = "plait-small"
PLAIT = "plait"
NO_RADIX = "plait, radix cache off"
NO_JUMP = "plait, jump-forward off"
HTTP = "plait via HTTP server"
HF = "transformers generate"
OUTLINES = "Outlines + transformers"


@dataclass(frozen=True)
class Run:
    """One system on one workload."""

    programs: int
    seconds: float
    output_tokens: int
    latencies: tuple[float, ...]
    hit_rate: float | None = None
    optimum_hit: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    outputs: tuple[Any, ...] = ()  # compared with plait's (greedy agreement), not saved


class Clock:
    """Seconds since `restart()`, the time each item finished, and what it produced."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.done: dict[int, float] = {}
        self.values: dict[int, Any] = {}

    def restart(self) -> None:
        self.start = time.perf_counter()
        self.done.clear()
        self.values.clear()

    def record(self, key: int, value: Any) -> None:
        self.values[key] = value
        self.mark(key)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def mark(self, *keys: int) -> None:
        now = self.elapsed()
        for key in keys:
            self.done[key] = now

    def latencies(self, n: int) -> tuple[float, ...]:
        missing = [i for i in range(n) if i not in self.done]
        if missing:
            raise RuntimeError(f"items {missing[:5]} never finished")
        return tuple(self.done[i] for i in range(n))


class RecordingBackend(plait.LocalBackend):
    """A LocalBackend that keeps what it was asked and what it produced, in order (to
    compute the optimal hit rate): (text, choices, is_prompt) per event."""

    def __init__(self, model: str, **engine_config: Any) -> None:
        super().__init__(model, **engine_config)
        self.events: list[tuple[str, tuple[str, ...], bool]] = []

    async def generate(
        self, text: str, params: dict[str, Any], *, on_text: OnText | None = None
    ) -> GenOutput:
        self.events.append((text, (), True))
        out = await super().generate(text, params, on_text=on_text)
        self.events.append((text + out.text, (), False))
        return out

    async def score(
        self, prefix: str, choices: Sequence[str], *, unconditional: bool = False
    ) -> list[ChoiceLogprobs]:
        self.events.append((prefix, tuple(choices), True))
        return await super().score(prefix, choices, unconditional=unconditional)

    async def cache_prefix(self, text: str) -> dict[str, Any]:
        self.events.append((text, (), True))
        return await super().cache_prefix(text)

    def token_events(self) -> list[tuple[list[int], bool]]:
        """Token ids as the engine saw them (scores: prefix ids + choice ids)."""
        tok = self.engine.tokenizer
        out: list[tuple[list[int], bool]] = []
        for text, choices, is_prompt in self.events:
            ids = list(tok.encode(text, add_special_tokens=True))
            if not choices:
                out.append((ids, is_prompt))
            out += [(ids + list(tok.encode(c, add_special_tokens=False)), True) for c in choices]
        return out


def optimum_hit_rate(events: Sequence[tuple[Sequence[int], bool]]) -> float:
    """The hit rate if every token sequence seen before (an earlier prompt, or an earlier
    prompt with its output) were reused: 1 - new prompt tokens / prompt tokens."""
    root: dict[int, Any] = {}
    new = total = 0
    for ids, is_prompt in events:
        node = root
        for token in ids:
            nxt = node.get(token)
            if nxt is None:
                nxt = node[token] = {}
                new += is_prompt
            node = nxt
        total += len(ids) if is_prompt else 0
    return 1.0 - new / total if total else 0.0


@dataclass(frozen=True)
class PlaitSystem:
    """A plait configuration: engine options, and whether it is reached over HTTP."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    http: bool = False


class PlaitTarget:
    """An open plait backend with its counters; use as a context manager."""

    def __init__(self, system: PlaitSystem, kv_tokens: int) -> None:
        from transformers import AutoTokenizer

        from plait.backend.model.builtin import resolve_model_path

        self.system = system
        self.tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(MODEL))
        self.runtime: Any = None
        self.backend: Backend
        if system.http:
            from plait.clients.http import HttpBackend
            from plait.runtime import Runtime

            self.runtime = Runtime(model=MODEL, kv_tokens=kv_tokens, **system.options)
            self.backend = HttpBackend(self.runtime.url)
        else:
            self.backend = RecordingBackend(MODEL, kv_tokens=kv_tokens, **system.options)

    def count(self, text: str) -> int:
        """Tokens of `text` (how output tokens are counted for every system)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def counters(self) -> dict[str, float]:
        """The scheduler's counters so far: cache hits, prompt and generated tokens, forward
        steps and busy seconds."""
        if isinstance(self.backend, plait.LocalBackend):
            stats = dataclasses.asdict(self.backend.engine.stats())
        else:
            info = httpx.get(f"{self.runtime.url}/get_server_info", timeout=60).json()
            stats = info["stats"]
        extra = stats.get("extra", {})
        return {
            "cache_hit_tokens": stats["cache_hit_tokens"],
            "prompt_tokens": stats["prompt_tokens"],
            "generated_tokens": stats["generated_tokens"],
            "steps": extra.get("steps", 0),
            "busy_s": extra.get("busy_s", 0.0),
        }

    def flush(self) -> None:
        if isinstance(self.backend, RecordingBackend):
            self.backend.engine.flush_cache()
            self.backend.events.clear()
        else:
            httpx.post(f"{self.runtime.url}/flush_cache", timeout=60).raise_for_status()

    def close(self) -> None:
        self.backend.close()
        if self.runtime is not None:
            self.runtime.close()

    def __enter__(self) -> PlaitTarget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Timed:
    """plait's states and the measurements of a `run_batch`."""

    states: list[plait.ProgramState]
    values: list[Any]  # what each program passed to `clock.record`, if anything
    seconds: float
    latencies: tuple[float, ...]
    hit_rate: float
    optimum_hit: float | None
    work: dict[str, float]  # what the scheduler did: tokens prefilled, generated, steps


def run_batch(
    target: PlaitTarget,
    program: plait.Program,
    make_items: Callable[[Clock], list[dict[str, Any]]],
    **sampling: Any,
) -> Timed:
    """Warm up on the first item, empty the cache, then time `run_batch` over all items.
    Each program calls `clock.mark(i)` once its last result is in."""
    program.run_batch(make_items(Clock())[:1], backend=target.backend, temperature=0, **sampling)
    target.flush()
    before = target.counters()
    clock = Clock()
    items = make_items(clock)
    clock.restart()
    states = program.run_batch(items, backend=target.backend, temperature=0, **sampling)
    seconds = clock.elapsed()
    work = {k: v - before[k] for k, v in target.counters().items()}
    work["prefill_tokens"] = work["prompt_tokens"] - work["cache_hit_tokens"]
    optimum = None
    if isinstance(target.backend, RecordingBackend):
        optimum = optimum_hit_rate(target.backend.token_events())
    rate = work["cache_hit_tokens"] / work["prompt_tokens"] if work["prompt_tokens"] else 0.0
    values = [clock.values.get(i) for i in range(len(items))]
    latencies = clock.latencies(len(items))
    return Timed(states, values, seconds, latencies, rate, optimum, work)


def timed_run(timed: Timed, output_tokens: int, outputs: Sequence[Any], **extra: Any) -> Run:
    return Run(
        programs=len(timed.states),
        seconds=timed.seconds,
        output_tokens=output_tokens,
        latencies=timed.latencies,
        hit_rate=timed.hit_rate,
        optimum_hit=timed.optimum_hit,
        extra={"work": timed.work, **extra},
        outputs=tuple(outputs),
    )


def peer_run(clock: Clock, output_tokens: int, outputs: Sequence[Any], **extra: Any) -> Run:
    """A peer's run: nothing is cached across requests, so its hit rate is 0."""
    n = len(outputs)
    return Run(
        n, clock.elapsed(), output_tokens, clock.latencies(n), 0.0, None, extra, tuple(outputs)
    )


@dataclass(frozen=True)
class Workload:
    """A workload: its data builder, its plait program runner, and its peer runners.

    `build(scale, maker)` makes the data; `plait(data, target)` and each `peers[name](data,
    peers)` return a `Run`. `systems` lists the plait configurations it runs on.

    Systems that share nothing between items (the peers, plait with the radix cache off)
    cost the same per item however many run, so in the full run they may process only the
    first `sample` items (`head(data, k)`) to keep `make bench` within an hour. `items`
    names the data's per-item tuple fields (cut together by `head`)."""

    name: str
    title: str
    build: Callable[[Scale, Any], Any]
    plait: Callable[[Any, PlaitTarget], Run]
    peers: Mapping[str, Callable[[Any, Any], Run]]
    items: tuple[str, ...]
    systems: tuple[str, ...] = (PLAIT, NO_RADIX)
    sample: int | None = None
    kv_tokens: int = 65536

    def head(self, data: Any, k: int) -> Any:
        """The data with only its first `k` items."""
        return dataclasses.replace(data, **{f: getattr(data, f)[:k] for f in self.items})

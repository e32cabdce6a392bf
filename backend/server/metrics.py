"""Prometheus metrics of the server (text exposition format 0.0.4, no client library).

Latencies are measured in the main process: `ServerMetrics.observe` is the
TokenizerManager's observer and sees every increment of every request (time to first
token, inter-token latency, end-to-end latency, finish reasons). Queue lengths, token
counters and KV-pool usage come from the scheduler's `Stats` at scrape time.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Sequence

from plait.backend.engine.tokenizer_manager import RequestState
from plait.backend.request.messages import ReqStrOut, Stats

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0, 60.0
)  # fmt: skip
TOKEN_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5
)  # fmt: skip
PREFIX = "plait_"


class Histogram:
    """A cumulative-bucket histogram (not locked: `ServerMetrics` holds the lock)."""

    def __init__(self, name: str, help_text: str, *, buckets: Sequence[float]) -> None:
        self.name = PREFIX + name
        self.help = help_text
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        total = 0
        for bound, count in zip([*map(_num, self.buckets), "+Inf"], self.counts, strict=True):
            total += count
            lines.append(f'{self.name}_bucket{{le="{bound}"}} {total}')
        lines += [f"{self.name}_sum {_num(self.sum)}", f"{self.name}_count {total}"]
        return lines


class ServerMetrics:
    """Request latencies and outcomes, plus rendering of the whole /metrics page."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_output: dict[str, float] = {}
        self.finished: dict[str, int] = {}
        self.ttft = Histogram(
            "time_to_first_token_seconds", "Time to first token.", buckets=LATENCY_BUCKETS
        )
        self.itl = Histogram(
            "inter_token_latency_seconds",
            "Time per output token after the first.",
            buckets=TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = Histogram(
            "e2e_request_latency_seconds",
            "Time from arrival to the last output.",
            buckets=LATENCY_BUCKETS,
        )

    def observe(self, state: RequestState, item: ReqStrOut) -> None:
        """TokenizerManager observer: called on the receiving thread for each increment."""
        now = time.monotonic()
        new_tokens, finish = len(item.out.new_ids), item.out.finish
        with self._lock:
            last = self._last_output.get(state.rid)
            if new_tokens and last is None:
                self.ttft.observe(now - state.created_at)
            elif new_tokens and last is not None:
                self.itl.observe((now - last) / new_tokens)
            if new_tokens:
                self._last_output[state.rid] = now
            if finish is not None:
                self._last_output.pop(state.rid, None)
                self.e2e.observe(now - state.created_at)
                self.finished[finish.kind] = self.finished.get(finish.kind, 0) + 1

    def render(self, stats: Stats | None) -> str:
        """The /metrics page; scheduler gauges are left out when `stats` is None."""
        lines: list[str] = []
        if stats is not None:
            lines += _stats_lines(stats)
        with self._lock:
            lines += [
                f"# HELP {PREFIX}requests_finished_total Requests finished, by reason.",
                f"# TYPE {PREFIX}requests_finished_total counter",
            ]
            for reason, count in sorted(self.finished.items()):
                lines.append(f'{PREFIX}requests_finished_total{{reason="{reason}"}} {count}')
            for hist in (self.ttft, self.itl, self.e2e):
                lines += hist.render()
        return "\n".join(lines) + "\n"


def _stats_lines(stats: Stats) -> list[str]:
    usage = stats.kv_used_tokens / stats.kv_total_tokens if stats.kv_total_tokens else 0.0
    rows = [
        ("requests_running", "gauge", "Requests in the running batch.", stats.running),
        ("requests_waiting", "gauge", "Requests waiting to be scheduled.", stats.waiting),
        ("generation_tokens_total", "counter", "Tokens generated.", stats.generated_tokens),
        ("prompt_tokens_total", "counter", "Prompt tokens admitted.", stats.prompt_tokens),
        ("cache_hit_tokens_total", "counter", "Prompt tokens found in the radix cache.",
         stats.cache_hit_tokens),
        ("kv_used_tokens", "gauge", "KV slots held by running requests.", stats.kv_used_tokens),
        ("kv_total_tokens", "gauge", "KV slots in the pool.", stats.kv_total_tokens),
        ("kv_usage", "gauge", "Fraction of the KV pool held by running requests.", usage),
        ("radix_cache_tokens", "gauge", "Tokens kept in the radix cache.",
         stats.extra.get("cached_tokens", 0)),
        ("retracted_requests_total", "counter", "Requests retracted under KV pressure.",
         stats.extra.get("retracted", 0)),
        ("spec_draft_tokens_total", "counter", "Speculative draft tokens verified.",
         stats.extra.get("spec_draft_tokens", 0)),
        ("spec_accepted_tokens_total", "counter", "Speculative draft tokens accepted.",
         stats.extra.get("spec_accepted_tokens", 0)),
    ]  # fmt: skip
    lines = []
    for name, kind, help_text, value in rows:
        lines += [
            f"# HELP {PREFIX}{name} {help_text}",
            f"# TYPE {PREFIX}{name} {kind}",
            f"{PREFIX}{name} {_num(value)}",
        ]
    return lines


def _num(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def parse_metrics(text: str) -> dict[str, float]:
    """Sample name (with labels) -> value: a small reader for tests and tools."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out

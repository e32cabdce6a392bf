"""A worker killed (SIGKILL) behind SGLang's Model Gateway with requests in flight. Two
`plait serve` workers and the gateway with plait's failover flags (`GatewayProcess`, as
`plait serve --dp --router sglang` runs it; docs/scale.md), all on loopback: two long
streams and four long requests run on the workers when the first stream's worker is
killed; then twelve short requests, on the prefixes of the six. Every request not
streamed, in flight or sent after the kill, is answered 200 by the survivor (the gateway
retries what it could not send); a stream on the dead worker is cut (no `[DONE]`), one on
the survivor completes; every client has a bounded timeout and every thread ends.
Skipped without sglang-router."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from server_helpers import alive, metrics, server_args, wait_until

from plait.backend.router.config import RouterConfig
from plait.backend.router.gateway import GatewayProcess
from plait.runtime import Runtime, free_port

pytest.importorskip("sglang_router")

CLIENT_TIMEOUT_S = 60.0
PREFIXES = [f"Tenant {t} writes a long and detailed report about topic {t}. " * 8 for t in range(6)]


@dataclass
class Outcome:
    """What one client saw: the status, whether the body ended whole, the stream's
    events, the seconds it took."""

    status: int = 0
    whole: bool = False
    events: list[str] = field(default_factory=list)
    seconds: float = 0.0


@pytest.fixture
def cluster() -> Iterator[tuple[list[Runtime], GatewayProcess]]:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        workers = list(pool.map(lambda _: Runtime(**server_args()), range(2)))
    config = RouterConfig(
        workers=tuple(w.url for w in workers), port=free_port(), log_level="error"
    )
    gateway = GatewayProcess(config, metrics_port=free_port())
    try:
        gateway.wait_ready(timeout=90)
        yield workers, gateway
    finally:
        gateway.stop()
        for w in workers:
            w.close()


def body(prefix: str, tokens: int, stream: bool = False) -> dict[str, Any]:
    params = {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}
    return {"text": prefix + "Summary:", "stream": stream, "sampling_params": params}


def send(url: str, payload: dict[str, Any], out: Outcome) -> None:
    start = time.monotonic()
    try:
        with httpx.stream("POST", url + "/generate", json=payload, timeout=CLIENT_TIMEOUT_S) as r:
            out.status = r.status_code
            for line in r.iter_lines():
                if line.startswith("data:"):
                    out.events.append(line)
        out.whole = True
    except httpx.HTTPError:
        out.whole = False
    out.seconds = time.monotonic() - start


def start(url: str, payload: dict[str, Any]) -> tuple[threading.Thread, Outcome]:
    out = Outcome()
    thread = threading.Thread(target=send, args=(url, payload, out), daemon=True)
    thread.start()
    return thread, out


def start_stream(
    url: str, workers: list[Runtime], prefix: str
) -> tuple[threading.Thread, Outcome, int]:
    """A long stream, and the index of the worker it runs on (whose running count grew)."""
    counts = [running(w) for w in workers]
    thread, out = start(url, body(prefix, 400, stream=True))
    assert wait_until(lambda: sum(map(running, workers)) > sum(counts), 30)
    home = next(i for i, w in enumerate(workers) if running(w) > counts[i])
    return thread, out, home


def running(worker: Runtime) -> int:
    return int(metrics(worker.url).get("plait_requests_running", 0))


def finished(worker: Runtime) -> int:
    done = metrics(worker.url)
    return int(sum(v for k, v in done.items() if k.startswith("plait_requests_finished_total")))


def gateway_health(gateway: GatewayProcess) -> dict[str, bool]:
    listed = httpx.get(gateway.url + "/workers", timeout=10).json()["workers"]
    return {w["url"]: w["is_healthy"] for w in listed}


def test_a_killed_worker_with_requests_in_flight(
    cluster: tuple[list[Runtime], GatewayProcess],
) -> None:
    workers, gateway = cluster
    before = [finished(w) for w in workers]
    streams = [start_stream(gateway.url, workers, prefix) for prefix in PREFIXES[:2]]
    in_flight = [start(gateway.url, body(prefix, 200)) for prefix in PREFIXES[2:]]
    assert wait_until(lambda: sum(map(running, workers)) == 6, 30)
    victim = streams[0][2]
    survivor = workers[1 - victim]
    assert running(workers[victim]) >= 2  # its stream and a request at least
    assert finished(workers[victim]) == before[victim]  # all of its requests are in flight
    os.kill(workers[victim].pid, signal.SIGKILL)
    after = [start(gateway.url, body(PREFIXES[i % 6], 8)) for i in range(12)]
    for thread, _ in in_flight + after:
        thread.join(timeout=CLIENT_TIMEOUT_S + 10)
    for thread, _, _ in streams:
        thread.join(timeout=CLIENT_TIMEOUT_S + 10)
    threads = [t for t, _ in in_flight + after] + [t for t, _, _ in streams]
    assert not any(t.is_alive() for t in threads)  # nothing hangs
    outcomes = [out for _, out in in_flight + after] + [out for _, out, _ in streams]
    assert max(out.seconds for out in outcomes) < CLIENT_TIMEOUT_S / 2

    answered = [out for _, out in in_flight + after]
    assert [(out.status, out.whole) for out in answered] == [(200, True)] * 16
    for _, out, home in streams:
        if home == victim:  # cut where the worker died: 200, some events, no end
            assert out.status == 200 and not out.whole and "[DONE]" not in out.events[-1]
        else:
            assert out.whole and out.events[-1] == "data: [DONE]"
    survived = sum(home != victim for _, _, home in streams)
    assert finished(survivor) - before[1 - victim] == len(answered) + survived
    assert wait_until(lambda: not gateway_health(gateway)[workers[victim].url], 10)
    assert gateway_health(gateway)[survivor.url] and gateway.running()
    assert not alive(workers[victim].pid)

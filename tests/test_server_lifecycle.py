"""Process lifecycle of `plait serve`: startup time, API key, SIGTERM, a child's death."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import httpx
from server_helpers import (
    MODEL,
    alive,
    descendants_of,
    process_name,
    server_args,
    sse_events,
    wait_until,
)

from plait.runtime import Runtime

FIRST_RESPONSE_LIMIT_S = 20.0
KEY = "s3cret-key"


def test_startup_api_key_and_sigterm_leave_no_orphans() -> None:
    start = time.monotonic()
    rt = Runtime(api_key=KEY, **server_args())
    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": MODEL, "prompt": "first", "max_tokens": 4}
    first = httpx.post(rt.url + "/v1/completions", json=body, headers=auth, timeout=60)
    elapsed = time.monotonic() - start
    assert first.status_code == 200
    assert elapsed < FIRST_RESPONSE_LIMIT_S, f"first response after {elapsed:.1f}s"
    print(f"plait serve: first response {elapsed:.1f}s after start")

    assert httpx.get(rt.url + "/health").status_code == 200  # open without the key
    assert httpx.post(rt.url + "/v1/completions", json=body).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert httpx.post(rt.url + "/generate", json={"text": "x"}, headers=wrong).status_code == 401
    assert httpx.get(rt.url + "/metrics").status_code == 401
    assert httpx.get(rt.url + "/v1/models", headers=auth).status_code == 200

    family = descendants_of(rt.pid)
    assert {process_name(pid) for pid in family} >= {"plait-scheduler", "plait-detokeniz"}
    streamed: dict[str, Any] = {}
    started = threading.Event()
    kwargs = {"started": started, "headers": auth}
    reader = threading.Thread(target=stream_until_error, args=(rt.url, streamed), kwargs=kwargs)
    reader.start()
    assert started.wait(30)
    os.kill(rt.pid, signal.SIGTERM)
    assert rt.process.wait(timeout=30) == 0
    assert wait_until(lambda: not any(alive(pid) for pid in family), 10), family
    reader.join(timeout=30)
    events = sse_events(streamed["lines"])  # the stream in flight ended cleanly
    assert "shutting down" in events[-1]["error"]["message"]
    rt.close()


def stream_until_error(
    url: str,
    result: dict[str, Any],
    *,
    started: threading.Event,
    headers: dict[str, str] | None = None,
) -> None:
    body = {"model": MODEL, "prompt": "long", "max_tokens": 3000, "ignore_eos": True,
            "stream": True}  # fmt: skip
    lines = []
    try:
        with httpx.stream(
            "POST", url + "/v1/completions", json=body, headers=headers, timeout=60
        ) as r:
            for line in r.iter_lines():
                lines.append(line)
                started.set()
    except httpx.HTTPError as exc:
        result["error"] = exc
    result["lines"] = lines
    started.set()


def wait_for_completion(url: str, result: dict[str, Any]) -> None:
    body = {"model": MODEL, "prompt": "also long", "max_tokens": 3000, "ignore_eos": True}
    try:
        result["response"] = httpx.post(url + "/v1/completions", json=body, timeout=60)
    except httpx.HTTPError as exc:
        result["error"] = exc


def test_child_death_fails_requests_reports_unhealthy_and_exits_nonzero() -> None:
    rt = Runtime(**server_args())
    family = descendants_of(rt.pid)
    (scheduler,) = [pid for pid in family if process_name(pid) == "plait-scheduler"]
    streamed: dict[str, Any] = {}
    waited: dict[str, Any] = {}
    started = threading.Event()
    threads = [
        threading.Thread(
            target=stream_until_error, args=(rt.url, streamed), kwargs={"started": started}
        ),
        threading.Thread(target=wait_for_completion, args=(rt.url, waited)),
    ]
    for t in threads:
        t.start()
    assert started.wait(30)
    killed_at = time.monotonic()
    os.kill(scheduler, signal.SIGKILL)

    def unhealthy() -> bool:
        try:
            return httpx.get(rt.url + "/health", timeout=1).status_code == 503
        except httpx.HTTPError:
            return False

    assert wait_until(unhealthy, 1.5)
    assert time.monotonic() - killed_at < 1.5
    for t in threads:
        t.join(timeout=30)
    events = sse_events(streamed["lines"])
    assert "scheduler process died" in events[-1]["error"]["message"]
    assert waited["response"].status_code == 503
    assert "scheduler process died" in waited["response"].json()["error"]["message"]
    assert rt.process.wait(timeout=30) != 0
    assert wait_until(lambda: not any(alive(pid) for pid in family), 10)
    rt.close()

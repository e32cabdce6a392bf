"""Helpers for the server tests: process trees, SSE parsing, metrics, small requests."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from plait.backend.server.metrics import parse_metrics

SERVER_KV_TOKENS = 16384
MODEL = "plait-tiny"


def server_args(**extra: Any) -> dict[str, Any]:
    """`plait serve` flags of the test servers (plait-tiny, small KV pool)."""
    return {"kv_tokens": SERVER_KV_TOKENS, "num_threads": 1, **extra}


def children_of(pid: int) -> list[int]:
    """Direct children of `pid` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def descendants_of(pid: int) -> list[int]:
    todo, found = [pid], []
    while todo:
        kids = children_of(todo.pop())
        found += kids
        todo += kids
    return found


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval)
    return check()


def sse_events(lines: list[str]) -> list[Any]:
    """JSON payloads of `data:` lines, up to `data: [DONE]` (which must be there)."""
    events = []
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return events
        events.append(json.loads(payload))
    raise AssertionError("stream ended without data: [DONE]")


def metrics(url: str, **headers: str) -> dict[str, float]:
    return parse_metrics(httpx.get(url + "/metrics", headers=headers, timeout=30).text)


def completion(url: str, prompt: str | list[int], max_tokens: int, **extra: Any) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(url + "/v1/completions", json={**body, **extra}, timeout=120)


def error_message(response: httpx.Response) -> str:
    return str(response.json()["error"]["message"])


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return alive(pid)

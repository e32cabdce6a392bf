"""`plait serve --dp 2 --router sglang`: the launcher's two workers behind SGLang's Model
Gateway on loopback, with an API key: requests through it (its key checked, never on a
command line), its metrics port, and a clean stop that leaves no process. Skipped without
sglang-router."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest
from server_helpers import MODEL, alive, descendants_of, process_name, server_args, wait_until

from plait.runtime import Runtime, free_port

pytest.importorskip("sglang_router")

KEY = "gateway-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def ready(url: str) -> bool:
    try:
        answer = httpx.get(url + "/readiness", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return False
    return answer.get("healthy_workers") == answer.get("total_workers") == 2


def test_dp_behind_the_gateway_answers_and_stops_cleanly() -> None:
    metrics_port = free_port()
    rt = Runtime(
        dp=2, router="sglang", gateway_metrics_port=metrics_port, api_key=KEY, **server_args()
    )
    try:
        family = descendants_of(rt.pid)
        gateways = [pid for pid in family if process_name(pid) == "sglang::router"]
        assert len(gateways) == 1 and len(family) >= 7  # gateway + 2 x (main, sched., detok.)
        assert not any(KEY in cmdline(pid) for pid in family)  # env and files only
        assert wait_until(lambda: ready(rt.url), 60, interval=0.2)
        body = {"text": "Say hi", "sampling_params": {"max_new_tokens": 4, "temperature": 0,
                "ignore_eos": True}}  # fmt: skip
        assert httpx.post(rt.url + "/generate", json=body, timeout=60).status_code == 401
        out = httpx.post(rt.url + "/generate", json=body, headers=AUTH, timeout=60)
        assert out.status_code == 200, out.text
        assert out.json()["meta_info"]["completion_tokens"] == 4
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
        answer = httpx.post(rt.url + "/v1/chat/completions", json=chat, headers=AUTH, timeout=60)
        assert answer.status_code == 200 and answer.json()["model"] == MODEL
        exported = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        assert "smg_" in exported
        os.kill(rt.pid, signal.SIGTERM)
        assert rt.process.wait(timeout=60) == 0
        assert wait_until(lambda: not any(alive(pid) for pid in family), 15), family
    finally:
        rt.close()

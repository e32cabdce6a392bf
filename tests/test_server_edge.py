"""The server's edge: keys from flags, files and the environment, and the callers they make
(aborts between callers: test_chaos); /health on the scheduler's heartbeat; request chat
templates off by default."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from server_helpers import MODEL

from helpers import tiny_engine
from plait.backend.engine.engine import Engine
from plait.backend.server.app import create_app
from plait.backend.server.args import ServerSettings
from plait.backend.server.auth import API_KEY_ENV, AuthConfig, gather_keys, read_keys
from plait.runtime import Runtime


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with tiny_engine() as eng:
        yield eng


def wait_for(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def test_keys_come_from_flag_file_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "keys").write_text("# team keys\nk-file-1\n\n  k-file-2  \n")
    assert read_keys(tmp_path / "keys") == ["k-file-1", "k-file-2"]
    monkeypatch.setenv(API_KEY_ENV, "k-env")
    keys = gather_keys(key="k-flag", key_file=str(tmp_path / "keys"), env=API_KEY_ENV)
    assert keys == ("k-flag", "k-file-1", "k-file-2", "k-env")
    auth = AuthConfig.from_keys(keys, ["k-admin"])
    assert "k-flag" not in repr(auth)  # only digests are kept
    one, two = auth.caller("Bearer k-file-1", "1.2.3.4"), auth.caller("Bearer k-env", "x")
    assert one is not None and two is not None and one.identity != two.identity
    admin = auth.caller("Bearer k-admin", "x")
    assert admin is not None and admin.admin and not one.admin
    assert auth.caller("Bearer nope", "x") is None and auth.caller("", "x") is None
    open_auth = AuthConfig()
    assert open_auth.caller("", "5.6.7.8") == open_auth.caller("Bearer anything", "5.6.7.8")


def test_runtime_passes_its_key_outside_the_command_line() -> None:
    with Runtime(api_key="s3cret-key", kv_tokens=4096) as rt:
        cmdline = Path(f"/proc/{rt.pid}/cmdline").read_bytes()
        assert b"s3cret-key" not in cmdline
        headers = {"Authorization": "Bearer s3cret-key"}
        assert httpx.get(rt.url + "/v1/models", headers=headers).status_code == 200
        assert httpx.get(rt.url + "/v1/models").status_code == 401


def test_health_is_503_while_the_scheduler_is_stuck(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = engine.runtime.scheduler  # type: ignore[union-attr]
    real = scheduler.step
    stuck = threading.Event()

    def step() -> list[object]:
        if stuck.is_set():
            stuck.clear()
            time.sleep(3)  # a step that hangs
        return real()

    monkeypatch.setattr(scheduler, "step", step)
    app = create_app(engine, settings=ServerSettings(health_stall_s=1.0))
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        stuck.set()
        assert wait_for(lambda: client.get("/health").status_code == 503, 5)
        assert wait_for(lambda: client.get("/health").status_code == 200, 10)


def test_request_chat_templates_are_refused_unless_allowed(engine: Engine) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "chat_template_kwargs": {"chat_template": "{{ 'x' }}"}}  # fmt: skip
    with TestClient(create_app(engine)) as client:
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "chat_template_kwargs.chat_template"
        plain = {**body, "chat_template_kwargs": {"enable_thinking": False}}
        assert client.post("/v1/chat/completions", json=plain).status_code == 200
    allowing = ServerSettings(allow_request_chat_template=True)
    with TestClient(create_app(engine, settings=allowing)) as client:
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text

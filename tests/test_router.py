"""The router in front of two small `plait serve` workers, and `plait serve --dp 2`:
routing by prefix, round robin, sessions, pass-through (streams, errors, every endpoint),
health and metrics, a dead worker, and a clean shutdown without orphans."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from server_helpers import (
    MODEL,
    alive,
    children_of,
    descendants_of,
    metrics,
    server_args,
    sse_events,
    wait_until,
)

import plait
from plait.backend.router.config import RouterConfig
from plait.backend.router.server import make_server
from plait.clients.http import HttpBackend
from plait.runtime import Runtime, free_port

SYSTEM_1 = "You are a terse pirate who answers every question about ships and the sea. " * 4
SYSTEM_2 = "You are a careful lawyer who cites the statute before answering anything. " * 4
WORKER = "x-plait-worker"


class RouterThread:
    """A router served by uvicorn on a thread of the test process."""

    def __init__(self, workers: list[str], **options: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        options = {"health_interval_s": 0.2, **options}
        config = RouterConfig(
            workers=tuple(workers), port=self.port, log_level="warning", **options
        )
        self.server: uvicorn.Server = make_server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        assert wait_until(lambda: self.server.started, 30)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def workers() -> Iterator[list[Runtime]]:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runtimes = list(pool.map(lambda _: Runtime(**server_args()), range(2)))
    yield runtimes
    for rt in runtimes:
        rt.close()


@pytest.fixture(scope="module")
def router(workers: list[Runtime]) -> Iterator[str]:
    """`plait router` (the command) in front of both workers."""
    port = free_port()
    command = [sys.executable, "-m", "plait.cli", "router", "--port", str(port),
               "--log-level", "warning", "--health-interval", "0.2",
               "--worker", workers[0].url, "--worker", workers[1].url]  # fmt: skip
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: _healthy(url), 60), "the router did not come up"
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def chat(url: str, system: str, question: str, **extra: Any) -> httpx.Response:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0, **extra}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


def generate(url: str, text: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"text": text, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    return httpx.post(url + "/generate", json=body, headers=headers, timeout=120)


def counters(url: str, name: str) -> dict[str, int]:
    return {w["url"]: w[name] for w in httpx.get(url + "/workers").json()["workers"]}


# --- routing ----------------------------------------------------------------------------
def test_requests_with_one_system_prompt_go_to_one_worker(router: str) -> None:
    assert httpx.post(router + "/flush_cache", timeout=30).text == "Cache flushed.\n"
    seen: dict[str, set[str]] = {SYSTEM_1: set(), SYSTEM_2: set()}
    cached = []
    for i in range(3):
        for system in (SYSTEM_1, SYSTEM_2):
            resp = chat(router, system, f"Question {i}?")
            assert resp.status_code == 200, resp.text
            seen[system].add(resp.headers[WORKER])
            cached.append(resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert len(seen[SYSTEM_1]) == len(seen[SYSTEM_2]) == 1
    assert seen[SYSTEM_1] != seen[SYSTEM_2]  # the second prompt went to the emptier cache
    assert min(cached[2:]) > 40  # every repeat found its system prompt cached


def test_round_robin_alternates(workers: list[Runtime]) -> None:
    rt = RouterThread([w.url for w in workers], policy="round_robin")
    try:
        order = [generate(rt.url, SYSTEM_1).headers[WORKER] for _ in range(4)]
    finally:
        rt.close()
    assert order == [workers[0].url, workers[1].url] * 2


def test_a_session_stays_on_one_worker(router: str) -> None:
    for session in ("session-a", "session-b"):
        headers = {"X-Plait-Session": session}
        texts = ["one thing", "a different thing", SYSTEM_1, SYSTEM_2]
        places = {generate(router, t, headers).headers[WORKER] for t in texts}
        assert len(places) == 1


@plait.program
def forked(s):  # type: ignore[no-untyped-def]
    s += SYSTEM_2 + "Three ideas:"
    forks = s.fork(3)
    for i, branch in enumerate(forks):
        branch += f" {i}." + plait.gen("idea", max_tokens=3)
    forks.join()
    s += " Best:" + plait.gen("best", max_tokens=3)


def test_a_programs_forks_stay_on_one_worker(router: str) -> None:
    backend = HttpBackend(router)  # (its /get_model_info goes to either worker)
    routed, pinned = counters(router, "routed"), counters(router, "session_hits")
    forked.run(backend=backend)
    routed = {url: n - routed[url] for url, n in counters(router, "routed").items()}
    pinned = {url: n - pinned[url] for url, n in counters(router, "session_hits").items()}
    # the prefix, 3 branches, the last gen: the first by prefix, the 4 others by session
    assert sorted(routed.values()) == [0, 5] and sorted(pinned.values()) == [0, 4]


# --- pass-through -----------------------------------------------------------------------
def test_streaming_through_the_router_equals_direct(router: str) -> None:
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    body = {"text": SYSTEM_1 + "Ahoy", "stream": True, "sampling_params": params}
    routed_events, worker = stream(router + "/generate", body)
    direct_events, _ = stream(worker + "/generate", body)
    assert len(routed_events) == len(direct_events) > 1
    assert [e["text"] for e in routed_events] == [e["text"] for e in direct_events]
    chat_body = {"model": MODEL, "stream": True, "max_tokens": 8, "temperature": 0,
                 "messages": [{"role": "user", "content": "Hi"}], "ignore_eos": True}  # fmt: skip
    routed_chat, worker = stream(router + "/v1/chat/completions", chat_body)
    direct_chat, _ = stream(worker + "/v1/chat/completions", chat_body)
    assert [c["choices"] for c in routed_chat] == [c["choices"] for c in direct_chat]


def stream(url: str, body: dict[str, Any]) -> tuple[list[Any], str]:
    with httpx.stream("POST", url, json=body, timeout=120) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        return sse_events(list(resp.iter_lines())), resp.headers.get(WORKER, url)


def test_other_endpoints_and_errors_pass_through_unchanged(
    router: str, workers: list[Runtime]
) -> None:
    direct = workers[0].url
    bad = {"model": MODEL, "prompt": "x", "max_tokens": -3}
    for url_path, body in (("/v1/completions", bad), ("/generate", {"text": 5})):
        via, own = (httpx.post(u + url_path, json=body, timeout=30) for u in (router, direct))
        assert (via.status_code, via.json()) == (own.status_code, own.json())
        assert via.status_code == 400
    for path in ("/v1/models", "/get_model_info"):
        via, own = (httpx.get(u + path, timeout=30).json() for u in (router, direct))
        if path == "/v1/models":
            via["data"][0].pop("created"), own["data"][0].pop("created")
        assert via == own
    tok = {"prompt": "Hello there"}
    assert (
        httpx.post(router + "/tokenize", json=tok).json()
        == httpx.post(direct + "/tokenize", json=tok).json()
    )
    assert httpx.get(router + "/no/such/path").status_code == 404
    assert httpx.post(router + "/abort_request", json={"rid": "nothing"}).status_code == 200
    generate(router, SYSTEM_1)
    assert httpx.post(router + "/flush_cache").status_code == 200
    assert all(w["tree_chars"] == 0 for w in httpx.get(router + "/workers").json()["workers"])


def test_health_and_metrics_of_the_router(router: str, workers: list[Runtime]) -> None:
    assert httpx.get(router + "/health").status_code == 200
    generate(router, "count me")
    page = httpx.get(router + "/metrics").text
    for w in workers:
        assert f'plait_router_requests_total{{worker="{w.url}"}}' in page
        assert f'plait_router_worker_healthy{{worker="{w.url}"}} 1' in page
        assert f'plait_requests_running{{worker="{w.url}"}}' in page  # the worker's own
    assert page.count("# TYPE plait_requests_running gauge") == 1


def test_api_key_is_required_and_forwarded(workers: list[Runtime]) -> None:
    rt = RouterThread([w.url for w in workers], api_keys=("k3y",))
    try:
        assert httpx.get(rt.url + "/health").status_code == 200
        assert generate(rt.url, "x").status_code == 401
        assert httpx.get(rt.url + "/metrics").status_code == 401
        assert generate(rt.url, "x", {"Authorization": "Bearer k3y"}).status_code == 200
    finally:
        rt.close()


def test_an_unreachable_worker_is_skipped_and_its_requests_retried(
    workers: list[Runtime],
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    # no health check between marking `nobody` healthy and the requests (a check would take
    # it out of rotation first, and nothing would be retried)
    rt = RouterThread([nobody, workers[0].url], policy="round_robin", health_interval_s=60)
    try:
        rt_pool = rt.server.config.app.state.router.pool  # type: ignore[attr-defined]
        rt_pool[nobody].healthy = True  # as if it had been up: requests go there first
        answers = [generate(rt.url, f"text {i}") for i in range(4)]
        assert all(a.status_code == 200 for a in answers)
        assert {a.headers[WORKER] for a in answers} == {workers[0].url}
        info = {w["url"]: w for w in httpx.get(rt.url + "/workers").json()["workers"]}
        assert info[nobody]["healthy"] is False and info[nobody]["retried"] == 1
    finally:
        rt.close()


class HeadersThenDeath:
    """A worker that is healthy until its first POST, which it answers with 200 headers and a
    Content-Length, then closes before the body: one killed between the two writes. From then
    on it closes every connection unanswered (dead)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.posts = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                request = conn.recv(65536)
                if self.posts:
                    continue
                if request.startswith(b"POST"):
                    self.posts += 1
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: 242\r\n\r\n")  # fmt: skip
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def test_a_worker_that_dies_between_headers_and_body_is_retried(
    workers: list[Runtime],
) -> None:
    dying = HeadersThenDeath()
    rt = RouterThread([dying.url, workers[0].url], policy="round_robin")
    try:
        assert wait_until(lambda: counters(rt.url, "healthy")[dying.url], 30)
        answers = [generate(rt.url, f"text {i}") for i in range(4)]
        assert [a.status_code for a in answers] == [200] * 4
        assert {a.headers[WORKER] for a in answers} == {workers[0].url}
        assert all(a.json()["meta_info"]["completion_tokens"] > 0 for a in answers)
        assert dying.posts == 1  # one request reached it and was answered elsewhere
        info = {w["url"]: w for w in httpx.get(rt.url + "/workers").json()["workers"]}
        assert info[dying.url]["retried"] == 1 and info[dying.url]["healthy"] is False
    finally:
        rt.close()
        dying.close()


def test_a_client_that_leaves_aborts_its_request_on_the_worker(
    router: str, workers: list[Runtime]
) -> None:
    def aborted() -> float:
        key = 'plait_requests_finished_total{reason="abort"}'
        return sum(metrics(w.url).get(key, 0.0) for w in workers)

    before = aborted()
    params = {"max_new_tokens": 3000, "ignore_eos": True}
    body = {"text": "leave while streaming", "stream": True, "sampling_params": params}
    with httpx.stream("POST", router + "/generate", json=body, timeout=60) as resp:
        for i, _ in enumerate(resp.iter_lines()):
            if i > 3:
                break
    with pytest.raises(httpx.ReadTimeout):  # a non-streamed request, given up on
        body = {"text": "leave while waiting", "sampling_params": params}
        httpx.post(router + "/generate", json=body, timeout=1.5)
    assert wait_until(lambda: aborted() >= before + 2, 20)
    assert wait_until(lambda: sum(counters(router, "in_flight").values()) == 0, 10)


# --- plait serve --dp 2 -----------------------------------------------------------------
def test_dp_survives_a_killed_worker_and_stops_cleanly() -> None:
    rt = Runtime(dp=2, health_interval=0.2, **server_args())
    family = descendants_of(rt.pid)
    worker_pids = {int(_flag(pid, "--port") or 0): pid for pid in children_of(rt.pid)}
    assert len(worker_pids) == 2 and len(family) >= 6  # 2 x (main, scheduler, detokenizer)
    streams = [LongStream(rt.url, text) for text in (SYSTEM_1, SYSTEM_2)]
    victim_url = streams[1].worker
    assert victim_url != streams[0].worker  # the new prefix went to the emptier worker
    load = Load(rt.url)
    try:
        time.sleep(1.0)
        victim = worker_pids[int(victim_url.rsplit(":", 1)[1])]
        os.killpg(victim, signal.SIGKILL)
        streams[1].thread.join(timeout=30)
        assert "error" in streams[1].events()[-1]  # the stream on it ends with an error event
        time.sleep(2.0)
    finally:
        statuses = load.stop()
    assert statuses and set(statuses) == {200}, statuses  # nothing lost
    assert httpx.get(rt.url + "/health").status_code == 200
    info = {w["url"]: w for w in httpx.get(rt.url + "/workers").json()["workers"]}
    assert info[victim_url]["dead"] and info[streams[0].worker]["healthy"]
    assert streams[0].thread.is_alive()  # the survivor's stream goes on
    os.kill(rt.pid, signal.SIGTERM)
    assert rt.process.wait(timeout=60) == 0
    assert wait_until(lambda: not any(alive(pid) for pid in family), 15), family
    for s in streams:
        s.thread.join(timeout=30)
    survivor = streams[0].events()[-1]  # the workers stopped first: their error came through
    assert "shutting down" in survivor["error"]["message"]
    rt.close()


def _flag(pid: int, name: str) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode().split("\0")
    except OSError:
        return None
    return args[args.index(name) + 1] if "serve" in args and name in args else None


class LongStream:
    """A long /generate stream read on a thread; `worker` is where the router sent it."""

    def __init__(self, url: str, text: str) -> None:
        self.lines: list[str] = []
        self.started = threading.Event()
        self.worker = ""
        body = {"text": text, "stream": True,
                "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}  # fmt: skip
        self.thread = threading.Thread(target=self._read, args=(url, body), daemon=True)
        self.thread.start()
        assert self.started.wait(60)

    def _read(self, url: str, body: dict[str, Any]) -> None:
        try:
            with httpx.stream("POST", url + "/generate", json=body, timeout=120) as resp:
                self.worker = resp.headers[WORKER]
                for line in resp.iter_lines():
                    self.lines.append(line)
                    self.started.set()
        except httpx.HTTPError:
            pass
        self.started.set()

    def events(self) -> list[Any]:
        return sse_events(self.lines)


class Load:
    """Short requests from 3 threads until `stop()`, which returns their statuses."""

    def __init__(self, url: str) -> None:
        self.url, self.statuses, self._stop = url, [], threading.Event()
        self.statuses: list[int]
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(3)
        ]
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                self.statuses.append(generate(self.url, f"load {i} {n} " * 20).status_code)
            except httpx.HTTPError as exc:
                self.statuses.append(-1)
                print("load request failed:", exc)

    def stop(self) -> list[int]:
        self._stop.set()
        for t in self.threads:
            t.join(timeout=60)
        return self.statuses

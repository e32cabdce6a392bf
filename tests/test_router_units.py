"""The router's parts without servers: prefix trees, routing texts, the policies, sessions,
metrics merging, worker flags, SGLang's Model Gateway's flags; and the session key the
frontend sends."""

from __future__ import annotations

import asyncio
import math
import os
import random
import re
import subprocess
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.backend.config import EngineConfig
from plait.backend.router import gateway
from plait.backend.router.config import RouterConfig, normalize_url
from plait.backend.router.gateway import failover_flags, gateway_flags
from plait.backend.router.launcher import WorkerProcesses, serve_dp, worker_command
from plait.backend.router.metrics import labelled, merge_worker_metrics, router_lines
from plait.backend.router.policy import Routing
from plait.backend.router.prefix_tree import PrefixTree
from plait.backend.router.request_text import chat_text, ids_text, routing_texts
from plait.backend.router.workers import WorkerPool
from plait.backend.server.args import ServerArgs, ServerSettings
from plait.backend.server.auth import AccessKeys, read_keys
from plait.chat_template import CHATML, ChatTemplate
from plait.cli import main as cli_main
from plait.clients.base import Backend, ChoiceLogprobs, GenOutput, OnText
from plait.clients.session import SESSION_HEADER, current_session, session_headers

A, B, C = "http://a:1", "http://b:2", "http://c:3"


# --- prefix tree ----------------------------------------------------------------------
def reference_match(texts: list[str], query: str) -> int:
    best = 0
    for text in texts:
        n = 0
        while n < min(len(text), len(query)) and text[n] == query[n]:
            n += 1
        best = max(best, n)
    return best


def test_prefix_tree_matches_like_the_longest_common_prefix_with_any_inserted_text() -> None:
    rng = random.Random(0)
    tree, texts = PrefixTree(), []
    for _ in range(300):
        text = "".join(rng.choice("ab") for _ in range(rng.randint(0, 12)))
        query = "".join(rng.choice("ab") for _ in range(rng.randint(0, 12)))
        assert tree.match(query) == reference_match(texts, query)
        tree.insert(text)
        texts.append(text)
    distinct_chars = len({t[:i] for t in texts for i in range(1, len(t) + 1)})
    assert tree.chars == distinct_chars  # every distinct prefix character stored once


def test_prefix_tree_evicts_least_recently_used_leaves_first() -> None:
    now = [0.0]
    tree = PrefixTree(clock=lambda: now[0])
    for i, text in enumerate(["system A: question 1", "system A: question 2", "system B: q"]):
        now[0] = float(i)
        tree.insert(text)
    now[0] = 10.0
    assert tree.match("system A: question 2") == len("system A: question 2")  # refreshed
    dropped = tree.evict(max_chars=tree.chars - 1)
    assert dropped >= 1
    assert tree.match("system A: question 2") == len("system A: question 2")
    assert tree.match("system A: question 1") < len("system A: question 1")  # oldest leaf
    tree.evict(0)
    assert tree.chars == 0 and tree.match("system") == 0
    tree.insert("again")
    tree.clear()
    assert tree.chars == 0 and tree.match("again") == 0


# --- routing texts --------------------------------------------------------------------
def test_routing_texts_of_each_api() -> None:
    assert routing_texts("/generate", {"text": "hi"}) == ["hi"]
    assert routing_texts("/generate", {"text": ["a", "b"]}) == ["a", "b"]
    assert routing_texts("/generate", {"input_ids": [72, 105]}) == ["Hi"]
    assert routing_texts("/generate", {"input_ids": [[72], [105]]}) == ["H", "i"]
    assert routing_texts("/v1/completions", {"prompt": "x"}) == ["x"]
    assert routing_texts("/v1/completions", {"prompt": [1, 2]}) == [ids_text([1, 2])]
    assert ids_text([-1, 0x110000]) == "<-1><1114112>"
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": [{"type": "text", "text": "U"}]},
    ]
    text = routing_texts("/v1/chat/completions", {"messages": messages})
    assert text == ["<|system|>S\n<|user|>U\n"]
    longer = chat_text([*messages, {"role": "assistant", "content": "A"}])
    assert longer.startswith(text[0])  # a conversation's next turn extends its text
    assert chat_text(messages, tools=[{"type": "function"}]).startswith('[{"type": "function"}]')
    assert routing_texts("/tokenize", {"prompt": "x"}) == []
    assert routing_texts("/generate", ["not", "a", "dict"]) == []


# --- policies -------------------------------------------------------------------------
def routing(policy: str = "cache_aware", workers: Sequence[str] = (A, B), **kw: Any) -> Routing:
    config = RouterConfig(workers=tuple(workers), policy=policy, **kw)
    pool = WorkerPool(config)
    for worker in pool.workers:
        worker.healthy = True
    return Routing(config, pool)


def test_cache_aware_sends_a_prefix_back_where_it_went_and_new_prefixes_to_the_emptiest() -> None:
    r = routing()
    system_1, system_2 = "You are a pirate. " * 10, "You are a lawyer. " * 10
    first = r.choose([system_1 + "Q1"], None)
    second = r.choose([system_2 + "Q1"], None)
    assert first is not None and second is not None
    assert (first.reason, second.reason) == ("new_prefix", "new_prefix")
    assert first.worker is not second.worker  # the smallest tree gets a new prefix
    for q in ("Q2", "Q3"):
        again = r.choose([system_1 + q], None)
        assert again is not None and again.worker is first.worker
        assert again.reason == "cache_hit" and again.matched_chars >= len(system_1)


def test_cache_aware_falls_back_to_the_least_loaded_when_the_load_is_imbalanced() -> None:
    r = routing(balance_abs_threshold=4, balance_rel_threshold=1.5)
    text = "shared system prompt " * 5
    home = r.choose([text], None)
    assert home is not None
    home.worker.in_flight = 5
    decision = r.choose([text + "more"], None)
    assert decision is not None and decision.reason == "balance"
    assert decision.worker is not home.worker
    spill = decision.worker  # now holds the prefix too
    home.worker.in_flight, spill.in_flight = 4, 1  # 4 - 1 is not more than 4: balanced
    decision = r.choose([text + "again"], None)
    assert decision is not None and decision.reason == "cache_hit"
    assert decision.worker is spill  # equal matches: the less loaded
    decision = r.choose([text + "more and more"], None)
    assert decision is not None and decision.worker is spill  # the longer match


def test_round_robin_cycles_over_the_available_workers() -> None:
    r = routing("round_robin", workers=(A, B, C))
    order = [r.choose(["same text"], None) for _ in range(4)]
    assert [d.worker.url for d in order if d] == [A, B, C, A]
    r.pool[B].healthy = False
    assert [d.worker.url for d in (r.choose(["x"], None) for _ in range(3)) if d] == [C, A, C]
    assert r.choose(["x"], None, exclude=frozenset({A, C})) is None


def test_a_session_stays_on_its_worker_until_that_worker_is_gone() -> None:
    r = routing(max_sessions=2)
    first = r.choose(["alpha"], "s1")
    assert first is not None
    for text in ("beta", "gamma", "something else entirely"):
        d = r.choose([text], "s1")
        assert d is not None and d.worker is first.worker and d.reason == "session"
    other = next(w for w in r.pool.workers if w is not first.worker)
    moved = r.choose(["alpha"], "s1", exclude=frozenset({first.worker.url}))
    assert moved is not None and moved.worker is other  # re-pinned
    d = r.choose(["beta"], "s1")
    assert d is not None and d.worker is other
    r.choose(["x"], "s2")
    r.choose(["y"], "s3")  # the table keeps 2 sessions: s1 is forgotten
    assert "s1" not in r._sessions and set(r._sessions) == {"s2", "s3"}


def test_requests_without_text_go_to_the_least_loaded_worker_and_flush_forgets() -> None:
    r = routing()
    r.pool[A].in_flight = 3
    d = r.choose([], None)
    assert d is not None and d.worker.url == B and d.reason == "any"
    r.choose(["remembered"], None)
    r.forget_all()
    assert all(w.tree.chars == 0 for w in r.pool.workers)


def test_trees_are_bounded_by_max_tree_chars() -> None:
    r = routing(workers=(A,), max_tree_chars=100)
    for i in range(50):
        r.choose([f"{i:04d}" + "x" * 20], None)
    assert r.pool[A].tree.chars <= 100


def test_router_config_checks_its_values() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        RouterConfig(workers=())
    with pytest.raises(ValueError, match="policy"):
        RouterConfig(workers=(A,), policy="random")
    with pytest.raises(ValueError, match="twice"):
        RouterConfig(workers=(A, A))
    with pytest.raises(ValueError, match="http://"):
        RouterConfig(workers=("a:1",))
    assert normalize_url("a:1/") == "http://a:1"
    assert normalize_url("https://b:2") == "https://b:2"


# --- metrics, worker flags ------------------------------------------------------------
def test_worker_metrics_are_merged_per_family_with_a_worker_label() -> None:
    page = (
        "# HELP plait_x X.\n# TYPE plait_x gauge\nplait_x 1\n"
        '# HELP plait_h H.\n# TYPE plait_h histogram\nplait_h_bucket{le="1.0"} 2\nplait_h_sum 3\n'
    )
    lines = merge_worker_metrics([(A, page), (B, page.replace(" 1\n", " 7\n"))])
    assert lines.count("# TYPE plait_x gauge") == 1
    x = lines.index("# TYPE plait_x gauge")
    assert lines[x + 1 : x + 3] == [f'plait_x{{worker="{A}"}} 1', f'plait_x{{worker="{B}"}} 7']
    assert f'plait_h_bucket{{worker="{B}",le="1.0"}} 2' in lines
    assert labelled("# comment", A) == "# comment"
    pool = WorkerPool(RouterConfig(workers=(A, B)))
    pool.workers[0].routed = 5
    assert f'plait_router_requests_total{{worker="{A}"}} 5' in router_lines(pool.workers)


def test_worker_command_passes_the_engine_flags_that_differ_from_the_defaults() -> None:
    engine = EngineConfig(
        kv_tokens=4096, disable_radix_cache=True, enable_jump_forward=False, num_threads=1
    )
    settings = ServerSettings(model_name="m", max_body_bytes=1000, health_stall_s=2.5)
    keys = AccessKeys(api=("k",))
    args = ServerArgs(engine=engine, settings=settings, log_level="warning", keys=keys)
    command = worker_command(args, engine, 1234)
    flags = command[command.index("serve") + 1 :]
    assert flags == [
        "--host", "127.0.0.1", "--port", "1234", "--log-level", "warning",
        "--served-model-name", "m", "--max-body-bytes", "1000", "--health-stall-timeout", "2.5",
        "--kv-tokens", "4096", "--disable-radix-cache", "--no-enable-jump-forward",
        "--num-threads", "1",
    ]  # fmt: skip
    assert "k" not in command  # keys reach the workers through a file


def test_worker_key_files_hold_the_keys_and_only_the_user_reads_them() -> None:
    keys = AccessKeys(api=("k1", "k2"), admin=("root",))
    procs = WorkerProcesses(ServerArgs(keys=keys), 2)
    flags = procs._key_flags()
    assert flags[0::2] == ["--api-key-file", "--admin-api-key-file"]
    assert read_keys(flags[1]) == ["k1", "k2"] and read_keys(flags[3]) == ["root"]
    assert os.stat(flags[1]).st_mode & 0o777 == 0o600
    procs.stop()
    assert procs.key_dir is not None and not os.path.exists(procs.key_dir)


# --- SGLang's Model Gateway as the router of --dp -------------------------------------
def pairs(flags: list[str]) -> dict[str, str]:
    """{flag: its value} of the flags that take one value."""
    return {f: v for f, v in zip(flags, flags[1:], strict=False) if f.startswith("--")
            and not v.startswith("--")}  # fmt: skip


def test_gateway_flags_carry_the_router_flags_and_never_the_key() -> None:
    config = RouterConfig(
        workers=(A, B), host="0.0.0.0", port=8000, policy="round_robin", cache_threshold=0.25,
        balance_abs_threshold=7, balance_rel_threshold=2.5, max_tree_chars=1000,
        health_interval_s=0.2, log_level="warning", api_keys=("k1", "k2"),
    )  # fmt: skip
    flags = gateway_flags(config, metrics_port=9100)
    assert flags[flags.index("--worker-urls") + 1 :][:2] == [A, B]
    assert pairs(flags) | {"--worker-urls": ""} == {
        "--host": "0.0.0.0", "--port": "8000", "--worker-urls": "", "--policy": "round_robin",
        "--cache-threshold": "0.25", "--balance-abs-threshold": "7",
        "--balance-rel-threshold": "2.5", "--max-tree-size": "1000",
        "--prometheus-host": "0.0.0.0", "--prometheus-port": "9100", "--log-level": "warn",
        "--shutdown-grace-period-secs": "3", "--health-check-interval-secs": "1",
        "--health-check-timeout-secs": "2", "--health-failure-threshold": "2",
        "--health-success-threshold": "1", "--retry-max-retries": "9",
        "--retry-initial-backoff-ms": "100", "--retry-max-backoff-ms": "1000",
        "--retry-backoff-multiplier": "2", "--retry-jitter-factor": "0.2",
    }  # fmt: skip
    assert "--disable-circuit-breaker" in flags and not {"k1", "k2"} & set(flags)


def backoffs(attempts: int) -> list[float]:
    """The gateway's waits between `attempts` attempts: 0.1 s doubling, at most 1 s."""
    return [min(1.0, 0.1 * 2**k) for k in range(attempts - 1)]


@pytest.mark.parametrize("interval_s", [0.2, 1, 1.5, 3, 10])
def test_retries_outlast_the_health_checks_with_the_fewest_attempts(interval_s: float) -> None:
    config = RouterConfig(workers=(A,), health_interval_s=interval_s)
    flags = pairs(failover_flags(config))
    interval = int(flags["--health-check-interval-secs"])
    assert interval == max(1, math.ceil(interval_s))
    span = (config.health_failures + 1) * interval + 1  # the checks, one interval, a second
    n = int(flags["--retry-max-retries"])
    assert sum(backoffs(n)) * 0.8 >= span > sum(backoffs(n - 1)) * 0.8


def test_the_documented_gateway_command_uses_the_failover_flags() -> None:
    """docs/scale.md's command for workers behind the gateway by hand has the failover flags
    `plait serve --dp N --router sglang` gives it (at plait's default health interval)."""
    text = (Path(__file__).resolve().parents[1] / "docs/scale.md").read_text()
    block = re.search(r"python -m sglang_router\.launch_router (.*?)\n\n", text, re.S)
    assert block is not None
    documented = block.group(1).replace("\\\n", " ").split()
    expected = failover_flags(RouterConfig(workers=(A,)))
    assert {f: pairs(documented).get(f) for f in pairs(expected)} == pairs(expected)
    assert "--disable-circuit-breaker" in documented


def test_the_gateway_gets_its_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    launched: list[list[str]] = []
    fake = types.ModuleType("sglang_router.launch_router")
    fake.parse_router_args = list  # type: ignore[attr-defined]
    fake.launch_router = launched.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sglang_router.launch_router", fake)
    monkeypatch.setenv(gateway.KEY_ENV, "s3cret")
    gateway.main(["--port", "1"])
    assert launched == [["--port", "1", "--api-key", "s3cret"]]
    assert gateway.KEY_ENV not in os.environ  # not passed on to anything it starts
    gateway.main(["--port", "1"])
    assert launched[1] == ["--port", "1"]


def test_router_sglang_without_the_package_fails_before_starting_workers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(gateway.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="pip install sglang-router"):
        gateway.require_gateway()
    assert serve_dp(ServerArgs(), 2, router="sglang") == 1
    assert "pip install sglang-router" in caplog.text and "worker 0" not in caplog.text
    assert serve_dp(ServerArgs(), 2, router="nginx") == 1
    assert "--router must be one of ('plait', 'sglang')" in caplog.text
    with pytest.raises(SystemExit):  # a parser error: --router routes between --dp workers
        cli_main(["serve", "--router", "sglang"])


# --- the frontend's session key -------------------------------------------------------
class SessionRecorder(Backend):
    """Records the session key in effect for every request."""

    def __init__(self) -> None:
        self.sessions: list[str | None] = []

    @property
    def chat_template(self) -> ChatTemplate:
        return ChatTemplate.from_jinja(CHATML)

    async def generate(
        self, text: str, params: dict[str, Any], *, on_text: OnText | None = None
    ) -> GenOutput:
        self.sessions.append(session_headers().get(SESSION_HEADER))
        return GenOutput("ok", {"finish_reason": {"type": "stop"}})

    async def score(
        self, prefix: str, choices: Sequence[str], *, unconditional: bool = False
    ) -> list[ChoiceLogprobs]:
        raise NotImplementedError

    async def cache_prefix(self, text: str) -> dict[str, Any]:
        self.sessions.append(current_session.get())
        return {}


@plait.program
def forked(s):  # type: ignore[no-untyped-def]
    s += "Question: " + plait.gen("q")
    forks = s.fork(3)
    for i, branch in enumerate(forks):
        branch += plait.gen(f"a{i}")
    forks.join()
    s += plait.gen("end")


def test_one_session_key_per_program_run_shared_by_its_forks() -> None:
    backend = SessionRecorder()
    forked.run(backend=backend)
    first_run = list(backend.sessions)
    assert len(first_run) >= 5 and None not in first_run
    assert len(set(first_run)) == 1
    forked.run(backend=backend)
    second_run = backend.sessions[len(first_run) :]
    assert len(set(second_run)) == 1 and second_run[0] != first_run[0]
    assert session_headers() == {}  # outside a run: no header


def test_the_launcher_takes_exited_workers_out_and_stops_when_none_is_left() -> None:
    workers = WorkerProcesses(ServerArgs(), 2)
    workers.procs = [subprocess.Popen(["true"], start_new_session=True) for _ in range(2)]
    pool = WorkerPool(RouterConfig(workers=tuple(workers.urls)))
    for worker in pool.workers:
        worker.healthy = True
    called: list[bool] = []
    asyncio.run(asyncio.wait_for(workers.watch(pool, lambda: called.append(True)), 10))
    assert called == [True] and workers.exited == {0, 1}
    assert all(w.dead and not w.available for w in pool.workers)
    workers.stop()  # nothing left to stop: returns at once

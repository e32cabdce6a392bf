"""`make soak`: minutes of mixed valid and hostile traffic against one `plait serve`.

    python -m benchmarks.soak [--minutes 10] [--clients 8] [--out benchmarks/results]

Starts a server (plait-tiny, two client keys and an admin key, a profile directory), then
`--clients` loops each send a request drawn from `TRAFFIC` (valid completions, chats,
constrained and streamed requests, disconnects, and the hostile requests of issue 18) until
the time is up. Every answer is checked against what that kind of request must get (a 200,
or the 4xx that names its problem); /health is polled throughout. Reports requests served,
answers by kind and status, anything unexpected, /health's slowest answer, and the RSS of
each server process (main, scheduler, detokenizer, grammar workers) at start and end; writes
`soak.json` under `--out`. Exits 1 if anything was unexpected or the server died.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import RESULTS
from plait.runtime import Runtime

MODEL = "plait-tiny"
KEYS = ("soak-alice", "soak-bob")
ADMIN = "soak-admin"
Send = Callable[[httpx.AsyncClient, random.Random], Awaitable[tuple[int, str]]]


@dataclass(frozen=True)
class Kind:
    """One kind of request: how often it is drawn, how to send it, the statuses it may get."""

    name: str
    weight: int
    send: Send
    expect: frozenset[int]


def body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "The soak test says", "max_tokens": 16, **extra}


async def post(client: httpx.AsyncClient, path: str, payload: Any) -> tuple[int, str]:
    if isinstance(payload, bytes):
        headers = {"content-type": "application/json"}
        r = await client.post(path, content=payload, headers=headers)
    else:
        r = await client.post(path, json=payload)
    return r.status_code, r.text[:200]


def sender(path: str, make: Callable[[random.Random], Any]) -> Send:
    return lambda client, rng: post(client, path, make(rng))


async def stream_then_drop(client: httpx.AsyncClient, rng: random.Random) -> tuple[int, str]:
    """Read a few events of a long stream, then disconnect."""
    payload = body(max_tokens=2000, ignore_eos=True, stream=True, temperature=0.7)
    async with client.stream("POST", "/v1/completions", json=payload) as r:
        seen = 0
        async for line in r.aiter_lines():
            seen += line.startswith("data:")
            if seen >= rng.randint(1, 8):
                break
        return r.status_code, ""


async def streamed(client: httpx.AsyncClient, rng: random.Random) -> tuple[int, str]:
    payload = {"text": "Stream this", "stream": True,
               "sampling_params": {"max_new_tokens": 32, "regex": "[a-z ]{8,64}"}}  # fmt: skip
    async with client.stream("POST", "/generate", json=payload) as r:
        lines = [line async for line in r.aiter_lines()]
    done = "data: [DONE]" in lines and not any('"error"' in line for line in lines)
    return (r.status_code if done else 599), ""


def enum_schema(n: int) -> str:
    return json.dumps({"enum": [f"item {i} of the list" for i in range(n)]})


TRAFFIC = [
    Kind("completion", 20, sender("/v1/completions", lambda r: body(temperature=r.random())),
         frozenset({200})),
    Kind("completion_n2_logprobs", 5,
         sender("/v1/completions", lambda r: body(n=2, logprobs=3, seed=r.randint(0, 99))),
         frozenset({200})),
    Kind("chat", 10, sender("/v1/chat/completions", lambda r: {
        "model": MODEL, "max_tokens": 12, "messages": [{"role": "user", "content": "Hello"}]}),
         frozenset({200})),
    Kind("json_schema", 6, sender("/generate", lambda r: {"text": "JSON:", "sampling_params": {
        "max_new_tokens": 24, "json_schema": json.dumps(
            {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})}}),
         frozenset({200})),
    Kind("streamed_regex", 6, streamed, frozenset({200})),
    Kind("stream_then_drop", 4, stream_then_drop, frozenset({200})),
    Kind("huge_top_k", 2, sender("/v1/completions", lambda r: body(top_k=2**70)),
         frozenset({400})),
    Kind("huge_seed", 2, sender("/generate", lambda r: {"text": "x", "sampling_params": {
        "seed": 2**64}}), frozenset({400})),
    Kind("huge_enum", 2, sender("/generate", lambda r: {"text": "x", "sampling_params": {
        "json_schema": enum_schema(20000)}}), frozenset({400})),
    Kind("big_enum_allowed", 1, sender("/generate", lambda r: {"text": "x", "sampling_params": {
        "json_schema": enum_schema(2000 + r.randint(0, 500)), "max_new_tokens": 4}}),
         frozenset({200})),
    Kind("huge_regex", 2, sender("/generate", lambda r: {"text": "x", "sampling_params": {
        "regex": "a{1000000}"}}), frozenset({400})),
    Kind("request_chat_template", 2, sender("/v1/chat/completions", lambda r: {
        "model": MODEL, "messages": [{"role": "user", "content": "x"}],
        "chat_template_kwargs": {"chat_template": "{{ 'a' * 1000000000 }}"}}), frozenset({400})),
    Kind("too_long_prompt", 1, sender("/v1/completions", lambda r: body(prompt="word " * 400000)),
         frozenset({400})),
    Kind("body_over_limit", 1, sender("/v1/completions", lambda r: b"[" + b"1," * (9 << 20)
                                      + b"1]"), frozenset({413})),
    Kind("lone_surrogate", 2, sender("/v1/completions", lambda r:
         b'{"model": "plait-tiny", "prompt": "\\ud800"}'), frozenset({400})),
    Kind("huge_temperature", 2, sender("/v1/completions", lambda r: body(temperature=1e308)),
         frozenset({400})),
    Kind("profile_escape", 1, sender("/start_profile", lambda r: {"output_dir": "/proc/self/x"}),
         frozenset({400})),
    Kind("abort_all_non_admin", 1, sender("/abort_request", lambda r: {"abort_all": True}),
         frozenset({403})),
    Kind("abort_random_rid", 2, sender("/abort_request", lambda r: {"rid": f"{r.random()}"}),
         frozenset({200})),
    Kind("malformed_json", 2, sender("/v1/completions", lambda r: b'{"model": "pla'),
         frozenset({400})),
    Kind("out_of_vocab_ids", 1, sender("/generate", lambda r: {"input_ids": [10**7]}),
         frozenset({400})),
]  # fmt: skip


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def processes(root: int) -> dict[str, float]:
    """RSS (MiB) of the server and its descendants, by process name (name#pid if repeated)."""
    out: dict[str, float] = {"main": rss_mib(root)}
    todo = [root]
    while todo:
        parent = todo.pop()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) != parent:
                    continue
                pid = int(stat.parent.name)
                name = Path(f"/proc/{pid}/comm").read_text().strip()
                out[name if name not in out else f"{name}#{pid}"] = rss_mib(pid)
                todo.append(pid)
            except (OSError, ValueError, IndexError):
                continue
    return out


def settled(root: int, timeout: float = 300.0) -> dict[str, float]:
    """RSS once the grammar workers have started (they import plait: seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = processes(root)
        if sum(name.startswith("plait-grammar") for name in found) >= 1:
            return found
        time.sleep(0.5)
    return processes(root)


class Soak:
    """The client loops, the health poller and the tallies."""

    def __init__(self, url: str, *, seconds: float, clients: int, seed: int) -> None:
        self.url, self.seconds, self.clients = url, seconds, clients
        self.rng = random.Random(seed)
        self.by_kind: Counter[tuple[str, int]] = Counter()
        self.unexpected: list[str] = []
        self.health_slowest = 0.0
        self.health_bad = 0

    async def run(self) -> None:
        deadline = time.monotonic() + self.seconds
        loops = [self._client(i, deadline) for i in range(self.clients)]
        await asyncio.gather(self._health(deadline), *loops)

    async def _client(self, i: int, deadline: float) -> None:
        key = KEYS[i % len(KEYS)]
        rng = random.Random(self.rng.random())
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=self.url, headers=headers, timeout=300) as client:
            while time.monotonic() < deadline:
                kind = rng.choices(TRAFFIC, weights=[k.weight for k in TRAFFIC])[0]
                try:
                    status, text = await kind.send(client, rng)
                except httpx.HTTPError as exc:
                    status, text = 0, repr(exc)
                self.by_kind[(kind.name, status)] += 1
                if status not in kind.expect:
                    self.unexpected.append(f"{kind.name}: {status} {text}")

    async def _health(self, deadline: float) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as client:
            while time.monotonic() < deadline:
                start = time.monotonic()
                status = (await client.get("/health")).status_code
                self.health_slowest = max(self.health_slowest, time.monotonic() - start)
                self.health_bad += status != 200
                await asyncio.sleep(0.5)


def report(soak: Soak, start_rss: dict[str, float], end_rss: dict[str, float]) -> dict[str, Any]:
    served = sum(n for (_, status), n in soak.by_kind.items() if status == 200)
    return {
        "minutes": soak.seconds / 60,
        "clients": soak.clients,
        "requests": sum(soak.by_kind.values()),
        "served_200": served,
        "answers": {f"{kind} {status}": n for (kind, status), n in sorted(soak.by_kind.items())},
        "unexpected": soak.unexpected[:50],
        "unexpected_count": len(soak.unexpected),
        "health_slowest_s": round(soak.health_slowest, 3),
        "health_not_200": soak.health_bad,
        "rss_mib_start": {k: round(v, 1) for k, v in start_rss.items()},
        "rss_mib_end": {k: round(v, 1) for k, v in end_rss.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        (Path(home) / "keys").write_text("\n".join(KEYS) + "\n")
        (Path(home) / "admin").write_text(ADMIN + "\n")
        flags = {"kv_tokens": 16384, "api_key_file": Path(home) / "keys",
                 "admin_api_key_file": Path(home) / "admin", "profile_dir": Path(home) / "prof",
                 "max_body_bytes": 8 << 20}  # fmt: skip
        with Runtime(MODEL, **flags) as rt:
            start_rss = settled(rt.pid)
            soak = Soak(rt.url, seconds=args.minutes * 60, clients=args.clients, seed=args.seed)
            asyncio.run(soak.run())
            alive = rt.process.poll() is None
            end_rss = processes(rt.pid) if alive else {}
    result = {**report(soak, start_rss, end_rss), "server_alive": alive}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if alive and not soak.unexpected and not soak.health_bad else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Data parallelism: cache-aware routing vs round robin on a multi-tenant workload, through
plait's router or SGLang's Model Gateway.

    python -m benchmarks.dp_router [--quick] [--model plait-tiny] [--concurrency 4]
    python -m benchmarks.dp_router --router plait sglang --repeats 3 --out dp_router_gateway

8 tenants, each with its own system prompt of a few hundred tokens, send 32 chat requests
each (a short user question, 16 new tokens), all 256 arriving interleaved in a seeded random
order (a strictly cyclic order would pin each tenant to one worker under round robin with an
even number of workers and tenants, by accident), with `--concurrency` requests in flight.
`plait serve --dp 2 --router R` runs once per router and policy (`--router`: plait's router,
SGLang's Model Gateway, or both; `--policy`: cache_aware, round_robin, or both), the systems
interleaved, `--repeats` times; each worker's KV pool (`--kv-tokens`, 3000) holds the prompts
of the 4 tenants cache-aware routing gives it and the requests running, but not all 8, which
round robin makes every worker see: the regime where routing decides what the caches hold.
(With a pool that holds every prompt, round robin computes each prompt once per worker
instead of once, and the hit rates differ by a few percent; docs/scale.md has the bound.)

Reported per run: the cached-token hit rate (sum of `usage.prompt_tokens_details.
cached_tokens` over sum of `prompt_tokens`, checked against the workers' own
`plait_cache_hit_tokens_total`), requests and tokens per second, p50/p90 latency, how the
requests spread over the workers (their `plait_requests_finished_total`), the tenants whose
requests all went to one worker (plait's router names the worker in a header; the gateway
does not), and the load average around the run; per system, the medians. Target (plait's
router): cache_aware's hit rate >= 1.8x round robin's, and its throughput higher. Writes
`results/dp_router.json` (or `--out`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from typing import Any

import httpx
from transformers import AutoTokenizer

from benchmarks.common import markdown_table, setup_torch, write_results
from benchmarks.workloads.text import TextMaker
from plait.backend.model.builtin import resolve_model_path
from plait.backend.router.config import POLICIES, WORKER_HEADER
from plait.backend.router.launcher import ROUTERS
from plait.backend.server.metrics import parse_metrics
from plait.runtime import Runtime, free_port

TARGET_HIT_RATIO = 1.8
READY_TIMEOUT_S = 120.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="plait-tiny")
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--requests-per-tenant", type=int, default=32)
    parser.add_argument("--prefix-tokens", type=int, default=600)
    parser.add_argument("--question-tokens", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--kv-tokens", type=int, default=3000, help="per worker")
    parser.add_argument("--router", nargs="+", choices=ROUTERS, default=["plait"])
    parser.add_argument("--policy", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--repeats", type=int, default=1, help="runs per system, interleaved")
    parser.add_argument("--quick", action="store_true", help="4 tenants x 8 requests")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="results/<OUT>.json (default dp_router)")
    return parser.parse_args(argv)


def make_requests(ns: argparse.Namespace) -> list[tuple[int, list[dict[str, str]]]]:
    """(tenant, chat messages) in a seeded random interleaving."""
    maker = TextMaker(AutoTokenizer.from_pretrained(resolve_model_path(ns.model)), seed=ns.seed)
    systems = [f"Tenant {t}." + maker.passage(ns.prefix_tokens) for t in range(ns.tenants)]
    requests = [
        (t, [{"role": "system", "content": systems[t]},
             {"role": "user", "content": maker.passage(ns.question_tokens).strip()}])
        for t in range(ns.tenants)
        for _ in range(ns.requests_per_tenant)
    ]  # fmt: skip
    random.Random(ns.seed).shuffle(requests)
    return requests


async def run_workload(
    url: str, requests: list[tuple[int, list[dict[str, str]]]], ns: argparse.Namespace
) -> dict[str, Any]:
    limit = asyncio.Semaphore(ns.concurrency)
    results: list[dict[str, Any]] = []

    async def one(client: httpx.AsyncClient, tenant: int, messages: list[Any]) -> None:
        body = {"model": ns.model, "messages": messages, "max_tokens": ns.max_tokens,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        async with limit:
            start = time.perf_counter()
            resp = await client.post(url + "/v1/chat/completions", json=body)
            resp.raise_for_status()
            usage = resp.json()["usage"]
            results.append({
                "tenant": tenant,
                "latency": time.perf_counter() - start,
                "worker": resp.headers.get(WORKER_HEADER),
                "prompt": usage["prompt_tokens"],
                "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
                "completion": usage["completion_tokens"],
            })  # fmt: skip

    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()
        await asyncio.gather(*(one(client, t, messages) for t, messages in requests))
        elapsed = time.perf_counter() - start
    return summarize(results, elapsed)


def summarize(results: list[dict[str, Any]], elapsed: float) -> dict[str, Any]:
    prompt = sum(r["prompt"] for r in results)
    cached = sum(r["cached"] for r in results)
    tokens = prompt + sum(r["completion"] for r in results)
    latencies = sorted(r["latency"] for r in results)
    homes: dict[int, set[str]] = {}
    for r in results:
        homes.setdefault(r["tenant"], set()).add(r["worker"])
    named = all(r["worker"] for r in results)
    return {
        "requests": len(results),
        "seconds": elapsed,
        "hit_rate": cached / prompt if prompt else 0.0,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "completion_tokens": sum(r["completion"] for r in results),
        "requests_per_s": len(results) / elapsed,
        "tokens_per_s": tokens / elapsed,
        "p50_latency_s": statistics.median(latencies),
        "p90_latency_s": latencies[int(0.9 * (len(latencies) - 1))],
        "tenants_on_one_worker": sum(len(h) == 1 for h in homes.values()) if named else None,
    }


def worker_urls(url: str) -> list[str]:
    """The workers behind the router, once it lists every one healthy (both routers answer
    /workers with {"workers": [{"url", "healthy" or "is_healthy"}]})."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        listed = httpx.get(url + "/workers", timeout=30).json()["workers"]
        if len(listed) == 2 and all(w.get("healthy", w.get("is_healthy")) for w in listed):
            return sorted(w["url"] for w in listed)
        time.sleep(0.2)
    raise TimeoutError("the router did not list two healthy workers")


def worker_counters(urls: list[str]) -> list[dict[str, float]]:
    """Per worker: cache-hit tokens, prompt tokens, finished requests (its own /metrics)."""
    counters = []
    for url in urls:
        samples = parse_metrics(httpx.get(url + "/metrics", timeout=30).text)
        total = {name: sum(v for k, v in samples.items() if k.startswith(f"plait_{name}"))
                 for name in ("cache_hit_tokens_total", "prompt_tokens_total",
                              "requests_finished_total")}  # fmt: skip
        counters.append(total)
    return counters


def run_system(
    router: str, policy: str, requests: list[Any], ns: argparse.Namespace
) -> dict[str, Any]:
    flags: dict[str, Any] = {"dp": 2, "router": router, "router_policy": policy,
                             "kv_tokens": ns.kv_tokens}  # fmt: skip
    if router == "sglang":
        flags["gateway_metrics_port"] = free_port()
    with Runtime(model=ns.model, **flags) as rt:
        urls = worker_urls(rt.url)
        warm = {"model": ns.model, "prompt": "warm up", "max_tokens": 4}
        for _ in range(4):
            httpx.post(rt.url + "/v1/completions", json=warm, timeout=120).raise_for_status()
        httpx.post(rt.url + "/flush_cache", timeout=60).raise_for_status()
        before, load_before = worker_counters(urls), os.getloadavg()[0]
        out = asyncio.run(run_workload(rt.url, requests, ns))
        after, load_after = worker_counters(urls), os.getloadavg()[0]
    delta = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
    hits, prompt = (sum(d[k] for d in delta) for k in ("cache_hit_tokens_total",
                                                        "prompt_tokens_total"))  # fmt: skip
    out["metrics_hit_rate"] = hits / max(prompt, 1.0)
    out["per_worker"] = sorted((int(d["requests_finished_total"]) for d in delta), reverse=True)
    out["load_average"] = [round(load_before, 2), round(load_after, 2)]
    print(f"{router} {policy}: {out}", flush=True)
    return out


MEDIANS = ("hit_rate", "metrics_hit_rate", "requests_per_s", "tokens_per_s", "p50_latency_s",
           "p90_latency_s")  # fmt: skip


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in MEDIANS}


def report(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Print the table of medians (and each run's figures); the ratios of plait's policies."""
    summary = {name: medians(rs) for name, rs in runs.items()}
    rows = [
        [name, m["hit_rate"], m["metrics_hit_rate"], m["requests_per_s"], m["tokens_per_s"],
         m["p50_latency_s"], m["p90_latency_s"],
         " / ".join(f"{r['hit_rate']:.3f}, {r['requests_per_s']:.1f}" for r in runs[name]),
         " ".join("/".join(map(str, r["per_worker"])) for r in runs[name]),
         " ".join(str(r["tenants_on_one_worker"]) for r in runs[name]),
         " ".join(f"{r['load_average'][0]}-{r['load_average'][1]}" for r in runs[name])]
        for name, m in summary.items()
    ]  # fmt: skip
    header = ["router policy", "hit rate", "hit rate (metrics)", "req/s", "tok/s", "p50 s",
              "p90 s", "each run: hit rate, req/s", "requests per worker",
              "tenants on one worker", "load average"]  # fmt: skip
    print("medians over", max(len(rs) for rs in runs.values()), "runs per system")
    print(markdown_table(header, rows))
    out: dict[str, Any] = {"medians": summary}
    ca, rr = summary.get("plait cache_aware"), summary.get("plait round_robin")
    if ca and rr:
        out["hit_rate_ratio"] = ca["hit_rate"] / max(rr["hit_rate"], 1e-9)
        out["throughput_ratio"] = ca["tokens_per_s"] / rr["tokens_per_s"]
        out["targets_met"] = (
            out["hit_rate_ratio"] >= TARGET_HIT_RATIO and out["throughput_ratio"] > 1.0
        )
        verdict = "met" if out["targets_met"] else "NOT met"
        print(f"plait's router: hit-rate ratio {out['hit_rate_ratio']:.2f}x (target >= "
              f"{TARGET_HIT_RATIO}x), throughput ratio {out['throughput_ratio']:.2f}x "
              f"(target > 1): {verdict}")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    setup_torch()
    ns = parse_args(argv)
    if ns.quick:
        ns.tenants, ns.requests_per_tenant = 4, 8
    requests = make_requests(ns)
    systems = [(router, policy) for router in ns.router for policy in ns.policy]
    runs: dict[str, list[dict[str, Any]]] = {f"{r} {p}": [] for r, p in systems}
    for _ in range(ns.repeats):  # interleaved: each repetition runs every system once
        for router, policy in systems:
            runs[f"{router} {policy}"].append(run_system(router, policy, requests, ns))
    summary = report(runs)
    settings = {k: v for k, v in vars(ns).items() if k not in ("quick", "out")}
    path = write_results(
        ns.out or "dp_router" + ("_quick" if ns.quick else ""),
        {"settings": settings, "runs": runs, **summary},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

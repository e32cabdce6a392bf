"""Data parallelism: the cache-aware router vs round robin on a multi-tenant workload.

    python -m benchmarks.dp_router [--quick] [--model plait-tiny] [--concurrency 4]

8 tenants, each with its own system prompt of a few hundred tokens, send 32 chat requests
each (a short user question, 16 new tokens), all 256 arriving interleaved in a seeded random
order (a strictly cyclic order would pin each tenant to one worker under round robin with an
even number of workers and tenants, by accident), with `--concurrency` requests in flight.
`plait serve --dp 2` runs once per policy; each worker's KV pool (`--kv-tokens`, 3000) holds
the prompts of the 4 tenants cache-aware routing gives it and the requests running, but not
all 8, which round robin makes every worker see: the regime where routing decides what the
caches hold. (With a pool that holds every prompt, round robin computes each prompt once per
worker instead of once, and the hit rates differ by a few percent; docs/scale.md has the
bound.)

Reported per policy: the cached-token hit rate (sum of `usage.prompt_tokens_details.
cached_tokens` over sum of `prompt_tokens`, checked against the workers'
`plait_cache_hit_tokens_total` in the router's /metrics), requests and tokens per second,
p50/p90 latency, and how the requests spread over the workers. Target: cache_aware's hit rate
>= 1.8x round robin's, and its throughput higher. Writes `results/dp_router.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from typing import Any

import httpx
from transformers import AutoTokenizer

from benchmarks.common import markdown_table, setup_torch, write_results
from benchmarks.workloads.text import TextMaker
from plait.backend.model.builtin import resolve_model_path
from plait.backend.server.metrics import parse_metrics
from plait.runtime import Runtime

POLICIES = ("cache_aware", "round_robin")
TARGET_HIT_RATIO = 1.8


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
                "worker": resp.headers.get("x-plait-worker"),
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
    spread: dict[str, int] = {}
    homes: dict[int, set[str]] = {}
    for r in results:
        spread[r["worker"]] = spread.get(r["worker"], 0) + 1
        homes.setdefault(r["tenant"], set()).add(r["worker"])
    return {
        "requests": len(results),
        "seconds": elapsed,
        "hit_rate": cached / prompt if prompt else 0.0,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "requests_per_s": len(results) / elapsed,
        "tokens_per_s": tokens / elapsed,
        "p50_latency_s": statistics.median(latencies),
        "p90_latency_s": latencies[int(0.9 * (len(latencies) - 1))],
        "per_worker": sorted(spread.values(), reverse=True),
        "tenants_on_one_worker": sum(len(h) == 1 for h in homes.values()),
    }


def worker_hits(url: str) -> tuple[float, float]:
    """(cache-hit tokens, prompt tokens) over all workers, from the router's /metrics."""
    samples = parse_metrics(httpx.get(url + "/metrics", timeout=30).text)
    hits = sum(v for k, v in samples.items() if k.startswith("plait_cache_hit_tokens_total{"))
    prompt = sum(v for k, v in samples.items() if k.startswith("plait_prompt_tokens_total{"))
    return hits, prompt


def run_policy(policy: str, requests: list[Any], ns: argparse.Namespace) -> dict[str, Any]:
    flags = {"dp": 2, "router_policy": policy, "kv_tokens": ns.kv_tokens}
    with Runtime(model=ns.model, **flags) as rt:
        warm = {"model": ns.model, "prompt": "warm up", "max_tokens": 4}
        for _ in range(4):
            httpx.post(rt.url + "/v1/completions", json=warm, timeout=120).raise_for_status()
        httpx.post(rt.url + "/flush_cache", timeout=60).raise_for_status()
        hits0, prompt0 = worker_hits(rt.url)
        out = asyncio.run(run_workload(rt.url, requests, ns))
        hits1, prompt1 = worker_hits(rt.url)
    out["metrics_hit_rate"] = (hits1 - hits0) / max(prompt1 - prompt0, 1.0)
    print(f"{policy}: {out}", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    setup_torch()
    ns = parse_args(argv)
    if ns.quick:
        ns.tenants, ns.requests_per_tenant = 4, 8
    requests = make_requests(ns)
    results = {policy: run_policy(policy, requests, ns) for policy in POLICIES}
    ca, rr = results["cache_aware"], results["round_robin"]
    ratio = ca["hit_rate"] / max(rr["hit_rate"], 1e-9)
    speedup = ca["tokens_per_s"] / rr["tokens_per_s"]
    rows = [
        [p, r["hit_rate"], r["metrics_hit_rate"], r["requests_per_s"], r["tokens_per_s"],
         r["p50_latency_s"], r["p90_latency_s"], "/".join(map(str, r["per_worker"])),
         r["tenants_on_one_worker"]]
        for p, r in results.items()
    ]  # fmt: skip
    header = ["policy", "hit rate", "hit rate (metrics)", "req/s", "tok/s", "p50 s", "p90 s",
              "requests per worker", "tenants on one worker"]  # fmt: skip
    print(markdown_table(header, rows))
    met = ratio >= TARGET_HIT_RATIO and speedup > 1.0
    verdict = "met" if met else "NOT met"
    print(f"hit-rate ratio {ratio:.2f}x (target >= {TARGET_HIT_RATIO}x), ", end="")
    print(f"throughput ratio {speedup:.2f}x (target > 1): {verdict}")
    settings = {k: v for k, v in vars(ns).items() if k not in ("quick", "out")}
    path = write_results(
        ns.out or "dp_router" + ("_quick" if ns.quick else ""),
        {"settings": settings, "results": results, "hit_rate_ratio": ratio,
         "throughput_ratio": speedup, "targets_met": met},
    )  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

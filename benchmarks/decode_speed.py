"""One-request decode speed on the CPU: plait's fused decode step against its layer-by-layer
path and llama.cpp, on the same GGUF, at 1 and 2 threads.

    python -m benchmarks.decode_speed [--quick] [--threads 1,2] [--reps 5] [--no-llama-cpp]
                                      [--model smollm2-135m|gemma3-270m|path.gguf]
                                      [--kv-tokens 16384]

By default `smollm2-135m` (SmolLM2-135M-Instruct, Q4_1 layers). One worker process per (system,
thread count) keeps its model loaded; every repetition runs each measurement on every worker in turn
(the order reversed every other repetition), and the table gives medians, so each ratio
compares runs interleaved on the same machine at the same time.

- decode: one request, a 30-token chat prompt, 128 greedy tokens (end-of-text banned), tokens
  per second of the whole call (its prefill included, as llama.cpp's is);
- batch16: 16 such prompts x 128 tokens in one call, plait only (fused against layers).

Every worker first runs each measurement once at 8 tokens, untimed (thread pools, scratch
buffers, caches). llama.cpp (llama-cpp-python, the bench extra) is left out when it is not
installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from benchmarks.common import markdown_table, median, write_results
from benchmarks.cpu_peers import MODEL, Job, LlamaCppWorker, _timed

FIXED = {"temperature": 0.0, "ignore_eos": True}
PEER_JOBS = ("decode",)  # llama.cpp runs these too


class PlaitWorker:
    """plait's Engine with `threads` threads, the fused decode step on or off."""

    def __init__(self, model: str, threads: int, kv_tokens: int, *, fused: bool) -> None:
        from plait.backend import Engine

        self.engine = Engine(model, num_threads=threads, kv_tokens=kv_tokens, fused_decode=fused)
        status = self.engine.runtime.runner.fused_decode  # type: ignore[attr-defined]
        if fused and status != "on":
            raise RuntimeError(f"the fused decode step is {status}")

    def run(self, job: Job) -> tuple[float, Any]:
        e = self.engine
        e.flush_cache()
        params = {**FIXED, "max_new_tokens": job.tokens}
        ids = job.prompt if job.name == "decode" else job.prompts
        return _timed(lambda: e.generate(input_ids=ids, sampling_params=params))


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every worker loads: the model (a builtin name or a .gguf path) and plait's KV
    pool."""

    model: str
    kv_tokens: int


def serve(kind: str, threads: int, setup: Setup, conn: Connection) -> None:
    """A worker process: load once, then answer jobs until told to stop."""
    import torch

    torch.set_num_threads(threads)
    worker: Any
    if kind == "llama.cpp":
        worker = LlamaCppWorker(setup.model, threads, setup.kv_tokens)
    else:
        worker = PlaitWorker(setup.model, threads, setup.kv_tokens, fused=kind == "plait fused")
    conn.send("ready")
    while (job := conn.recv()) is not None:
        seconds, out = worker.run(job)
        conn.send((seconds, json.loads(json.dumps(out, default=str))))


def jobs(model: str, tokens: int) -> list[Job]:
    from plait.backend.model.builtin import resolve_model_path
    from plait.backend.text.tokenizer import load_tokenizer

    tok = load_tokenizer(resolve_model_path(model))

    def chat(text: str) -> list[int]:
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        return list(tok.encode(rendered, add_special_tokens=False))

    story = chat("Tell me a long story about a dragon who learns to cook.")
    topics = [chat(f"Write about topic number {i}.") for i in range(16)]
    return [Job("decode", tokens, prompt=story), Job("batch16", tokens, prompts=topics)]


def start(kind: str, threads: int, setup: Setup) -> Connection:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    ctx.Process(target=serve, args=(kind, threads, setup, child), daemon=True).start()
    if parent.recv() != "ready":
        raise RuntimeError(f"{kind} worker did not start")
    return parent


def measure(
    kinds: list[str], threads: list[int], reps: int, todo: list[Job], setup: Setup
) -> dict[str, Any]:
    """seconds[job][worker] over `reps` rotations."""
    workers = {f"{k} T={t}": start(k, t, setup) for t in threads for k in kinds}
    runs = {j.name: [w for w in workers if j.name in PEER_JOBS or "plait" in w] for j in todo}
    seconds: dict[str, dict[str, list[float]]] = {
        j.name: {w: [] for w in runs[j.name]} for j in todo
    }
    for rep in range(-1, reps):  # rep -1: the untimed warm-up
        for job in todo:
            ordered = runs[job.name] if rep % 2 == 0 else list(reversed(runs[job.name]))
            for name in ordered:
                workers[name].send(dataclasses.replace(job, tokens=8) if rep < 0 else job)
                secs, _ = workers[name].recv()
                if rep >= 0:
                    seconds[job.name][name].append(secs)
    for conn in workers.values():
        conn.send(None)
    return seconds


def report(seconds: dict[str, Any], kinds: list[str], threads: list[int], tokens: int) -> str:
    """tok/s per system, fused / layer-by-layer and fused / llama.cpp, per thread count."""
    rows = []
    for job, cells in seconds.items():
        n = tokens * (16 if job == "batch16" else 1)
        for t in threads:
            rate = {k: n / median(cells[f"{k} T={t}"]) for k in kinds if f"{k} T={t}" in cells}
            row: list[Any] = [job, t, *(f"{rate[k]:.1f}" if k in rate else "" for k in kinds)]
            row.append(f"{rate['plait fused'] / rate['plait layers']:.2f}x")
            if "llama.cpp" in kinds:
                peer = rate.get("llama.cpp")
                row.append(f"{rate['plait fused'] / peer:.2f}x" if peer else "")
            rows.append(row)
    header = ["measurement", "threads", *(f"{k} tok/s" for k in kinds), "fused / layers"]
    if "llama.cpp" in kinds:
        header.append("fused / llama.cpp")
    return markdown_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 tokens, one repetition")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--no-llama-cpp", action="store_true")
    parser.add_argument("--model", default=MODEL, help="a builtin name or a .gguf path")
    parser.add_argument("--kv-tokens", type=int, default=16384, help="plait's KV pool")
    args = parser.parse_args()
    from benchmarks.peers.llama_cpp_peer import unavailable_reason

    kinds = ["plait fused", "plait layers"]
    missing = "--no-llama-cpp" if args.no_llama_cpp else unavailable_reason()
    if missing is None:
        kinds.append("llama.cpp")
    threads = [int(t) for t in args.threads.split(",")]
    tokens = 16 if args.quick else 128
    reps = args.reps or (1 if args.quick else 5)
    load = os.getloadavg()
    setup = Setup(args.model, args.kv_tokens)
    seconds = measure(kinds, threads, reps, jobs(args.model, tokens), setup)
    text = report(seconds, kinds, threads, tokens)
    print(text if missing is None else f"{text}\n\nllama.cpp left out: {missing}")
    name = "decode_speed" if args.model == MODEL else f"decode_speed_{Path(args.model).stem}"
    write_results(name, {"model": args.model, "kv_tokens": args.kv_tokens,
                         "seconds": seconds, "threads": threads, "reps": reps,
                                   "load_avg_before": load, "load_avg_after": os.getloadavg(),
                                   "table": text, "quick": args.quick})  # fmt: skip


if __name__ == "__main__":
    main()

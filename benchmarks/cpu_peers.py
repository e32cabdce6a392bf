"""plait against llama.cpp on the real model, on the CPU, at 1 and 2 threads.

    python -m benchmarks.cpu_peers [--quick] [--threads 1,2] [--reps 3] [--warmup 1]

Both systems read the same GGUF file (`smollm2-135m`, SmolLM2-135M-Instruct Q4_1) and get the
same token ids (rendered with plait's tokenizer and chat template). One worker process per
(system, thread count) keeps its model loaded; the workers run each measurement in rotation,
the order reversed every repetition, and the table gives medians. A first rotation is not
recorded (`--warmup 1`): it pays for what a steady user pays once (plait's grammar compile
and its compile worker's start, the first use of each kernel, llama.cpp's first allocations).
plait runs with its defaults (quantized weights); llama.cpp as its users run it (see
`peers/llama_cpp_peer.py`).

- decode: one request, 128 greedy tokens (`Engine.generate` / `create_completion`);
- prefill: a 1,000-token prompt, 1 token out, cold cache (plait flushed, llama.cpp reset);
- batch16: 16 prompts x 128 tokens (one `generate` call / 16 sequences in one context);
- shared: 16 requests on a 1,002-token prefix, 32 tokens each (plait concurrently,
  llama.cpp one by one, reusing the previous request's prefix);
- extract: 4 documents one by one, JSON-schema constrained (chat + `json_schema` / chat +
  `response_format`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from benchmarks.common import markdown_table, median, write_results

MODEL = "smollm2-135m"
DATA = Path(__file__).parents[1] / "tests" / "data" / "extraction"
SPEC_DRAFTS = 4  # draft tokens per step of the extract_spec engine
TARGETS = {"decode": 1.0, "prefill": 2.0, "batch16": 3.0, "shared": 3.0, "extract": 2.0}


@dataclass(frozen=True)
class Job:
    """One measurement: its name and sizes (shared by every worker)."""

    name: str
    tokens: int = 0
    prompt: list[int] | None = None
    prompts: list[list[int]] | None = None
    messages: list[list[dict[str, str]]] | None = None
    schema: dict[str, Any] | None = None


# --- workers ---------------------------------------------------------------------------------
class PlaitWorker:
    """plait's Engine on the model with `threads` threads."""

    def __init__(self, threads: int) -> None:
        from plait.backend import Engine

        self.engine = Engine(MODEL, num_threads=threads, kv_tokens=65536)
        # the same with n-gram speculative decoding (drafts of 4), for extract_spec
        self.drafting = Engine(
            MODEL, num_threads=threads, kv_tokens=65536, speculative_draft_tokens=SPEC_DRAFTS
        )

    def run(self, job: Job) -> tuple[float, Any]:
        fixed = {"temperature": 0.0, "ignore_eos": True}
        e = self.engine
        if job.name in ("decode", "prefill"):
            e.flush_cache()
            n = job.tokens if job.name == "decode" else 1
            return _timed(lambda: e.generate(input_ids=job.prompt, sampling_params={
                **fixed, "max_new_tokens": n}))  # fmt: skip
        if job.name in ("batch16", "shared"):
            e.flush_cache()
            params = {**fixed, "max_new_tokens": job.tokens}
            return _timed(lambda: e.generate(input_ids=job.prompts, sampling_params=params))
        engine = self.drafting if job.name == "extract_spec" else e
        engine.flush_cache()
        params = {"temperature": 0.0, "max_new_tokens": 256, "json_schema": job.schema}
        return _timed(lambda: [
            str(engine.generate(input_ids=ids, sampling_params=params)["text"])
            for ids in job.prompts or []
        ])  # fmt: skip


class LlamaCppWorker:
    """llama.cpp on the same GGUF with `threads` threads."""

    def __init__(self, threads: int) -> None:
        from benchmarks.peers.llama_cpp_peer import LlamaCppPeer
        from plait.backend.builtin_models import resolve_model_path

        self.peer = LlamaCppPeer(str(resolve_model_path(MODEL)), threads=threads)

    def run(self, job: Job) -> tuple[float, Any]:
        peer = self.peer
        if job.name in ("decode", "prefill"):
            peer.reset()
            n = job.tokens if job.name == "decode" else 1
            return _timed(lambda: peer.complete(job.prompt or [], max_tokens=n))
        if job.name == "batch16":
            return _timed(lambda: peer.batch_greedy(job.prompts or [], max_tokens=job.tokens))
        if job.name == "shared":
            peer.reset()
            prompts = job.prompts or []
            return _timed(lambda: [peer.complete(p, max_tokens=job.tokens) for p in prompts])
        if job.name == "extract_spec":  # plait's own variant; compared with llama.cpp's extract
            return float("nan"), None
        schema = job.schema or {}
        return _timed(lambda: [peer.chat_json(m, schema) for m in job.messages or []])


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def serve(kind: str, threads: int, conn: Connection) -> None:
    """A worker process: load once, then answer jobs until told to stop."""
    import torch

    torch.set_num_threads(threads)
    worker: Any = PlaitWorker(threads) if kind == "plait" else LlamaCppWorker(threads)
    conn.send("ready")
    while (job := conn.recv()) is not None:
        try:
            seconds, out = worker.run(job)
            conn.send((seconds, json.loads(json.dumps(out, default=str))))
        except Exception as exc:  # noqa: BLE001 - reported as the cell's value
            conn.send((float("nan"), f"{type(exc).__name__}: {exc}"))


# --- the run ---------------------------------------------------------------------------------
def jobs(quick: bool) -> list[Job]:
    """The measurements, as token ids rendered by plait's tokenizer."""
    from plait.backend.builtin_models import resolve_model_path
    from plait.backend.loader import load_tokenizer

    tok = load_tokenizer(resolve_model_path(MODEL))
    chat = lambda text: tok.apply_chat_template(  # noqa: E731
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    encode = lambda text: list(tok.encode(text, add_special_tokens=False))  # noqa: E731
    story = encode(chat("Tell me a long story about a dragon who learns to cook."))
    filler = encode(" ".join(f"Fact {i}: the river bends near the old mill." for i in range(90)))
    long = filler[: 200 if quick else 1000]
    prefix = encode(chat("Read the notes, then answer.\n")) + long
    tokens = 16 if quick else 128
    docs = [json.loads(line) for line in (DATA / "person.jsonl").read_text().splitlines()][:4]
    messages = [[{"role": "user", "content": f"{d['instruction']}\n\n{d['doc']}"}] for d in docs]
    schema = json.loads((DATA / "person.schema.json").read_text())
    extract_ids = [encode(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False))
                   for m in messages]  # fmt: skip
    topics = [encode(chat(f"Write about topic number {i}.")) for i in range(16)]
    questions = [prefix + encode(f" Question {i}: why?") for i in range(16)]
    return [
        Job("decode", tokens, prompt=story),
        Job("prefill", prompt=long),
        Job("batch16", tokens, prompts=topics),
        Job("shared", 8 if quick else 32, prompts=questions),
        Job("extract", messages=messages, prompts=extract_ids, schema=schema),
        Job("extract_spec", messages=messages, prompts=extract_ids, schema=schema),
    ]


def start(kind: str, threads: int) -> Connection:
    parent, child = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=serve, args=(kind, threads, child), daemon=True)
    proc.start()
    if parent.recv() != "ready":
        raise RuntimeError(f"{kind} worker did not start")
    return parent


def measure(
    threads: list[int], reps: int, quick: bool, *, warmup: int
) -> dict[str, dict[str, list[float]]]:
    """seconds[job][worker] over `reps` rotations, after `warmup` unrecorded ones."""
    todo = jobs(quick)
    workers = {f"{k} T={t}": start(k, t) for t in threads for k in ("plait", "llama.cpp")}
    seconds: dict[str, dict[str, list[float]]] = {j.name: {w: [] for w in workers} for j in todo}
    for rep in range(-warmup, reps):
        order = list(workers) if rep % 2 == 0 else list(reversed(workers))
        for job in todo:
            for name in order:
                workers[name].send(job)
                secs, _ = workers[name].recv()
                if rep >= 0:
                    seconds[job.name][name].append(secs)
    for conn in workers.values():
        conn.send(None)
    return seconds


def report(seconds: dict[str, dict[str, list[float]]], threads: list[int], quick: bool) -> str:
    size = {"decode": 16 if quick else 128, "prefill": 200 if quick else 1000,
            "batch16": 16 * (16 if quick else 128)}  # fmt: skip
    rows = []
    for job, cells in seconds.items():
        row: list[Any] = [job]
        for t in threads:
            ours = median(cells[f"plait T={t}"])
            peer_key = "extract" if job == "extract_spec" else job
            theirs = median(seconds[peer_key][f"llama.cpp T={t}"])
            if job in size:  # a rate: tokens per second, higher is better
                row += [f"{size[job] / theirs:.1f} tok/s", f"{size[job] / ours:.1f} tok/s"]
            else:
                row += [f"{theirs:.2f} s", f"{ours:.2f} s"]
            row.append(f"{theirs / ours:.2f}x")
        target = TARGETS.get(job.removesuffix("_spec"))
        rows.append([*row, f">= {target}x" if target else ""])
    header = ["measurement"]
    for t in threads:
        header += [f"llama.cpp T={t}", f"plait T={t}", f"ratio T={t}"]
    return markdown_table([*header, "target"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded rotations first")
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    reps = args.reps or (1 if args.quick else 3)
    load = os.getloadavg()
    seconds = measure(threads, reps, args.quick, warmup=args.warmup)
    text = report(seconds, threads, args.quick)
    print(text)
    write_results("cpu_peers", {"seconds": seconds, "threads": threads, "reps": reps,
                                "warmup": args.warmup,
                                "load_avg_before": load, "load_avg_after": os.getloadavg(),
                                "table": text, "quick": args.quick})  # fmt: skip


if __name__ == "__main__":
    main()

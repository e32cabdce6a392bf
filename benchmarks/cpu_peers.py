"""plait against llama.cpp on the real model, on the CPU, at 1 and 2 threads.

    python -m benchmarks.cpu_peers [--quick] [--threads 1,2] [--reps 3] [--warmup 1]
                                   [--model smollm2-135m|gemma3-270m|llama-1b|path.gguf]
                                   [--activation-bits 16|8]

Both systems read the same GGUF file (by default `smollm2-135m`, SmolLM2-135M-Instruct Q4_1;
`llama-1b` is a 1B-class Llama of random valid Q4_K_M blocks, written on first use by
`benchmarks.synthetic_gguf`) and get the same token ids (rendered with plait's tokenizer and
chat template). One worker process per (system, thread count) keeps its model loaded; the
workers run each measurement in rotation, the order reversed every repetition, and the table
gives medians. A first rotation is not recorded (`--warmup 1`): it pays for what a steady user
pays once (plait's grammar compile and its compile worker's start, the first use of each kernel,
llama.cpp's first allocations). plait runs with its defaults (quantized weights) and a KV pool
of `--kv-tokens` per engine (65,536); llama.cpp as its users run it (see
`peers/llama_cpp_peer.py`: a 4,096-token context).

- decode: one request, 128 greedy tokens (`Engine.generate` / `create_completion`);
- prefill: a 1,000-token prompt, 1 token out, cold cache (plait flushed, llama.cpp reset);
- batch16: 16 prompts x 128 tokens (one `generate` call / 16 sequences in one context);
- shared: 16 requests on a 1,002-token prefix, 32 tokens each (plait concurrently,
  llama.cpp one by one, reusing the previous request's prefix);
- extract: 4 documents one by one, JSON-schema constrained (chat + `json_schema` / chat +
  `response_format`);
- load and memory: each worker's model load time and its resident memory once loaded (one
  engine; plait's second, for extract_spec, loads at its first use), beside the file's size.
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
from benchmarks.synthetic_gguf import SHAPES, synthetic_model

MODEL = "smollm2-135m"
KV_TOKENS = 65536
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
    """plait's Engine on `model` with `threads` threads."""

    def __init__(self, model: str, threads: int, options: dict[str, int]) -> None:
        from plait.backend import Engine

        self.config = {"num_threads": threads, **options}
        self.engine = Engine(model, **self.config)
        self.model = model
        self._drafting: Any = None

    @property
    def drafting(self) -> Any:
        """The same with n-gram speculative decoding (drafts of 4), for extract_spec: loaded
        at its first use, so the load figures are one engine's."""
        from plait.backend import Engine

        if self._drafting is None:
            self._drafting = Engine(self.model, **self.config, speculative_draft_tokens=SPEC_DRAFTS)
        return self._drafting

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

    def __init__(self, model: str, threads: int, options: dict[str, int]) -> None:
        del options  # plait's: llama.cpp keeps its own context size
        from benchmarks.peers.llama_cpp_peer import LlamaCppPeer
        from plait.backend.model.builtin import resolve_model_path

        self.peer = LlamaCppPeer(str(resolve_model_path(model)), threads=threads)

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


def serve(kind: str, model: str, threads: int, options: dict[str, int], conn: Connection) -> None:
    """A worker process: load once (reporting the seconds and resident bytes), then answer
    jobs until told to stop."""
    import torch

    torch.set_num_threads(threads)
    start = time.perf_counter()
    worker: Any = (PlaitWorker if kind == "plait" else LlamaCppWorker)(model, threads, options)
    conn.send(("ready", time.perf_counter() - start, resident_bytes()))
    if kind == "plait":  # this process is plait's, as `plait serve`'s scheduler process is
        from plait.backend.host import keep_freed_memory

        keep_freed_memory()
    while (job := conn.recv()) is not None:
        try:
            seconds, out = worker.run(job)
            conn.send((seconds, json.loads(json.dumps(out, default=str))))
        except Exception as exc:  # noqa: BLE001 - reported as the cell's value
            conn.send((float("nan"), f"{type(exc).__name__}: {exc}"))


# --- the run ---------------------------------------------------------------------------------
def resident_bytes() -> int:
    """This process's resident memory now (Linux), else its peak."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def jobs(model: str, quick: bool) -> list[Job]:
    """The measurements, as token ids rendered by plait's tokenizer."""
    from plait.backend.model.builtin import resolve_model_path
    from plait.backend.text.tokenizer import load_tokenizer

    tok = load_tokenizer(resolve_model_path(model))
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


def start(
    kind: str, model: str, threads: int, options: dict[str, int]
) -> tuple[Connection, dict[str, float]]:
    """A worker process and what its load took: {"load_s", "resident_mb"}."""
    parent, child = mp.get_context("spawn").Pipe()
    args = (kind, model, threads, options, child)
    mp.get_context("spawn").Process(target=serve, args=args, daemon=True).start()
    ready, load_s, resident = parent.recv()
    if ready != "ready":
        raise RuntimeError(f"{kind} worker did not start")
    return parent, {"load_s": load_s, "resident_mb": resident / 2**20}


def build_kernels() -> None:
    """Compile plait's C kernels now (they are built at first use and cached)."""
    from plait.kernels._native import CSRC, load_native

    for source in sorted(CSRC.glob("*.c")):
        load_native(source.stem)


def measure(
    model: str,
    threads: list[int],
    reps: int,
    quick: bool,
    *,
    warmup: int,
    options: dict[str, int],
    only: list[str] | None = None,
) -> tuple[dict[str, dict[str, list[float]]], dict[str, dict[str, float]]]:
    """seconds[job][worker] over `reps` rotations, after `warmup` unrecorded ones; and each
    worker's load figures."""
    todo = [job for job in jobs(model, quick) if only is None or job.name in only]
    build_kernels()  # once, here: a worker's load time is then the model's, as a user's is
    started = {
        f"{k} T={t}": start(k, model, t, options) for t in threads for k in ("plait", "llama.cpp")
    }
    workers = {name: conn for name, (conn, _) in started.items()}
    loads = {name: load for name, (_, load) in started.items()}
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
    return seconds, loads


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


def load_report(loads: dict[str, dict[str, float]], threads: list[int], file_mb: float) -> str:
    """Load seconds and resident MiB per worker (ratio: llama.cpp's / plait's)."""
    rows = []
    for key, unit in (("load_s", "s"), ("resident_mb", "MiB")):
        row: list[Any] = [key.replace("_", " ")]
        for t in threads:
            theirs, ours = loads[f"llama.cpp T={t}"][key], loads[f"plait T={t}"][key]
            row += [f"{theirs:.1f} {unit}", f"{ours:.1f} {unit}", f"{theirs / ours:.2f}x"]
        rows.append(row)
    header = [f"loading (file {file_mb:.1f} MiB)"]
    for t in threads:
        header += [f"llama.cpp T={t}", f"plait T={t}", f"ratio T={t}"]
    return markdown_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded rotations first")
    parser.add_argument("--model", default=MODEL, help="a builtin name or a .gguf path")
    parser.add_argument("--kv-tokens", type=int, default=KV_TOKENS, help="plait's KV pool")
    parser.add_argument(
        "--activation-bits", type=int, default=16, help="plait's x in the matmuls: 16 or 8"
    )
    parser.add_argument("--jobs", default=None, help="a comma list of measurements (all)")
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    reps = args.reps or (1 if args.quick else 3)
    model = str(synthetic_model(args.model)) if args.model in SHAPES else args.model
    load = os.getloadavg()
    seconds, loads = measure(
        model,
        threads,
        reps,
        args.quick,
        warmup=args.warmup,
        options={"kv_tokens": args.kv_tokens, "activation_bits": args.activation_bits},
        only=args.jobs.split(",") if args.jobs else None,
    )
    text = (
        report(seconds, threads, args.quick)
        + "\n\n"
        + load_report(loads, threads, file_mb=model_file_mb(model))
    )
    print(text)
    name = "cpu_peers" if args.model == MODEL else f"cpu_peers_{Path(args.model).stem}"
    name += "" if args.activation_bits == 16 else f"_x{args.activation_bits}"
    write_results(name, {
        "model": args.model, "seconds": seconds, "loads": loads, "kv_tokens": args.kv_tokens,
        "activation_bits": args.activation_bits, "threads": threads, "reps": reps,
        "warmup": args.warmup,
        "load_avg_before": load, "load_avg_after": os.getloadavg(),
        "table": text, "quick": args.quick,
    })  # fmt: skip


def model_file_mb(model: str) -> float:
    from plait.backend.model.builtin import resolve_model_path

    return resolve_model_path(model).stat().st_size / 2**20


if __name__ == "__main__":
    main()

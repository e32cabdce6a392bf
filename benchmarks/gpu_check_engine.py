"""The engine sections of `benchmarks.gpu_check`: greedy tokens against transformers, a
JSON-schema program, decode throughput, constrained against unconstrained decoding, and the
subprocess ones (pytest, the `make bench QUICK=1` workloads).

On CUDA the engine is `smollm2-135m` in bfloat16 (`REAL`); the dry run uses `plait-tiny` in
float32 on the CPU (`TINY`), so every section runs but its figures mean nothing.
"""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from pydantic import BaseModel, Field

import plait
from plait.backend.engine.engine import Engine
from plait.backend.model.builtin import resolve_model_path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village,",
    "<|im_start|>user\nName three primary colors.<|im_end|>\n<|im_start|>assistant\n",
)
GREEDY = {"temperature": 0.0, "ignore_eos": True}


@dataclass(frozen=True)
class EngineSizes:
    """The model, its placement and the sizes of every engine measurement."""

    model: str
    device: str
    dtype: str
    kv_tokens: int
    greedy_tokens: int
    greedy_prompts: int
    margin_tol: float  # a divergence from transformers at a smaller top-2 margin is a near tie
    batches: tuple[int, ...]
    decode_tokens: int
    rounds: int
    json_docs: int


REAL = EngineSizes(
    model="smollm2-135m", device="cuda", dtype="bfloat16", kv_tokens=65536, greedy_tokens=48,
    greedy_prompts=4, margin_tol=0.5, batches=(1, 16, 64), decode_tokens=128, rounds=3,
    json_docs=16,
)  # fmt: skip
TINY = EngineSizes(
    model="plait-tiny", device="cpu", dtype="float32", kv_tokens=4096, greedy_tokens=6,
    greedy_prompts=2, margin_tol=1e-3, batches=(1, 2), decode_tokens=6, rounds=1, json_docs=2,
)  # fmt: skip


def load_engine(sizes: EngineSizes) -> tuple[Engine, dict[str, Any]]:
    """The engine the sections share, and what its load took."""
    started = time.perf_counter()
    engine = Engine(
        sizes.model,
        device=sizes.device,
        dtype=sizes.dtype,
        kv_tokens=sizes.kv_tokens,
        num_threads=1,
    )
    runner = getattr(engine.runtime, "runner", None)
    info = {
        "model": sizes.model,
        "device": sizes.device,
        "dtype": sizes.dtype,
        "load_s": time.perf_counter() - started,
        "fused_decode": getattr(runner, "fused_decode", None),
    }
    return engine, info


def hf_model(sizes: EngineSizes) -> Any:
    """transformers' model of the same weights: the GGUF file itself (de-quantized by
    transformers' gguf loading, as tests/test_real_model.py), or the builtin's directory."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(sizes.model)
    dtype = getattr(torch, sizes.dtype)
    if path.is_file():
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return cast(Any, model).to(sizes.device).eval()


def compare_greedy(model: Any, ids: list[int], generated: list[int]) -> dict[str, Any]:
    """transformers' argmax after every prefix of `generated` (one forward); where it first
    differs, the margin between its choice and plait's token in transformers' logits."""
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(torch.tensor([ids + generated], device=device)).logits[0].float()
    rows = logits[len(ids) - 1 : -1]
    argmax = rows.argmax(-1).tolist()
    first = next(
        (i for i, (a, b) in enumerate(zip(argmax, generated, strict=True)) if a != b), None
    )
    margin = (
        None if first is None else float(rows[first, argmax[first]] - rows[first, generated[first]])
    )
    return {"tokens": len(generated), "first_divergence": first, "margin": margin}


def greedy_vs_transformers(engine: Engine, sizes: EngineSizes) -> dict[str, Any]:
    """Each prompt alone and all in one batch on plait; transformers checks the tokens alone."""
    params = {**GREEDY, "max_new_tokens": sizes.greedy_tokens}
    prompts = [list(engine.tokenizer.encode(p)) for p in PROMPTS[: sizes.greedy_prompts]]
    alone = [
        engine.generate(input_ids=ids, sampling_params=params)["output_ids"] for ids in prompts
    ]
    batched = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]
    model = hf_model(sizes)
    rows = [compare_greedy(model, ids, out) for ids, out in zip(prompts, alone, strict=True)]
    del model
    release_memory()
    near_ties = all(r["margin"] is None or r["margin"] <= sizes.margin_tol for r in rows)
    full = all(len(out) == sizes.greedy_tokens for out in alone)
    return {
        "ok": near_ties and full,
        "margin_tol": sizes.margin_tol,
        "rows": rows,
        "identical": all(r["first_divergence"] is None for r in rows),
        "batched_equal_alone": batched == alone,
    }


def release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Person(BaseModel):
    """What the JSON-schema program extracts."""

    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=130)
    city: str = Field(max_length=40)


@plait.program
def extract_person(s: plait.ProgramState, doc: str) -> None:
    s += plait.system("Extract the person described in the text as JSON.")
    s += plait.user(doc)
    s += plait.assistant(
        plait.gen("person", json_schema=Person, json_layout="compact", max_tokens=48)
    )


def json_program(engine: Engine, sizes: EngineSizes) -> dict[str, Any]:
    """A batch of the program on the shared engine (greedy): every output must be a Person."""
    names, cities = ("Ada", "Alan", "Grace", "Edsger"), ("London", "Paris", "Tokyo")
    truth = [
        Person(name=names[i % 4], age=20 + i, city=cities[i % 3]) for i in range(sizes.json_docs)
    ]
    docs = [{"doc": f"{p.name} is {p.age} years old and lives in {p.city}."} for p in truth]
    backend = plait.LocalBackend(engine=engine)
    started = time.perf_counter()
    states = extract_person.run_batch(docs, backend=backend, temperature=0)
    seconds = time.perf_counter() - started
    people = [s["person"] for s in states]  # each output parsed by the DSL (or it raised)
    valid = sum(isinstance(p, Person) for p in people)
    return {"ok": valid == len(docs), "docs": len(docs), "seconds": seconds, "valid": valid,
            "equal_to_text": sum(p == t for p, t in zip(people, truth, strict=True)),
            "sample": people[0].model_dump_json() if valid else repr(people[0])}  # fmt: skip


def decode_throughput(engine: Engine, sizes: EngineSizes) -> dict[str, Any]:
    """Tokens/s at each batch size: of the whole call (its prefill included), and of the decode
    alone (the call minus a one-token call on the same prompts, per extra token)."""
    rows = []
    for batch in sizes.batches:
        prompts = [f"Story {i}: once upon a time" for i in range(batch)]
        timed_call(engine, prompts, 2)  # warm-up: kernels compiled, pools sized
        one = min(timed_call(engine, prompts, 1) for _ in range(sizes.rounds))
        full = min(timed_call(engine, prompts, sizes.decode_tokens) for _ in range(sizes.rounds))
        rows.append(
            {
                "batch": batch,
                "tokens": sizes.decode_tokens,
                "call_s": full,
                "tok_s": batch * sizes.decode_tokens / full,
                "decode_tok_s": batch * (sizes.decode_tokens - 1) / max(full - one, 1e-9),
            }
        )
    return {"rows": rows}


def timed_call(engine: Engine, prompts: list[str], tokens: int) -> float:
    engine.flush_cache()
    started = time.perf_counter()
    outs = engine.generate(prompts, {**GREEDY, "max_new_tokens": tokens})
    seconds = time.perf_counter() - started
    if any(len(o["output_ids"]) != tokens for o in outs):
        raise RuntimeError(f"a request ended before its {tokens} tokens")
    return seconds


def constrained_vs_plain(engine: Engine, sizes: EngineSizes) -> dict[str, Any]:
    """benchmarks/structured.py's measurement on this engine: batch 16, a JSON schema whose
    output cannot end within the budget, jump-forward off (the ratio is the masks' cost), and
    the mask fill time per token of those steps (xgrammar's matcher, on the CPU)."""
    from benchmarks.structured import fill_times_us, throughput

    result = throughput(engine, tokens=sizes.decode_tokens, rounds=sizes.rounds)
    fills = sorted(fill_times_us(engine))
    fill = (
        {"p50": fills[len(fills) // 2], "p99": fills[int(0.99 * (len(fills) - 1))]}
        if fills
        else None
    )
    return {
        "tok_s": result["tok_s"],
        "ratio": result["ratio"],
        "goal": 0.95,
        "meets_goal": result["ratio"] >= 0.95,
        "fill_us_per_token": fill,
    }


SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|error|errors|deselected|xfailed|xpassed)")


def run_pytest(args: list[str], *, interpret: bool, timeout: float) -> dict[str, Any]:
    """pytest in a subprocess (TRITON_INTERPRET=0: the real Triton backend on CUDA)."""
    env = {**os.environ, "TRITON_INTERPRET": "1" if interpret else "0"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    counts = {word: int(n) for n, word in SUMMARY.findall(lines[-1] if lines else "")}
    return {
        "ok": proc.returncode == 0,
        "returncode": proc.returncode,
        "command": " ".join(cmd[2:]),
        "counts": counts,
        "tail": lines[-15:],
    }


WORKLOAD_KEYS = ("workload", "system", "programs", "seconds", "programs_per_s", "tokens_per_s",
                 "hit_rate", "unavailable")  # fmt: skip


def workloads(out: Path, *, dry_run: bool, timeout: float) -> dict[str, Any]:
    """`make bench QUICK=1` without the peers, its rows (the dry run: one workload at the smoke
    scale, every system; the whole smoke set takes some 6 minutes on the CPU)."""
    scale = ["--scale", "smoke", "--workloads", "few_shot_qa"] if dry_run else ["--quick"]
    cmd = [sys.executable, "-m", "benchmarks.run", *scale, "--no-peers", "--no-docs",
           "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    result_file = out / "workloads.json"
    if proc.returncode != 0 or not result_file.exists():
        raise RuntimeError(f"benchmarks.run exited {proc.returncode}: {proc.stderr[-2000:]}")
    info = json.loads(result_file.read_text())
    rows = [{k: r[k] for k in WORKLOAD_KEYS if k in r} for r in info["rows"]]
    return {"ok": not any("unavailable" in r for r in rows), "rows": rows, "wall_s": info["wall_s"]}

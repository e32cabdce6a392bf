"""Tensor parallelism on the CPU: a batch of 16 requests x 128 greedy tokens on SmolLM2-135M
(Q4_1), TP=1 at one thread against TP=2 (two ranks, one thread each, gloo).

    python -m benchmarks.tensor_parallel [--reps 5] [--tokens 128] [--batch 16]

Both engines stay loaded in this process (TP=2's rank 1 is a process of its own); every
repetition runs each in turn (the order reversed every other repetition) and the table gives
medians, so the ratio compares runs interleaved on the same machine at the same time. Each
call is timed whole (its short prefill included); `decode_s` subtracts a 1-token call's time
(the prefill) to give the decode steps alone. Both use their default path: the fused C
decode step (TP=2's with an all-reduce callback after each attention and MLP output).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks.common import markdown_table, median, write_results

MODEL = "smollm2-135m"
TOPICS = ["the sea", "a city", "mountains", "winter", "a robot", "coffee", "trains", "music"]


def prompts(batch: int) -> list[str]:
    return [f"Write a short story about {TOPICS[i % len(TOPICS)]}." for i in range(batch)]


def run_once(engine: Any, texts: list[str], tokens: int) -> float:
    """Seconds of one greedy batch call (cache flushed first: every call prefills)."""
    engine.flush_cache()
    params = {"max_new_tokens": tokens, "temperature": 0.0, "ignore_eos": True}
    start = time.perf_counter()
    engine.generate(texts, params)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    from plait.backend import Engine

    engines = {tp: Engine(MODEL, tp=tp, num_threads=1, kv_tokens=16384) for tp in (1, 2)}
    texts = prompts(args.batch)
    for engine in engines.values():  # warm-up: scratch buffers, caches
        run_once(engine, texts, 8)
    times: dict[int, list[float]] = {1: [], 2: []}
    prefill: dict[int, list[float]] = {1: [], 2: []}
    for rep in range(args.reps):
        order = (1, 2) if rep % 2 == 0 else (2, 1)
        for tp in order:
            times[tp].append(run_once(engines[tp], texts, args.tokens))
            prefill[tp].append(run_once(engines[tp], texts, 1))
    for engine in engines.values():
        engine.shutdown()
    report(args, times, prefill)


def report(
    args: argparse.Namespace, times: dict[int, list[float]], prefill: dict[int, list[float]]
) -> None:
    rows, data = [], {}
    for tp in (1, 2):
        whole, pre = median(times[tp]), median(prefill[tp])
        decode = whole - pre
        tok_s = args.batch * args.tokens / whole
        data[f"tp{tp}"] = {"call_s": times[tp], "prefill_s": prefill[tp], "median_call_s": whole,
                           "median_decode_s": decode, "tok_s": tok_s,
                           "ms_per_step": 1000 * decode / max(args.tokens - 1, 1)}  # fmt: skip
        rows.append([f"TP={tp}", f"{whole:.2f}", f"{decode:.2f}", f"{tok_s:.0f}",
                     f"{data[f'tp{tp}']['ms_per_step']:.2f}"])  # fmt: skip
    data["speedup_call"] = median(times[1]) / median(times[2])
    data["speedup_decode"] = data["tp1"]["median_decode_s"] / data["tp2"]["median_decode_s"]
    data["setup"] = {"model": MODEL, "batch": args.batch, "tokens": args.tokens, "reps": args.reps,
                     "threads_per_rank": 1}  # fmt: skip
    print(markdown_table(["", "call s", "decode s", "tok/s", "ms/step"], rows))
    print(
        f"TP=2 / TP=1: {data['speedup_call']:.2f}x (call), {data['speedup_decode']:.2f}x (decode)"
    )
    print("wrote", write_results("tensor_parallel", data))


if __name__ == "__main__":
    main()

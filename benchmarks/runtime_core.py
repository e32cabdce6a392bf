"""Runtime-core benchmarks on plait-small (CPU), each a ratio measured in one run.

1. Decode throughput at batch 32: the Engine (scheduler, sampling, detokenization, result
   delivery) vs a bare loop calling the same model's forward on prepared tensors.
2. 64 requests sharing a 1,000-token prefix, 32 new tokens each: radix cache on vs off.

    python -m benchmarks.runtime_core [--quick]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from benchmarks.common import markdown_table, median, setup_torch, timed, write_results
from plait.backend.engine.engine import Engine
from plait.backend.model.forward_batch import ForwardBatch


def random_prompts(n: int, length: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, 16000, (n, length), generator=gen).tolist()


def engine_decode(engine: Engine, prompts: list[list[int]], steps: int) -> float:
    """Seconds of decoding `steps` tokens for every prompt (prefill time subtracted)."""
    params: dict[str, Any] = {"temperature": 0, "ignore_eos": True}
    prefill, _ = timed(
        lambda: engine.generate(input_ids=prompts, sampling_params={**params, "max_new_tokens": 1})
    )
    engine.flush_cache()
    total, outs = timed(
        lambda: engine.generate(
            input_ids=prompts, sampling_params={**params, "max_new_tokens": steps + 1}
        )
    )
    engine.flush_cache()
    assert all(len(o["output_ids"]) == steps + 1 for o in outs)
    return total - prefill


def bare_decode(engine: Engine, prompts: list[list[int]], steps: int) -> float:
    """The same model forward in a plain loop: prefill once, then `steps` decode forwards
    on tensors prepared up front (argmax feeds the next step)."""
    runner = engine.runtime.runner
    pool, table = runner.kv_pool, runner.req_pool.table
    n, length = len(prompts), len(prompts[0])
    slots = pool.allocate_pages(n * (length + steps)).view(n, length + steps)
    table[:n, : length + steps] = slots.to(torch.int32)
    rows = list(range(n))
    prefill = ForwardBatch.build(
        input_ids=sum(prompts, []),
        out_slots=slots[:, :length].flatten(),
        req_rows=rows,
        prefix_lens=[0] * n,
        extend_lens=[length] * n,
        logit_indices=[(i + 1) * length - 1 for i in range(n)],
        req_to_token=table,
    )
    tokens = runner.forward(prefill).argmax(-1)
    decodes = [
        ForwardBatch.build(
            input_ids=[0] * n,
            out_slots=slots[:, length + s],
            req_rows=rows,
            prefix_lens=[length + s] * n,
            extend_lens=[1] * n,
            logit_indices=rows,
            req_to_token=table,
        )
        for s in range(steps)
    ]

    def loop() -> None:
        nonlocal tokens
        for fb in decodes:
            fb.input_ids.copy_(tokens)
            tokens = runner.forward(fb).argmax(-1)

    elapsed, _ = timed(loop)
    pool.free(slots.flatten())
    return elapsed


def decode_ratio(
    engine: Engine, batch: int, prompt_len: int, steps: int, repeats: int
) -> dict[str, Any]:
    prompts = random_prompts(batch, prompt_len, seed=1)
    engine_s = [engine_decode(engine, prompts, steps) for _ in range(repeats)]
    bare_s = [bare_decode(engine, prompts, steps) for _ in range(repeats)]
    tokens = batch * steps
    return {
        "batch": batch,
        "steps": steps,
        "prompt_len": prompt_len,
        "engine_tok_s": tokens / median(engine_s),
        "bare_tok_s": tokens / median(bare_s),
        "ratio": median(bare_s) / median(engine_s),
        "engine_s": engine_s,
        "bare_s": bare_s,
    }


def shared_prefix_run(disable: bool, n: int, prefix_len: int, new: int) -> dict[str, Any]:
    prefix = random_prompts(1, prefix_len, seed=2)[0]
    prompts = [prefix + q for q in random_prompts(n, 8, seed=3)]
    params = {"temperature": 0, "ignore_eos": True, "max_new_tokens": new}
    with Engine(
        "plait-small", kv_tokens=n * (prefix_len + 64) + 4096, disable_radix_cache=disable
    ) as eng:
        eng.generate(input_ids=[[5, 6, 7]], sampling_params={"max_new_tokens": 2})  # warm up
        elapsed, outs = timed(lambda: eng.generate(input_ids=prompts, sampling_params=params))
        cached = sum(o["usage"]["cached_tokens"] for o in outs)
    return {
        "seconds": elapsed,
        "requests_per_s": n / elapsed,
        "cached_tokens": cached,
        "outputs": [o["output_ids"] for o in outs],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    setup_torch()
    steps, repeats = (16, 1) if args.quick else (64, 3)
    with Engine("plait-small", kv_tokens=65536) as engine:
        engine.generate("warm up", {"max_new_tokens": 4})
        decode = decode_ratio(engine, batch=32, prompt_len=64, steps=steps, repeats=repeats)
    n = 16 if args.quick else 64
    on = shared_prefix_run(False, n, 1000, 32)
    off = shared_prefix_run(True, n, 1000, 32)
    assert on["outputs"] == off["outputs"], "radix cache changed greedy outputs"
    share_ratio = off["seconds"] / on["seconds"]
    print(
        markdown_table(
            ["benchmark", "plait", "baseline", "ratio (target)"],
            [
                [
                    "decode tok/s, batch 32",
                    decode["engine_tok_s"],
                    decode["bare_tok_s"],
                    f"{decode['ratio']:.2f} (>= 0.85 of bare loop)",
                ],
                [
                    f"{n} req x 1000-token shared prefix, req/s",
                    on["requests_per_s"],
                    off["requests_per_s"],
                    f"{share_ratio:.1f}x (>= 5x radix off)",
                ],
            ],
        )
    )
    write_results(
        "runtime_core",
        {
            "decode": decode,
            "shared_prefix": {
                "requests": n,
                "radix_on_s": on["seconds"],
                "radix_off_s": off["seconds"],
                "ratio": share_ratio,
                "cached_tokens_on": on["cached_tokens"],
            },
        },
    )


if __name__ == "__main__":
    main()

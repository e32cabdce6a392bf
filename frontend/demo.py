"""`make demo`: build the embedded model if needed and generate a few things with it."""

from __future__ import annotations

import time

from plait.backend.engine import Engine


def main() -> None:
    t0 = time.perf_counter()
    with Engine() as engine:
        print(f"plait-tiny ready in {time.perf_counter() - t0:.1f}s (random weights: expect noise)")
        prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
        t0 = time.perf_counter()
        outs = engine.generate(prompts, {"max_new_tokens": 24, "temperature": 0.8, "seed": 7})
        elapsed = time.perf_counter() - t0
        for prompt, out in zip(prompts, outs, strict=True):
            print(f"\n> {prompt}\n{out['text']!r}\n  {out['usage']} finish={out['finish_reason']}")
        tokens = sum(o["usage"]["completion_tokens"] for o in outs)
        print(f"\n{tokens} tokens in {elapsed:.2f}s")


if __name__ == "__main__":
    main()

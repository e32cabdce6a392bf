"""Random-length mix (ShareGPT-like, no sharing): 128 requests with prompts of 32-1,024
tokens and outputs of 16-256 tokens, each a different text.

plait: one single-`gen` program per request, in-process and through `plait serve` (the
`HttpBackend` speaking the native /generate protocol). transformers: `generate` in batches
of 16 in the given order; a batch decodes as long as its longest request (static batching)
and each request keeps only the tokens it asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import plait
from benchmarks.peers import Peers
from benchmarks.workloads.harness import (
    HF,
    HTTP,
    PLAIT,
    Clock,
    PlaitTarget,
    Run,
    Scale,
    Workload,
    peer_run,
    run_batch,
    timed_run,
)
from benchmarks.workloads.text import TextMaker


@dataclass(frozen=True)
class Size:
    requests: int
    prompt_tokens: tuple[int, int] = (32, 1024)
    output_tokens: tuple[int, int] = (16, 256)


def size(scale: Scale) -> Size:
    smoke = Size(3, (8, 32), (2, 6))
    return {"full": Size(128), "quick": Size(8, (32, 256), (8, 32)), "smoke": smoke}[scale]


@dataclass(frozen=True)
class Data:
    prompts: tuple[str, ...]
    new_tokens: tuple[int, ...]


def build(scale: Scale, maker: TextMaker) -> Data:
    sz = size(scale)
    prompts = tuple(maker.passage(maker.between(*sz.prompt_tokens)) for _ in range(sz.requests))
    new = tuple(maker.between(*sz.output_tokens) for _ in range(sz.requests))
    return Data(prompts, new)


@plait.program
def complete(s: Any, text: str, new_tokens: int, index: int, clock: Clock) -> None:
    s += text
    s += plait.gen("out", max_tokens=new_tokens, min_tokens=new_tokens)
    _ = s["out"]
    clock.mark(index)


def run_plait(data: Data, target: PlaitTarget) -> Run:
    def items(clock: Clock) -> list[dict[str, Any]]:
        return [
            {"text": p, "new_tokens": n, "index": i, "clock": clock}
            for i, (p, n) in enumerate(zip(data.prompts, data.new_tokens, strict=True))
        ]

    timed = run_batch(target, complete, items)
    outputs = [st["out"] for st in timed.states]
    return timed_run(timed, sum(data.new_tokens), outputs)


def run_hf(data: Data, peers: Peers) -> Run:
    hf = peers.hf
    hf.generate(data.prompts[:1], data.new_tokens[:1])  # warm up
    peers.hf.work.clear()
    clock = Clock()
    outputs = hf.generate(data.prompts, data.new_tokens, lambda idx: clock.mark(*idx))
    return peer_run(clock, sum(data.new_tokens), outputs)


WORKLOAD = Workload(
    name="random_mix",
    title="Random-length mix (128 requests, prompts 32-1,024, outputs 16-256, no sharing)",
    build=build,
    plait=run_plait,
    items=("prompts", "new_tokens"),
    peers={HF: run_hf},
    systems=(PLAIT, HTTP),
)

"""Select-heavy (HellaSwag-shaped): a 20-shot prefix of contexts with their endings, then per
item a context and a 4-way `select` over candidate endings.

plait: `plait.select` scores the four endings in one batched prefill over the cached prefix.
transformers: one forward pass over prefix + context + ending for every ending (mean token
logprob, the same rule as plait's default `token_length_normalized`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import plait
from benchmarks.peers import Peers
from benchmarks.workloads.harness import (
    HF,
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
    items: int
    shots: int = 20
    context_tokens: tuple[int, int] = (30, 60)
    ending_tokens: tuple[int, int] = (12, 30)
    choices: int = 4


def size(scale: Scale) -> Size:
    return {"full": Size(128), "quick": Size(4, shots=5), "smoke": Size(4, shots=3)}[scale]


@dataclass(frozen=True)
class Item:
    context: str
    endings: tuple[str, ...]


@dataclass(frozen=True)
class Data:
    prefix: str
    items: tuple[Item, ...]


def item(maker: TextMaker, sz: Size) -> Item:
    context = f"{maker.phrase(2).title()}:{maker.passage(maker.between(*sz.context_tokens))}"
    endings = tuple(maker.passage(maker.between(*sz.ending_tokens)) for _ in range(sz.choices))
    return Item(context, endings)


def build(scale: Scale, maker: TextMaker) -> Data:
    sz = size(scale)
    shots = [item(maker, sz) for _ in range(sz.shots)]
    prefix = "".join(f"{s.context}{maker.pick(s.endings)}\n\n" for s in shots)
    return Data(prefix, tuple(item(maker, sz) for _ in range(sz.items)))


@plait.program
def complete(
    s: Any, prefix: str, context: str, endings: list[str], index: int, clock: Clock
) -> None:
    s += prefix + context
    s += plait.select("ending", endings)
    _ = s["ending"]
    clock.mark(index)


def run_plait(data: Data, target: PlaitTarget) -> Run:
    def items(clock: Clock) -> list[dict[str, Any]]:
        return [
            {
                "prefix": data.prefix,
                "context": it.context,
                "endings": list(it.endings),
                "index": i,
                "clock": clock,
            }
            for i, it in enumerate(data.items)
        ]

    timed = run_batch(target, complete, items)
    picks = [
        list(it.endings).index(st["ending"])
        for it, st in zip(data.items, timed.states, strict=True)
    ]
    return timed_run(timed, 0, picks)


def run_hf(data: Data, peers: Peers) -> Run:
    hf = peers.hf
    pairs = [(data.prefix + it.context, it.endings) for it in data.items]
    hf.select(pairs[:1])  # warm up
    peers.hf.work.clear()
    clock = Clock()
    picks = hf.select(pairs, lambda idx: clock.mark(*idx))
    return peer_run(clock, 0, picks)


WORKLOAD = Workload(
    name="select_heavy",
    title="Select-heavy (HellaSwag-like, 20-shot prefix, 4-way select)",
    build=build,
    plait=run_plait,
    items=("items",),
    sample=16,
    peers={HF: run_hf},
)

"""Tree of thought (GSM8K tree-search shaped): per question, fork 4 plans, and fork every
plan into 4 steps (depth 2: 4 + 16 generations of 32 tokens), under a shared instruction.

plait: nested `fork`s; every branch shares its parent's cached KV. transformers: level by
level over all questions (first the 4 plans of every question, then the 16 steps), in batches,
each prompt re-encoded in full.
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
    questions: int
    width: int = 4
    new_tokens: int = 32
    instruction_tokens: int = 200
    question_tokens: tuple[int, int] = (100, 200)


def size(scale: Scale) -> Size:
    smoke = Size(1, width=2, new_tokens=4, instruction_tokens=40)
    return {"full": Size(16), "quick": Size(2, 4, 8, 100, (50, 100)), "smoke": smoke}[scale]


@dataclass(frozen=True)
class Data:
    instruction: str
    questions: tuple[str, ...]
    width: int
    new_tokens: int

    @property
    def per_question_tokens(self) -> int:
        return (self.width + self.width**2) * self.new_tokens


def build(scale: Scale, maker: TextMaker) -> Data:
    sz = size(scale)
    instruction = "Think step by step; propose plans." + maker.passage(sz.instruction_tokens)
    questions = tuple(
        "\nQuestion:" + maker.passage(maker.between(*sz.question_tokens))
        for _ in range(sz.questions)
    )
    return Data(instruction, questions, sz.width, sz.new_tokens)


def plan_text(i: int) -> str:
    return f"\nPlan {i + 1}:"


def step_text(j: int) -> str:
    return f"\nStep {j + 1}:"


@plait.program
def tree(s: Any, text: str, width: int, new_tokens: int, index: int, clock: Clock) -> None:
    n = new_tokens
    s += text
    plans = s.fork(width)
    plans += lambda i: plan_text(i) + plait.gen("plan", max_tokens=n, min_tokens=n)
    steps = [plan.fork(width) for plan in plans]
    for group in steps:
        group += lambda j: step_text(j) + plait.gen("step", max_tokens=n, min_tokens=n)
    # the leaves are read straight from the branches (no join needed to read them)
    leaves = tuple(
        (p["plan"], tuple(b["step"] for b in g)) for p, g in zip(plans, steps, strict=True)
    )
    clock.record(index, leaves)


def run_plait(data: Data, target: PlaitTarget) -> Run:
    def items(clock: Clock) -> list[dict[str, Any]]:
        return [
            {"text": data.instruction + q, "width": data.width, "new_tokens": data.new_tokens,
             "index": i, "clock": clock}
            for i, q in enumerate(data.questions)
        ]  # fmt: skip

    timed = run_batch(target, tree, items)
    outputs = timed.values
    return timed_run(timed, len(outputs) * data.per_question_tokens, outputs)


def run_hf(data: Data, peers: Peers) -> Run:
    hf, w, n = peers.hf, data.width, data.new_tokens
    hf.generate([data.instruction + data.questions[0]], [n])  # warm up
    peers.hf.work.clear()
    clock = Clock()
    plan_prompts = [data.instruction + q + plan_text(i) for q in data.questions for i in range(w)]
    plans = hf.generate(plan_prompts, [n] * len(plan_prompts))
    step_prompts = [
        p + t + step_text(j) for p, t in zip(plan_prompts, plans, strict=True) for j in range(w)
    ]

    def done(rows: Any) -> None:  # a question is done with its last step
        clock.mark(*{r // (w * w) for r in rows if r % (w * w) == w * w - 1})

    steps = hf.generate(step_prompts, [n] * len(step_prompts), done)
    outputs = [
        tuple((plans[q * w + i], tuple(steps[(q * w + i) * w : (q * w + i + 1) * w]))
              for i in range(w))
        for q in range(len(data.questions))
    ]  # fmt: skip
    return peer_run(clock, len(outputs) * data.per_question_tokens, outputs)


WORKLOAD = Workload(
    name="tree_of_thought",
    title="Tree of thought (fork 4 x depth 2, 32 tokens per node)",
    build=build,
    plait=run_plait,
    items=("questions",),
    sample=8,
    peers={HF: run_hf},
)

"""Few-shot QA (MMLU-shaped): a 5-shot prefix of about 1,500 tokens shared by every question,
then one question with four options and 16 generated tokens.

plait: one program per question through `run_batch` (the shared prefix is cached once and
reused by every request). transformers: `generate` over prefix + question in batches.
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

LETTERS = "ABCD"
OPTION_TOKENS = 20


@dataclass(frozen=True)
class Size:
    questions: int
    shots: int = 5
    prefix_tokens: int = 1500
    question_tokens: tuple[int, int] = (40, 160)
    new_tokens: int = 16


def size(scale: Scale) -> Size:
    return {
        "full": Size(128),
        "quick": Size(8, prefix_tokens=500),
        "smoke": Size(4, prefix_tokens=600),
    }[scale]


@dataclass(frozen=True)
class Data:
    prefix: str
    questions: tuple[str, ...]
    new_tokens: int


def question(maker: TextMaker, body_tokens: int) -> str:
    options = "".join(f"\n{x}.{maker.passage(OPTION_TOKENS)}" for x in LETTERS)
    return f"Question:{maker.passage(body_tokens)}{options}\nAnswer:"


def build(scale: Scale, maker: TextMaker) -> Data:
    sz = size(scale)
    header = f"The following are multiple choice questions (with answers) about{maker.passage(3)}"
    per_shot = (sz.prefix_tokens - maker.count(header)) // sz.shots
    overhead = maker.count(question(maker, 1) + " A\n\n") - 1
    shots = [
        question(maker, per_shot - overhead) + f" {maker.pick(LETTERS)}\n\n"
        for _ in range(sz.shots)
    ]
    prefix = header + "\n\n" + "".join(shots)
    questions = tuple(
        question(maker, maker.between(*sz.question_tokens)) for _ in range(sz.questions)
    )
    return Data(prefix, questions, sz.new_tokens)


@plait.program
def answer(s: Any, prefix: str, question: str, new_tokens: int, index: int, clock: Clock) -> None:
    s += prefix + question
    s += plait.gen("answer", max_tokens=new_tokens, min_tokens=new_tokens)
    if s.meta("answer")["usage"]["completion_tokens"] != new_tokens:
        raise AssertionError("plait did not generate the requested number of tokens")
    clock.mark(index)


def run_plait(data: Data, target: PlaitTarget) -> Run:
    def items(clock: Clock) -> list[dict[str, Any]]:
        return [
            {
                "prefix": data.prefix,
                "question": q,
                "new_tokens": data.new_tokens,
                "index": i,
                "clock": clock,
            }
            for i, q in enumerate(data.questions)
        ]

    timed = run_batch(target, answer, items)
    outputs = [st["answer"] for st in timed.states]
    return timed_run(timed, len(outputs) * data.new_tokens, outputs)


def run_hf(data: Data, peers: Peers) -> Run:
    hf = peers.hf
    prompts = [data.prefix + q for q in data.questions]
    hf.generate(prompts[:1], [data.new_tokens])  # warm up
    peers.hf.work.clear()
    clock = Clock()
    outputs = hf.generate(prompts, [data.new_tokens] * len(prompts), lambda i: clock.mark(*i))
    return peer_run(clock, len(outputs) * data.new_tokens, outputs)


WORKLOAD = Workload(
    name="few_shot_qa",
    title="Few-shot QA (5-shot, ~1,500-token prefix, 16 new tokens)",
    build=build,
    plait=run_plait,
    items=("questions",),
    sample=64,
    peers={HF: run_hf},
)

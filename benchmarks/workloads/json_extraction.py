"""JSON extraction: 64 documents (300-500 tokens each) into a 6-field JSON Schema, after a
shared instruction with one worked example.

plait: `gen(json_schema=...)` (grammar masks; jump-forward over the schema's fixed text
unless disabled). Outlines: `Generator(model, JsonSchema(...)).batch(...)` on transformers,
with compact whitespace like plait's. transformers `generate` alone has no schema constraint.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import plait
from benchmarks.peers import Peers, Unavailable
from benchmarks.workloads.harness import (
    HF,
    NO_JUMP,
    NO_RADIX,
    OUTLINES,
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

CITIES = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Oslo", "Lima"]
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "enum": CITIES},
        "email": {"type": "string", "pattern": "^[a-z]{3,10}@[a-z]{3,10}\\.(com|org)$"},
        "occupation": {"type": "string", "maxLength": 32},
        "employed": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "email", "occupation", "employed"],
    "additionalProperties": False,
}
MAX_TOKENS = 160


@dataclass(frozen=True)
class Size:
    documents: int
    document_tokens: tuple[int, int] = (300, 500)


def size(scale: Scale) -> Size:
    return {"full": Size(64), "quick": Size(4, (100, 200)), "smoke": Size(2, (40, 60))}[scale]


@dataclass(frozen=True)
class Data:
    instruction: str
    documents: tuple[str, ...]


def document(maker: TextMaker, tokens: int) -> str:
    name = maker.phrase(2).title()
    facts = (
        f" {name} is {maker.between(20, 70)} and lives in {maker.pick(CITIES)}."
        f" Write to {maker.phrase(1)}@{maker.phrase(1)}.com. Works as a {maker.phrase(1)}."
    )
    half = tokens // 2
    return maker.passage(half) + facts + maker.passage(tokens - half)


def build(scale: Scale, maker: TextMaker) -> Data:
    sz = size(scale)
    example = {
        "name": "Ada Lovelace", "age": 36, "city": "London", "email": "ada@engine.org",
        "occupation": "mathematician", "employed": False,
    }  # fmt: skip
    instruction = (
        "Extract the person described in the document as JSON with the fields name, age, city,"
        f" email, occupation and employed.\n\nDocument:{document(maker, 200)}\n"
        f"JSON: {json.dumps(example, separators=(',', ':'))}\n\n"
    )
    docs = tuple(document(maker, maker.between(*sz.document_tokens)) for _ in range(sz.documents))
    return Data(instruction, docs)


def prompt(data: Data, doc: str) -> str:
    return f"{data.instruction}Document:{doc}\nJSON: "


@plait.program
def extract(s: Any, text: str, index: int, clock: Clock) -> None:
    s += text
    s += plait.gen("person", json_schema=SCHEMA, max_tokens=MAX_TOKENS)
    _ = s["person"]
    clock.mark(index)


def summary(outputs: list[str], count: Callable[[str], int]) -> tuple[int, dict[str, Any]]:
    """Output tokens (re-tokenized text, the same rule for every system) and validity."""
    valid = 0
    for text in outputs:
        with contextlib.suppress(ValueError):
            valid += set(json.loads(text)) == set(SCHEMA["required"])
    return sum(count(t) for t in outputs), {"valid_json": valid / len(outputs)}


def run_plait(data: Data, target: PlaitTarget) -> Run:
    def items(clock: Clock) -> list[dict[str, Any]]:
        return [
            {"text": prompt(data, doc), "index": i, "clock": clock}
            for i, doc in enumerate(data.documents)
        ]

    timed = run_batch(target, extract, items)
    outputs = [str(st["person"]) for st in timed.states]
    tokens, extra = summary(outputs, target.count)
    return timed_run(timed, tokens, outputs, **extra)


def run_outlines(data: Data, peers: Peers) -> Run:
    outlines = peers.outlines
    prompts = [prompt(data, doc) for doc in data.documents]
    outlines.json(prompts[:1], SCHEMA, MAX_TOKENS)  # warm up: builds the index
    peers.hf.work.clear()
    clock = Clock()
    outputs = outlines.json(prompts, SCHEMA, MAX_TOKENS, lambda idx: clock.mark(*idx))
    tokens, extra = summary(outputs, peers.hf.count)
    return peer_run(clock, tokens, outputs, compile_s=dict(outlines.compile_s), **extra)


def run_hf(data: Data, peers: Peers) -> Run:
    raise Unavailable("transformers generate has no JSON Schema constraint (Outlines row)")


WORKLOAD = Workload(
    name="json_extraction",
    title="JSON extraction (64 documents, 6-field schema)",
    build=build,
    plait=run_plait,
    items=("documents",),
    peers={OUTLINES: run_outlines, HF: run_hf},
    systems=(PLAIT, NO_RADIX, NO_JUMP),
)

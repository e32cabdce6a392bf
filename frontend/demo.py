"""`make demo`: four plait programs on a real model, SmolLM2-135M-Instruct, on this CPU.

A multi-turn chat, a JSON extraction into a pydantic model, a `select`, and a `fork`, each
with its answers, the time it took and the prompt tokens the radix cache served. Decoding is
greedy, so the answers are the same every run; each is checked against the expected one.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

import plait

MODEL = "smollm2-135m"
BRIEF = "Answer in a few words."


class Person(BaseModel):
    """What the extraction fills in."""

    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=130)
    city: str = Field(max_length=40)


@plait.program
def chat(s: plait.ProgramState, questions: list[str]) -> None:
    s += plait.system(BRIEF)
    for i, question in enumerate(questions):
        s += plait.user(question)
        s += plait.assistant(plait.gen(f"answer_{i}", max_tokens=24))


@plait.program
def extract(s: plait.ProgramState, doc: str) -> None:
    s += plait.system("Extract the person described in the text as JSON.")
    s += plait.user(doc)
    s += plait.assistant(plait.gen("person", json_schema=Person, max_tokens=48))


@plait.program
def review(s: plait.ProgramState, text: str) -> None:
    s += plait.user(f"Review: {text}\nIs this review positive or negative?")
    s += plait.assistant("The review is " + plait.select("label", ["positive", "negative"]))


@plait.program
def capitals(s: plait.ProgramState, countries: list[str]) -> None:
    s += plait.system(BRIEF)
    forks = s.fork(len(countries))  # the system prompt is prefilled once, then shared
    forks += lambda i: (
        plait.user(f"What is the capital of {countries[i]}?")
        + plait.assistant(plait.gen("capital", max_tokens=16))
    )
    forks.join()


@dataclass(frozen=True)
class Shown:
    """One program's run: questions and answers, the answers' expected contents, its wall
    time and how many of its prompt tokens the cache served."""

    title: str
    pairs: list[tuple[str, str]]
    expected: list[str]
    seconds: float
    cached: int
    prompt: int | None  # None: not reported (select's scoring)

    def right(self) -> list[bool]:
        return [e in answer for (_, answer), e in zip(self.pairs, self.expected, strict=True)]

    def report(self) -> str:
        of = "" if self.prompt is None else f" of {self.prompt}"
        cache = f"the cache served {self.cached}{of} prompt tokens"
        lines = [f"\n{self.title}\n  {self.seconds:.1f} s; {cache}"]
        for (question, answer), ok in zip(self.pairs, self.right(), strict=True):
            lines.append(f"  > {question}\n    {answer}  {'[ok]' if ok else '[UNEXPECTED]'}")
        return "\n".join(lines)


def timed(run: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = run()
    return result, time.perf_counter() - start


def usage(metas: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """(cached, prompt) tokens over gen metas."""
    return (
        sum(m["usage"]["cached_tokens"] for m in metas),
        sum(m["usage"]["prompt_tokens"] for m in metas),
    )


def show_chat(backend: plait.Backend) -> Shown:
    questions = ["What is the capital of France?", "And of Germany?"]
    state, seconds = timed(lambda: chat.run(questions=questions, backend=backend, temperature=0))
    answers = [state[f"answer_{i}"] for i in range(len(questions))]
    metas = [state.meta(f"answer_{i}") for i in range(len(questions))]
    pairs = list(zip(questions, answers, strict=True))
    return Shown(
        "Two-turn chat (roles through the model's chat template)",
        pairs,
        ["Paris", "Berlin"],
        seconds,
        *usage(metas),
    )


def show_extraction(backend: plait.Backend) -> Shown:
    people = [
        Person(name="Maria", age=34, city="Madrid"),
        Person(name="Yuki", age=28, city="Tokyo"),
    ]
    docs = ["Maria is 34 years old and lives in Madrid.", "Yuki lives in Tokyo. She is 28."]
    states, seconds = timed(
        lambda: extract.run_batch([{"doc": d} for d in docs], backend=backend, temperature=0)
    )
    pairs = [(doc, repr(st["person"])) for doc, st in zip(docs, states, strict=True)]
    return Shown(
        "JSON extraction into a pydantic model (json_schema=Person, one batch)",
        pairs,
        [repr(p) for p in people],
        seconds,
        *usage([s.meta("person") for s in states]),
    )


def show_select(backend: plait.Backend) -> Shown:
    texts = ["I loved this film, the acting was wonderful.", "The hotel room was dirty and noisy."]
    states, seconds = timed(lambda: review.run_batch([{"text": t} for t in texts], backend=backend))
    pairs = [(t, "The review is " + st["label"]) for t, st in zip(texts, states, strict=True)]
    cached = sum(sum(st.meta("label")["cached_tokens"]) for st in states)
    return Shown(
        "select: the likelier of two continuations, scored in one prefill",
        pairs,
        ["positive", "negative"],
        seconds,
        cached,
        None,
    )


def show_fork(backend: plait.Backend) -> Shown:
    countries = ["Japan", "Italy", "Egypt"]
    state, seconds = timed(
        lambda: capitals.run(countries=countries, backend=backend, temperature=0)
    )
    pairs = [
        (f"What is the capital of {c}?", a)
        for c, a in zip(countries, state["capital"], strict=True)
    ]
    return Shown(
        "fork: three branches over one cached prefix, decoded as one batch",
        pairs,
        ["Tokyo", "Rome", "Cairo"],
        seconds,
        *usage(state.meta("capital")),
    )


def run_all(backend: plait.Backend) -> list[Shown]:
    """Every program of the demo on `backend`, in order."""
    return [show(backend) for show in (show_chat, show_extraction, show_select, show_fork)]


def main() -> int:
    start = time.perf_counter()
    backend = plait.LocalBackend(MODEL)
    print(
        f"{MODEL}: SmolLM2-135M-Instruct (Q4_1 GGUF, float32 on the CPU) loaded in "
        f"{time.perf_counter() - start:.1f} s; greedy decoding"
    )
    try:
        shown = run_all(backend)
    finally:
        backend.close()
    for one in shown:
        print(one.report())
    right = sum(sum(one.right()) for one in shown)
    total = sum(len(one.pairs) for one in shown)
    print(f"\n{right} of {total} answers as expected; {time.perf_counter() - start:.1f} s in all")
    return 0 if right == total else 1


if __name__ == "__main__":
    sys.exit(main())

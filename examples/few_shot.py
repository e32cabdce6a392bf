"""Few-shot sentiment classification as one batch on SmolLM2-135M-Instruct: the shared
examples are prefilled once and every program reuses them from the radix cache; `select`
scores the two labels after each review.

    python examples/few_shot.py

(A 135M model tells positive from negative reliably; a third "neutral" label it mostly
misses, so the example keeps two.)
"""

from __future__ import annotations

import contextlib
import os

import plait

MODEL = os.environ.get("PLAIT_MODEL", "smollm2-135m")  # or gemma3-270m, a path, ...
SHOTS = [
    ("The movie was wonderful.", "positive"),
    ("I hated every minute of it.", "negative"),
    ("Brilliant acting and a great story.", "positive"),
    ("The plot made no sense at all.", "negative"),
]
REVIEWS = [
    ("I loved this film, the acting was wonderful.", "positive"),
    ("Terrible food and rude staff. Never again.", "negative"),
    ("A great book, I could not put it down.", "positive"),
    ("The phone broke after two days. Waste of money.", "negative"),
    ("Best pizza in town, friendly staff!", "positive"),
    ("The hotel room was dirty and noisy.", "negative"),
    ("Fantastic concert, the band was amazing.", "positive"),
    ("Boring plot and bad acting.", "negative"),
]


@plait.program
def classify(s: plait.ProgramState, review: str) -> None:
    s += "Classify the sentiment of each review.\n\n"
    for text, label in SHOTS:
        s += f"Review: {text}\nSentiment: {label}\n\n"
    s += f"Review: {review}\nSentiment: "
    s += plait.select("label", ["positive", "negative"])


def main(
    backend: plait.Backend | None = None, reviews: list[tuple[str, str]] = REVIEWS
) -> list[plait.ProgramState]:
    with contextlib.ExitStack() as stack:
        if backend is None:
            backend = stack.enter_context(plait.LocalBackend(MODEL))
        states = classify.run_batch([{"review": r} for r, _ in reviews], backend=backend)
    for (review, label), state in zip(reviews, states, strict=True):
        mark = "" if state["label"] == label else f"  (expected {label})"
        print(f"{state['label']:>8}  {review}{mark}")
    cached = [min(state.meta("label")["cached_tokens"]) for state in states]
    print("prompt tokens served from the cache per program:", cached)
    return states


if __name__ == "__main__":
    main()

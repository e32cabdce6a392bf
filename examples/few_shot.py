"""A few-shot batch: the shared examples are prefilled once, every program reuses them.

python examples/few_shot.py
"""

from __future__ import annotations

import plait

SHOTS = [
    ("The movie was wonderful.", "positive"),
    ("I hated every minute of it.", "negative"),
    ("An average film, nothing special.", "neutral"),
    ("Brilliant acting and a great story.", "positive"),
    ("The plot made no sense at all.", "negative"),
]
REVIEWS = [f"Review number {i}: the film had its moments." for i in range(16)]


@plait.program
def classify(s: plait.ProgramState, review: str) -> None:
    s += "Classify the sentiment of each review.\n\n"
    for text, label in SHOTS:
        s += f"Review: {text}\nSentiment: {label}\n\n"
    s += f"Review: {review}\nSentiment: "
    s += plait.select("label", ["positive", "negative", "neutral"])


def main() -> list[plait.ProgramState]:
    states = classify.run_batch([{"review": r} for r in REVIEWS])
    for review, state in zip(REVIEWS, states, strict=True):
        print(f"{state['label']:>8}  {review}")
    cached = [min(state.meta("label")["cached_tokens"]) for state in states]
    print("prompt tokens served from the cache per program:", cached)
    return states


if __name__ == "__main__":
    main()

"""How `select` turns each choice's token logprobs into a decision."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChoiceLogprobs:
    """Logprobs of one choice's tokens after the prefix (and, if asked, with no prefix)."""

    token_logprobs: list[float]
    unconditional: list[float] | None = None
    cached_tokens: int = 0


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("-inf")


def choose(
    method: str, choices: Sequence[str], scored: Sequence[ChoiceLogprobs]
) -> tuple[int, dict[str, Any]]:
    """(index of the chosen choice, meta with every choice's scores)."""
    normalized = [mean(s.token_logprobs) for s in scored]
    if method == "token_length_normalized":
        scores = normalized
    elif method == "greedy_token":
        scores = normalized  # reported; the decision below is lexicographic
    elif method == "unconditional_likelihood_normalized":
        scores = [
            mean([c - u for c, u in zip(s.token_logprobs, s.unconditional or [], strict=False)])
            for s in scored
        ]
    else:
        raise ValueError(f"unknown select method {method!r}")
    index = greedy_index(scored) if method == "greedy_token" else _argmax(scores)
    meta = {
        "method": method,
        "scores": scores,
        "normalized_logprobs": normalized,
        "token_logprobs": [s.token_logprobs for s in scored],
        "cached_tokens": [s.cached_tokens for s in scored],
    }
    return index, meta


def greedy_index(scored: Sequence[ChoiceLogprobs]) -> int:
    """The choice greedy decoding would follow: compare token logprobs position by position;
    a shorter choice continues with its own mean logprob (so a prefix-choice can still win)."""
    width = max(len(s.token_logprobs) for s in scored)
    keys = [
        list(s.token_logprobs) + [mean(s.token_logprobs)] * (width - len(s.token_logprobs))
        for s in scored
    ]
    return max(range(len(keys)), key=lambda i: (keys[i], -i))


def _argmax(values: Sequence[float]) -> int:
    return max(range(len(values)), key=lambda i: (values[i], -i))

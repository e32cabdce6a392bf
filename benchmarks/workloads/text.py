"""Synthetic text with exact token counts under the benchmark model's tokenizer.

Nothing can be downloaded here, so the workloads use text with the token-length structure of
the SGLang paper's data sets (MMLU, HellaSwag, ShareGPT-like chats, ...) built from real words
of the tokenizer's vocabulary. Every word is a single token when preceded by a space, and
every sentence ends in a one-token ".", so `passage(n)` is exactly `n` tokens on its own and
stays so after any text that ends in a space-free character (pre-tokenization splits before
each space).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from functools import cached_property
from typing import Any

WORD = re.compile(r"Ġ[a-z]{3,9}")
SENTENCE_WORDS = (6, 16)


class TextMaker:
    """Deterministic passages, names and choices; `seed` fixes everything it produces."""

    def __init__(self, tokenizer: Any, seed: int) -> None:
        self.tokenizer = tokenizer
        self.rng = random.Random(seed)

    @cached_property
    def words(self) -> tuple[str, ...]:
        vocab: dict[str, int] = self.tokenizer.get_vocab()
        found = sorted(w[1:] for w, i in vocab.items() if WORD.fullmatch(w) and self._single(w, i))
        if len(found) < 500:
            raise RuntimeError(f"tokenizer has only {len(found)} single-token words")
        return tuple(found)

    def _single(self, word: str, token_id: int) -> bool:
        return list(self.tokenizer.encode(" " + word[1:], add_special_tokens=False)) == [token_id]

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def passage(self, n_tokens: int) -> str:
        """`n_tokens` tokens of sentences: " word word ... word." (a leading space)."""
        pieces: list[str] = []
        left = n_tokens
        while left > 0:
            size = min(left, self.rng.randint(*SENTENCE_WORDS))
            words = self.rng.choices(self.words, k=size - 1 if size >= 2 else 1)
            end = "." if size >= 2 else ""  # the period is a token of its own
            pieces.append("".join(" " + w for w in words) + end)
            left -= size
        return "".join(pieces)

    def phrase(self, n_words: int) -> str:
        """`n_words` words without punctuation and without a leading space."""
        return " ".join(self.rng.choices(self.words, k=n_words))

    def between(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def pick(self, options: Sequence[str]) -> str:
        return self.rng.choice(list(options))


def check_tokens(maker: TextMaker, text: str, expected: int) -> None:
    """Guard the length structure: fail loudly if a tokenizer change broke it."""
    got = maker.count(text)
    if got != expected:
        raise AssertionError(f"synthetic text has {got} tokens, expected {expected}")

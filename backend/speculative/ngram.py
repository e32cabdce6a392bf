"""N-gram speculative decoding (prompt lookup): draft tokens copied from the sequence itself.

Extraction, summaries, code edits and chat about a document repeat what the prompt says: a
name, a number, a line. After each step, the last `n` tokens of a request (n from
`max_ngram` down to `min_ngram`) are looked up among its earlier tokens; the tokens that
followed their latest earlier occurrence are proposed as a draft. The next step feeds the last
token and the draft in one forward (a short decode-style extend over the cached prefix) and
keeps the draft's longest prefix that greedy decoding would have produced itself, plus the
token the model picks after it: one forward, up to `draft + 1` tokens, the same output.

`NgramIndex` keeps, for every n-gram of the sequence, the positions where it occurred (the
latest last), updated as tokens are appended or cut (O(max_ngram) per token), so a lookup
costs a dictionary probe. The scheduler's side (which requests draft, the verification) is
`spec_step.Speculator`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the engine's config imports this module; torch only for the annotation
    import torch


@dataclass(frozen=True)
class SpeculativeConfig:
    """How drafts are proposed: at most `draft_tokens` tokens, matched on the last
    `max_ngram` .. `min_ngram` tokens (the longest match wins)."""

    draft_tokens: int = 4
    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError("speculative n-grams need 1 <= min_ngram <= max_ngram")
        if self.draft_tokens < 1:
            raise ValueError("speculative decoding needs draft_tokens >= 1")


@dataclass
class NgramIndex:
    """Start positions of every n-gram (n in [min_ngram, max_ngram]) of a token sequence,
    in order, excluding the n-gram that ends the sequence (which is what is looked up)."""

    config: SpeculativeConfig
    tokens: list[int] = field(default_factory=list)
    starts: dict[tuple[int, ...], list[int]] = field(default_factory=dict)

    def _ngrams_before(self, end: int) -> list[tuple[int, ...]]:
        """The n-grams that end just before position `end`."""
        lo, hi = self.config.min_ngram, min(self.config.max_ngram, end)
        return [tuple(self.tokens[end - n : end]) for n in range(lo, hi + 1)]

    def extend(self, new: Sequence[int]) -> None:
        """Append tokens; index every n-gram that now has a token after it."""
        for token in new:
            end = len(self.tokens)  # n-grams ending here get a follower: `token`
            for gram in self._ngrams_before(end):
                self.starts.setdefault(gram, []).append(end - len(gram))
            self.tokens.append(token)

    def truncate(self, length: int) -> None:
        """Forget the tokens from `length` on (the n-grams they followed, last first)."""
        while len(self.tokens) > max(length, 0):
            self.tokens.pop()
            for gram in self._ngrams_before(len(self.tokens)):
                positions = self.starts[gram]
                positions.pop()
                if not positions:
                    del self.starts[gram]

    def sync(self, tokens: Sequence[int], *, start: int = 0) -> None:
        """Make the index hold a sequence whose tokens from `start` on are `tokens` and whose
        first `start` (at most the index's length) it holds already (an output's end may
        have been rewritten since)."""
        assert start <= len(self.tokens)
        keep = start
        while (
            keep < len(self.tokens)
            and keep - start < len(tokens)
            and tokens[keep - start] == self.tokens[keep]
        ):
            keep += 1
        self.truncate(keep)
        self.extend(tokens[keep - start :])

    def propose(self, limit: int) -> list[int]:
        """Up to min(limit, draft_tokens) tokens that followed the latest earlier occurrence
        of the longest n-gram ending the sequence; [] when none occurred."""
        limit = min(limit, self.config.draft_tokens)
        if limit <= 0:
            return []
        size = len(self.tokens)
        for n in range(self.config.max_ngram, self.config.min_ngram - 1, -1):
            if size <= n:
                continue
            positions = self.starts.get(tuple(self.tokens[size - n :]))
            if positions:
                follow = positions[-1] + n
                return self.tokens[follow : min(follow + limit, size)]
        return []


@dataclass
class SpecState:
    """One request's speculation: its n-gram index, the grammar masks of the draft in
    flight (rows 0..len(draft), None when unconstrained), and its counters."""

    index: NgramIndex
    masks: torch.Tensor | None = None
    drafted: int = 0
    accepted: int = 0


def accepted_prefix(draft: Sequence[int], chosen: Sequence[int]) -> int:
    """How many draft tokens greedy decoding confirms: `chosen[i]` is the model's token
    after the sequence and draft[:i]; the draft holds while chosen[i] == draft[i]."""
    n = 0
    while n < len(draft) and chosen[n] == draft[n]:
        n += 1
    return n

"""N-gram speculative decoding (prompt lookup): draft tokens copied from the sequence itself.

Extraction, summaries, code edits and chat about a document repeat what the prompt says: a
name, a number, a line. After each step, the last `n` tokens of a request (n from
`max_ngram` down to `min_ngram`) are looked up among its earlier tokens; the tokens that
followed their latest earlier occurrence are proposed as a draft. The next step feeds the last
token and the draft in one forward (a short decode-style extend over the cached prefix) and
keeps the draft's longest prefix that greedy decoding would have produced itself, plus the
token the model picks after it: one forward, up to `draft + 1` tokens, the same output.

`NgramIndex` keeps, for every n-gram of the sequence, where it last occurred, updated as
tokens are appended (O(max_ngram) per token), so a lookup costs a dictionary probe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


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
    """Latest start position of every n-gram (n in [min_ngram, max_ngram]) of a token
    sequence, excluding the n-gram that ends the sequence (which is what is looked up)."""

    config: SpeculativeConfig
    tokens: list[int] = field(default_factory=list)
    latest: dict[tuple[int, ...], int] = field(default_factory=dict)

    def extend(self, new: Sequence[int]) -> None:
        """Append tokens; index every n-gram that now has a token after it."""
        for token in new:
            end = len(self.tokens)  # n-grams ending here get a follower: `token`
            for n in range(self.config.min_ngram, self.config.max_ngram + 1):
                if end >= n:
                    self.latest[tuple(self.tokens[end - n : end])] = end - n
            self.tokens.append(token)

    def truncate(self, length: int) -> None:
        """Forget the tokens from `length` on (and re-index what remains)."""
        if length < len(self.tokens):
            kept = self.tokens[:length]
            self.tokens, self.latest = [], {}
            self.extend(kept)

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
            start = self.latest.get(tuple(self.tokens[size - n :]))
            if start is not None:
                follow = start + n
                return self.tokens[follow : min(follow + limit, size)]
        return []


def accepted_prefix(draft: Sequence[int], chosen: Sequence[int]) -> int:
    """How many draft tokens greedy decoding confirms: `chosen[i]` is the model's token
    after the sequence and draft[:i]; the draft holds while chosen[i] == draft[i]."""
    n = 0
    while n < len(draft) and chosen[n] == draft[n]:
        n += 1
    return n

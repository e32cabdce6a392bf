"""N-gram drafts (prompt lookup): the index, proposals, and what greedy decoding accepts."""

from __future__ import annotations

import random

import pytest

from plait.backend.speculative.ngram import NgramIndex, SpeculativeConfig, accepted_prefix


def brute_force(tokens: list[int], config: SpeculativeConfig, limit: int) -> list[int]:
    """The definition: the longest n-gram ending the sequence, its latest earlier start."""
    limit = min(limit, config.draft_tokens)
    for n in range(config.max_ngram, config.min_ngram - 1, -1):
        if len(tokens) <= n or limit <= 0:
            continue
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tail:
                return tokens[start + n : start + n + limit]
    return []


def test_a_name_from_the_prompt_is_proposed() -> None:
    index = NgramIndex(SpeculativeConfig(draft_tokens=4))
    index.extend([10, 11, 12, 13, 14, 15, 99, 98, 11, 12])  # "... 11 12 13 14 ..." then 11 12
    assert index.propose(8) == [13, 14, 15, 99]
    assert index.propose(2) == [13, 14]
    index.extend([50])  # 12 50 never occurred, nor 50
    assert index.propose(4) == []


@pytest.mark.parametrize("seed", range(20))
def test_proposals_equal_the_definition_as_tokens_arrive_and_go(seed: int) -> None:
    rng = random.Random(seed)
    config = SpeculativeConfig(draft_tokens=rng.randint(1, 6), max_ngram=rng.randint(1, 4))
    index, tokens = NgramIndex(config), []
    for _ in range(150):
        if rng.random() < 0.1 and tokens:
            cut = rng.randint(0, len(tokens))
            tokens = tokens[:cut]
            index.truncate(cut)
        new = [rng.randint(0, 5) for _ in range(rng.randint(1, 3))]
        tokens += new
        index.extend(new)
        limit = rng.randint(0, 8)
        assert index.propose(limit) == brute_force(tokens, config, limit)


@pytest.mark.parametrize("seed", range(10))
def test_sync_follows_rewritten_ends(seed: int) -> None:
    rng = random.Random(seed)
    config = SpeculativeConfig(draft_tokens=3, max_ngram=rng.randint(1, 3))
    index, tokens = NgramIndex(config), []
    for _ in range(60):
        stable = rng.randint(0, len(tokens))
        tokens = tokens[:stable] + [rng.randint(0, 4) for _ in range(rng.randint(0, 4))]
        index.sync(tokens[stable:], start=stable)
        assert index.tokens == tokens
        assert index.propose(3) == brute_force(tokens, config, 3)


def test_greedy_accepts_the_draft_while_it_agrees() -> None:
    assert accepted_prefix([5, 6, 7], [5, 6, 9, 1]) == 2
    assert accepted_prefix([5, 6, 7], [5, 6, 7, 1]) == 3
    assert accepted_prefix([5], [4, 2]) == 0
    with pytest.raises(ValueError, match="min_ngram"):
        SpeculativeConfig(min_ngram=0)

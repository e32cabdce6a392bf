"""`select` scores equal a plain transformers forward of prompt + choice (same weights)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import transformers

import plait
from helpers import TEST_KV_TOKENS
from plait.backend.model.builtin import resolve_model_path
from plait.select_methods import greedy_index

PREFIX = "Question: which animal says moo?\nAnswer:"
CHOICES = [" a cow", " a very small dog", " the cat", " cows"]


@pytest.fixture(scope="module")
def local() -> Iterator[plait.LocalBackend]:
    with plait.LocalBackend(kv_tokens=TEST_KV_TOKENS, check_integrity=True) as backend:
        yield backend


def reference_logprobs(ids_prefix: list[int], choice: list[int]) -> list[float]:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        resolve_model_path("plait-tiny")
    ).eval()
    seq = torch.tensor([ids_prefix + choice])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(seq).logits[0].float(), dim=-1)
    start = len(ids_prefix)
    return [logprobs[start + i - 1, t].item() for i, t in enumerate(choice)]


@pytest.mark.parametrize(
    "method", ["token_length_normalized", "greedy_token", "unconditional_likelihood_normalized"]
)
def test_select_scores_match_transformers(local: plait.LocalBackend, method: str) -> None:
    @plait.program
    def pick(s):  # type: ignore[no-untyped-def]
        s += PREFIX + plait.select("answer", CHOICES, method=method)

    state = pick.run(backend=local)
    meta = state.meta("answer")
    tok = local.engine.tokenizer
    prefix_ids = tok.encode(PREFIX)
    ref = [reference_logprobs(prefix_ids, tok.encode(c, add_special_tokens=False)) for c in CHOICES]
    for got, want in zip(meta["token_logprobs"], ref, strict=True):
        assert got == pytest.approx(want, abs=1e-4)
    normalized = [sum(r) / len(r) for r in ref]
    assert meta["normalized_logprobs"] == pytest.approx(normalized, abs=1e-4)
    if method == "token_length_normalized":
        expected = max(range(4), key=lambda i: normalized[i])
    elif method == "greedy_token":
        from plait.clients.base import ChoiceLogprobs

        expected = greedy_index([ChoiceLogprobs(r) for r in ref])
    else:
        eos = tok.eos_token_id
        uncond = [
            reference_logprobs([eos], tok.encode(c, add_special_tokens=False)) for c in CHOICES
        ]
        diffs = [
            sum(a - b for a, b in zip(r, u, strict=True)) / len(r)
            for r, u in zip(ref, uncond, strict=True)
        ]
        assert meta["scores"] == pytest.approx(diffs, abs=1e-4)
        expected = max(range(4), key=lambda i: diffs[i])
    assert state["answer"] == CHOICES[expected]

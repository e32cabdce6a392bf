"""Speculative decoding on the real model (SmolLM2-135M-Instruct Q4_1, the fused C decode
step): JSON extraction and a copy-heavy answer token for token as without it, drafts taken."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plait.backend.engine.engine import Engine

pytestmark = pytest.mark.real_model

DATA = Path(__file__).parent / "data" / "extraction"


@pytest.fixture(scope="module")
def speculating() -> Iterator[Engine]:
    """The conftest engine's settings, with drafts of up to 5 tokens."""
    with Engine(
        "smollm2-135m",
        dtype="float32",
        kv_tokens=8192,
        check_integrity=True,
        num_threads=1,
        speculative_draft_tokens=5,
    ) as eng:
        assert eng.runtime.runner.fused_decode == "on"  # type: ignore[union-attr]
        yield eng


def extraction_requests(backend: str) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """Two labeled documents of two schemas as chat prompts (`backend`'s grammars), plus an
    unconstrained copy."""
    from plait.backend.model.builtin import resolve_model_path
    from plait.backend.text.tokenizer import load_tokenizer

    tok = load_tokenizer(resolve_model_path("smollm2-135m"))
    prompts, params = [], []
    for name in ("order", "event"):
        schema = json.loads((DATA / f"{name}.schema.json").read_text())
        for line in (DATA / f"{name}.jsonl").read_text().splitlines()[:2]:
            doc = json.loads(line)
            text = f"{doc['instruction']}\n\n{doc['doc']}"
            prompts.append(text)
            params.append({"temperature": 0.0, "max_new_tokens": 96, "json_schema": schema,
                           "grammar_backend": backend})  # fmt: skip
    prompts.append("Repeat this sentence exactly: The red fox met 3 owls at 7:45 in Lisbon.")
    params.append({"temperature": 0.0, "max_new_tokens": 40})
    ids = []
    for text in prompts:
        chat = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        ids.append(list(tok.encode(chat, add_special_tokens=False)))
    return ids, params


def test_extraction_is_identical_with_drafts(
    smollm2_engine: Engine, speculating: Engine, grammar_backend: str
) -> None:
    ids, params = extraction_requests(grammar_backend)
    pairs = zip(ids, params, strict=True)
    alone = [speculating.generate(input_ids=i, sampling_params=p) for i, p in pairs]
    batched = speculating.generate(input_ids=ids, sampling_params=params)
    for prompt, p, one, many in zip(ids, params, alone, batched, strict=True):
        ref = smollm2_engine.generate(input_ids=prompt, sampling_params=p)
        assert one["output_ids"] == ref["output_ids"] == many["output_ids"]
        assert one["finish_reason"] == ref["finish_reason"]
    accepted = sum(r["usage"].get("spec_accepted_tokens", 0) for r in alone)
    assert accepted > 10
    json.loads(alone[0]["text"])  # the constrained outputs stay valid JSON
    stats = speculating.stats()
    assert stats.extra["spec_acceptance_rate"] > 0.3
    assert stats.kv_used_tokens == 0

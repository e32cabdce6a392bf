"""Greedy decoding is batch-invariant and equals transformers' greedy `generate`."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

from helpers import greedy, tiny_engine
from plait.backend.cache.kv_pool import TokenToKVPool
from plait.backend.engine.engine import Engine
from plait.backend.engine.inprocess import InProcessRuntime
from plait.backend.model.builtin import resolve_model_path

NEW_TOKENS = 12


def make_prompts(n: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(42)
    lengths = torch.randint(3, 90, (n,), generator=gen).tolist()
    shared = torch.randint(3, 16000, (40,), generator=gen).tolist()
    out = []
    for i, length in enumerate(lengths):
        body = torch.randint(3, 16000, (length,), generator=gen).tolist()
        out.append(shared[: (i % 3) * 20] + body)  # some prompts share a prefix
    return out


def trim_eos(ids: list[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in (0, 2):
            return ids[: i + 1]
    return ids


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return make_prompts(32)


@pytest.fixture(scope="module")
def hf_reference(prompts: list[list[int]]) -> list[list[int]]:
    path = resolve_model_path("plait-tiny")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            gen = model.generate(
                torch.tensor([ids]),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            )
            out.append(trim_eos(gen[0, len(ids) :].tolist()))
    return out


def run_batch(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    outs = engine.generate(input_ids=prompts, sampling_params=greedy(NEW_TOKENS))
    return [o["output_ids"] for o in outs]


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"disable_radix_cache": True},
        {"chunked_prefill_size": 16},
        {"chunked_prefill_size": 0, "max_prefill_tokens": 64},
        {"page_size": 4},
        {"schedule_policy": "dfs-weight", "max_running_requests": 5},
        {"schedule_policy": "fcfs", "chunked_prefill_size": 24, "page_size": 2},
    ],
    ids=["default", "no-radix", "chunked16", "no-chunking", "page4", "dfs-weight", "fcfs-mixed"],
)
def test_batch_matches_transformers(
    config: dict, prompts: list[list[int]], hf_reference: list[list[int]]
) -> None:
    with tiny_engine(**config) as engine:
        batched = run_batch(engine, prompts)
        assert batched == hf_reference
        alone = [run_batch(engine, [p])[0] for p in prompts[:4]]
        assert alone == hf_reference[:4]


@pytest.mark.parametrize(
    "config",
    [{}, {"page_size": 4}, {"chunked_prefill_size": 16, "page_size": 2}],
    ids=["default", "page4", "chunked16-page2"],
)
def test_unwritten_kv_slots_are_never_read(
    config: dict,
    prompts: list[list[int]],
    hf_reference: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pool is allocated uninitialised (only the dummy page is zeroed): poisoning every
    other slot with NaN must change nothing, so no path reads a slot before writing it."""
    original = TokenToKVPool.__init__

    def poisoned(self: TokenToKVPool, **kwargs: Any) -> None:
        original(self, **kwargs)
        self.k[:, self.page_size :] = float("nan")
        self.v[:, self.page_size :] = float("nan")

    monkeypatch.setattr(TokenToKVPool, "__init__", poisoned)
    with tiny_engine(**config) as engine:
        assert isinstance(engine.runtime, InProcessRuntime)
        assert torch.isnan(engine.runtime.runner.kv_pool.k[:, -1]).all()
        assert run_batch(engine, prompts) == hf_reference

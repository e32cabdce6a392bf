"""Which waiting requests wait one step to read a prefix that a request admitted in the same
step computes (the in-batch prefix rule of `schedule_policy`)."""

from __future__ import annotations

from plait.backend.req import Req
from plait.backend.sampling_params import SamplingParams
from plait.backend.schedule_policy import (
    SHARED_KEY_LENGTHS,
    AdmissionPlan,
    deciding_key,
    prefix_keys,
)

TEMPLATE = list(range(100, 130))  # 30 tokens, as a chat template's system prompt


def req(rid: str, ids: list[int]) -> Req:
    sp = SamplingParams.from_dict({"max_new_tokens": 4})
    return Req(rid=rid, input_ids=ids, params=sp, eos_ids=frozenset({2}))


def plan_with(*admitted: Req) -> AdmissionPlan:
    plan = AdmissionPlan(budget=10_000, planned=0, future=0)
    for r in admitted:
        plan.take(r, r.seq_len, 0, prefix_keys(r, 0))
    return plan


def waits(plan: AdmissionPlan, r: Req, cached: int = 0) -> bool:
    return plan.shares(prefix_keys(r, cached), r.seq_len - cached)


def test_prompts_on_one_template_wait_for_the_first() -> None:
    plan = plan_with(req("a", TEMPLATE + [1, 2, 3, 4, 5, 6, 7]))
    assert waits(plan, req("b", TEMPLATE + [8, 9, 10, 11, 12, 13, 14]))  # 30 of 37 shared
    assert not waits(plan, req("c", TEMPLATE[:12] + list(range(500, 525))))  # 12 of 37
    assert not waits(plan, req("d", [7] + TEMPLATE + [1, 2, 3]))  # shares nothing at its start


def test_a_long_prompt_waits_only_for_a_long_shared_run() -> None:
    head = list(range(1000, 1040))
    plan = plan_with(req("a", head + list(range(2000, 2200))))
    assert waits(plan, req("b", head + list(range(3000, 3200))))  # 40 shared: >= 32
    assert not waits(plan, req("c", head[:30] + list(range(3000, 3210))))  # 30 of 240


def test_identical_short_prompts_wait_and_keys_start_at_the_cached_length() -> None:
    plan = plan_with(req("a", [5, 6, 7]))
    assert waits(plan, req("b", [5, 6, 7]))  # n > 1 samples of one prompt
    assert not waits(plan, req("c", [5, 6, 8]))
    cached = plan_with(req("a", TEMPLATE + [1] * 20))
    assert not waits(cached, req("b", TEMPLATE + [1] * 20), cached=8)  # keys differ by origin


def test_the_deciding_key_is_the_shortest_covering_half_the_uncached_tokens() -> None:
    keys = prefix_keys(req("a", list(range(200))), 0)
    assert [len(k[1]) for k in keys] == list(SHARED_KEY_LENGTHS)
    assert deciding_key(keys, 10) == keys[0]  # never fewer than 16 tokens
    assert deciding_key(keys, 37) == keys[1]  # 19 needed: 24
    assert deciding_key(keys, 64) == keys[2]
    assert deciding_key(keys, 5000) == keys[2]  # at most 32

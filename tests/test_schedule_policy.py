"""Which waiting requests wait one step to read a prefix that a request admitted in the same
step computes (the in-batch prefix rule of `schedule_policy` and `Scheduler._waits_to_share`):
the rule's keys, then bursts through a real scheduler (plait-tiny), counting admissions per
step and the tokens read from the cache."""

from __future__ import annotations

from typing import Any

import pytest

from plait.backend.config import EngineConfig
from plait.backend.request.messages import TokenizedRequest
from plait.backend.request.req import Req
from plait.backend.request.sampling_params import SamplingParams
from plait.backend.scheduler.loop import build_scheduler
from plait.backend.scheduler.policy import (
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
    return plan.shared_run(prefix_keys(r, cached), r.seq_len - cached) > 0


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


def burst(prompts: list[list[int]], **config: Any) -> tuple[list[int], int]:
    """Admissions per step until every request is admitted, and the tokens read from the
    cache, for `prompts` queued together on a fresh scheduler."""
    cfg = EngineConfig(model="plait-tiny", kv_tokens=4096, num_threads=1, **config)
    scheduler, _ = build_scheduler(cfg)
    params = SamplingParams.from_dict({"max_new_tokens": 3, "temperature": 0, "ignore_eos": True})
    for i, ids in enumerate(prompts):
        scheduler.add_request(TokenizedRequest(rid=f"r{i}", input_ids=ids, params=params))
    admitted = []
    while scheduler.waiting:
        before = len(scheduler.waiting)
        scheduler.step()
        admitted.append(before - len(scheduler.waiting))
    while scheduler.running:
        scheduler.step()
    return admitted, scheduler.stats().cache_hit_tokens


TOPICS = [TEMPLATE + [400 + i, 401, 402, 403, 404, 405, 406] for i in range(8)]  # 30 of 37


def test_a_burst_on_one_template_computes_it_once() -> None:
    admitted, cached = burst(TOPICS)
    assert admitted == [1, 7]  # the first computes the template, the others read it
    assert cached == 7 * 30


@pytest.mark.parametrize("page_size", [16, 32])
def test_with_pages_a_wait_must_gain_a_page(page_size: int) -> None:
    admitted, cached = burst(TOPICS, page_size=page_size)
    if page_size == 16:  # 30 shared tokens: one whole page comes from the cache
        assert admitted == [1, 7] and cached == 7 * 16
    else:  # no whole page to gain: nobody waits
        assert admitted == [8] and cached == 0


def test_samples_of_one_prompt_wait_once() -> None:
    prompt = list(range(300, 340))
    admitted, cached = burst([prompt] * 6)
    assert admitted == [1, 5] and cached == 5 * 39  # all but the last token, recomputed

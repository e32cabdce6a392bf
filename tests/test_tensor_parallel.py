"""Tensor parallelism (`Engine(tp=2)`, `plait serve --tp 2`) on the CPU with gloo: greedy
tokens identical to one rank, and a lost rank ends the runtime with nothing left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Any

import httpx
import pytest
from server_helpers import MODEL, alive, descendants_of, process_name, server_args, wait_until

from plait.backend.engine.engine import Engine, GenerationError
from plait.runtime import Runtime, free_port, serve_command

PROMPTS = ["The capital of France is", "Write a poem about the sea:", "1, 2, 3,", "def f(x):"]
GREEDY = {
    "max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True,
    "return_logprob": True, "top_logprobs_num": 2,
}  # fmt: skip
# Two ranks sum each row-parallel product in another order than one rank: logits differ by
# about 1e-5, so a greedy pick may differ only where one rank's top two are this close.
TIE_GAP = 1e-4
Greedy = list[tuple[list[int], list[list[tuple[float, int]]]]]


def greedy_ids(model: str, *, tp: int, fused: bool = True, **config: Any) -> Greedy:
    """Greedy ids of PROMPTS and each step's top two (logprob, id); `fused`: whether the
    fused decode step must be on."""
    with Engine(model, tp=tp, num_threads=1, kv_tokens=4096, **config) as engine:
        assert (engine.runtime.runner.fused_decode == "on") == fused
        out = engine.generate(PROMPTS, GREEDY)
    return [(o["output_ids"], o["logprobs"]["output_top"]) for o in out]


def assert_same_greedy(two: Greedy, one: Greedy) -> None:
    """`two`'s tokens are `one`'s up to the first step where they differ, and they differ
    only at a tie (one's top two within TIE_GAP, two's pick among them); at least 3/4 of all
    tokens are compared."""
    compared = 0
    for (ids2, _), (ids1, top1) in zip(two, one, strict=True):
        diffs = (i for i, (a, b) in enumerate(zip(ids2, ids1, strict=False)) if a != b)
        same = next(diffs, len(ids1))
        compared += same
        if same < len(ids1):
            (lp_a, id_a), (lp_b, id_b) = top1[same]
            assert abs(lp_a - lp_b) < TIE_GAP and ids2[same] in (id_a, id_b), (same, top1[same])
        assert len(ids2) == len(ids1)
    assert compared >= 0.75 * sum(len(ids) for ids, _ in one)


@pytest.mark.parametrize("quantization", ["none", "int8", "int4"])
def test_tp2_greedy_tokens_equal_tp1_on_plait_tiny(quantization: str) -> None:
    fused = quantization != "none"  # the fused C step with its all-reduce callback
    one = greedy_ids("plait-tiny", tp=1, fused=fused, quantization=quantization)
    two = greedy_ids("plait-tiny", tp=2, fused=fused, quantization=quantization)
    assert_same_greedy(two, one)
    assert all(len(ids) == GREEDY["max_new_tokens"] for ids, _ in one)


@pytest.mark.real_model
def test_tp2_greedy_tokens_equal_tp1_on_smollm2() -> None:
    one = greedy_ids("smollm2-135m", tp=1)
    two = greedy_ids("smollm2-135m", tp=2)
    assert_same_greedy(two, one)


def test_a_killed_rank_fails_the_engine_and_leaves_no_process() -> None:
    engine = Engine("plait-tiny", tp=2, num_threads=1, kv_tokens=4096)
    parallel = engine.runtime.runner.parallel
    assert parallel is not None
    (follower,) = parallel.procs
    assert engine.generate("hello", {"max_new_tokens": 4})["output_ids"]
    long = {"max_new_tokens": 3000, "ignore_eos": True}
    running = threading.Thread(target=lambda: result.append(_outcome(engine, long)))
    result: list[str] = []
    running.start()
    time.sleep(1.0)  # mid-run
    os.kill(follower.pid, signal.SIGKILL)
    running.join(timeout=30)
    assert result and "exited" in result[0]
    assert engine.failure is not None and "exited" in engine.failure
    with pytest.raises(GenerationError):
        engine.generate("hello", {"max_new_tokens": 4})
    engine.shutdown()
    assert not alive(follower.pid)


def _outcome(engine: Engine, params: dict[str, Any]) -> str:
    try:
        engine.generate("count:", params)
    except GenerationError as exc:
        return str(exc)
    return "finished"


def test_plait_serve_tp2_answers_then_exits_nonzero_when_a_rank_dies() -> None:
    rt = Runtime(**server_args(tp=2))
    try:
        body = {"text": "Hello", "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
        reply = httpx.post(rt.url + "/generate", json=body, timeout=60)
        assert reply.status_code == 200 and reply.json()["text"]
        family = descendants_of(rt.pid)
        (rank1,) = [pid for pid in family if process_name(pid) == "plait-tp1"]
        started = time.monotonic()
        os.kill(rank1, signal.SIGKILL)
        assert rt.process.wait(timeout=30) != 0
        assert time.monotonic() - started < 30
        assert wait_until(lambda: not any(alive(pid) for pid in family), 10)
    finally:
        rt.close()


def test_two_nodes_on_one_host_serve_and_stop_together() -> None:
    """`--nnodes 2`: node 1 (`--node-rank 1`, no HTTP) joins node 0's rendezvous."""
    multi = server_args(tp=2, nnodes=2, dist_init_addr=f"127.0.0.1:{free_port()}")
    node1 = subprocess.Popen(serve_command(MODEL, node_rank=1, **multi), stdin=subprocess.DEVNULL)
    try:
        with Runtime(**multi) as rt:
            body = {"text": "Hi", "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
            reply = httpx.post(rt.url + "/generate", json=body, timeout=60)
            assert reply.status_code == 200 and len(reply.json()["output_ids"]) == 4
        assert node1.wait(timeout=30) == 0
    finally:
        if node1.poll() is None:
            node1.kill()

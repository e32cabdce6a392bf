"""Engine(processes=True): the server's runtime (scheduler and detokenizer processes)."""

from __future__ import annotations

import asyncio
import os
import stat

import pytest

from helpers import TEST_KV_TOKENS, greedy, tiny_engine
from plait.backend.config import EngineConfig
from plait.backend.engine.engine import Engine, GenerationError
from plait.backend.engine.multiprocess import MultiProcessRuntime, RuntimeStartError
from plait.backend.request.sampling_params import SamplingParams

PROMPTS = [[5, 6, 7, 8], [9, 10], list(range(100, 140))]


def expected_ids() -> list[list[int]]:
    with tiny_engine() as local:
        outs = local.generate(input_ids=PROMPTS, sampling_params=greedy(10, ignore_eos=True))
    return [o["output_ids"] for o in outs]


def test_processes_give_the_in_process_results() -> None:
    expected = expected_ids()
    with Engine("plait-tiny", processes=True, kv_tokens=TEST_KV_TOKENS, num_threads=1) as engine:
        ipc_dir = engine.runtime.addrs.main.removeprefix("ipc://").rsplit("/", 1)[0]
        assert stat.S_IMODE(os.stat(ipc_dir).st_mode) == 0o700
        params = greedy(10, ignore_eos=True)
        outs = engine.generate(input_ids=PROMPTS, sampling_params=params)
        assert [o["output_ids"] for o in outs] == expected
        streamed = list(engine.generate(input_ids=PROMPTS[0], sampling_params=params, stream=True))
        assert sum((p["output_ids"] for p in streamed), []) == expected[0]
        assert engine.stats().generated_tokens >= 40
        with pytest.raises(GenerationError, match="temperature"):
            engine.generate("x", {"temperature": -1})
        samples = asyncio.run(collect(engine))
        assert [s["output_ids"] for s in samples] == [expected[0], expected[0]]
    assert not os.path.exists(ipc_dir)


async def collect(engine: Engine) -> list[dict[str, object]]:
    params = SamplingParams(n=2, max_new_tokens=10, temperature=0, ignore_eos=True)
    final = [None, None]
    async for index, item in engine.stream_batch([(PROMPTS[0], params)], stream=False):
        final[index] = item
    return final  # type: ignore[return-value]


def test_exec_started_children_serve_too() -> None:
    config = EngineConfig(model="plait-tiny", kv_tokens=1024)
    got: list[object] = []
    runtime = MultiProcessRuntime(config=config, deliver=got.append, start_method="exec")
    try:
        assert runtime.info.kv_tokens == 1024 and runtime.failure is None
    finally:
        runtime.close()
    assert all(proc.poll() is not None for proc in runtime.processes.values())


def test_a_child_that_cannot_start_is_reported() -> None:
    with pytest.raises(RuntimeStartError, match="scheduler process failed"):
        Engine("plait-tiny", processes=True, kv_tokens=1024, dtype="float7")

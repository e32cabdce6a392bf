"""The KV pool's size: from `kv_tokens`, else a byte budget (`kv_memory_mib`), else a share
of the device's memory (`mem_fraction`); the startup log states the size and its source."""

from __future__ import annotations

import logging

import pytest

from plait.backend.config import DEFAULT_MEM_FRACTION, EngineConfig
from plait.backend.model.runner import ModelRunner


def per_token(runner: ModelRunner) -> int:
    cfg = runner.model.cfg
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * runner.dtype.itemsize


def test_a_byte_budget_sizes_the_pool_and_the_log_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="plait.runner"):
        runner = ModelRunner(EngineConfig(model="plait-tiny", kv_memory_mib=3))
    assert runner.kv_pool.size == 3 * 2**20 // per_token(runner)
    assert f"KV pool: {runner.kv_pool.size} tokens" in caplog.text
    assert "kv_memory_mib" in caplog.text


def test_tokens_win_over_the_budget_and_a_fraction_is_of_available_ram(
    caplog: pytest.LogCaptureFixture,
) -> None:
    both = ModelRunner(EngineConfig(model="plait-tiny", kv_tokens=1000, kv_memory_mib=64))
    assert both.kv_pool.size == 1000
    with caplog.at_level(logging.INFO, logger="plait.runner"):
        small = ModelRunner(EngineConfig(model="plait-tiny", mem_fraction=0.0001))
    assert "0.0001 of available RAM" in caplog.text
    default = EngineConfig(model="plait-tiny")
    assert default.memory_fraction("cpu") == DEFAULT_MEM_FRACTION["cpu"]
    assert default.memory_fraction("cuda") == DEFAULT_MEM_FRACTION["cuda"]
    assert small.kv_pool.size <= default.max_kv_tokens_cpu


@pytest.mark.parametrize(
    ("field", "value"), [("kv_memory_mib", 0), ("mem_fraction", 0.0), ("mem_fraction", 1.5)]
)
def test_out_of_range_memory_settings_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{field: value})

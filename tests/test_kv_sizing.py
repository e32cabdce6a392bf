"""The KV pool's size: from `kv_tokens`, else a byte budget (`kv_memory_mib`), else a share
of the device's memory (`mem_fraction`); the startup log states the size and its source.
And the host's memory between forwards: what a forward frees is kept for the next one."""

from __future__ import annotations

import logging
import subprocess
import sys

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


# A block of 64 MiB touched and freed twice: the page faults of the second time, before and
# after keep_freed_memory, then on a thread of its own (64 and 96 MiB: a thread's arena heaps
# are 64 MiB), in a process of its own (the setting is process-wide).
REFAULTS = """
import ctypes, resource, threading
from plait.backend.host import keep_freed_memory
libc = ctypes.CDLL(None)
libc.prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: 4 KiB pages whatever the host's THP setting
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def refaults(n):
    for _ in range(2):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        p = libc.malloc(n)
        ctypes.memset(p, 1, n)
        libc.free(p)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
def on_a_thread(n):  # a program that sets the policy may run its forwards on another thread
    got = []
    t = threading.Thread(target=lambda: got.append(refaults(n)))
    t.start()
    t.join()
    return got[0]
plain = refaults(64 << 20)
kept = keep_freed_memory()
print(plain, int(kept), refaults(64 << 20), on_a_thread(64 << 20), on_a_thread(96 << 20))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_memory_a_forward_frees_is_kept_for_the_next_instead_of_faulted_in_again() -> None:
    run = subprocess.run([sys.executable, "-c", REFAULTS], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    plain, kept, *after = (int(v) for v in run.stdout.split())
    assert kept == 1
    assert plain >= (64 << 20) // 4096 // 2  # a fresh mapping, faulted in page by page
    assert all(a * 100 <= plain for a in after)  # the freed block came back as it was

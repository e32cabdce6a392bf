"""The benchmark harness at a tiny size, against plait only (keeps `make bench` from rotting).

Every workload builds its data and runs its plait program through `run_batch` on one shared
in-process engine; the report, the targets and the plots are produced from the runs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# `benchmarks` lives at the root
sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.workloads import NAMES, load  # noqa: E402
from benchmarks.workloads.harness import (  # noqa: E402
    PLAIT,
    Clock,
    PlaitSystem,
    PlaitTarget,
    RecordingBackend,
    Run,
    optimum_hit_rate,
)
from benchmarks.workloads.report import check_targets, row, table  # noqa: E402
from benchmarks.workloads.text import TextMaker  # noqa: E402


@pytest.fixture(scope="module")
def target() -> Iterator[PlaitTarget]:
    with PlaitTarget(PlaitSystem(PLAIT), kv_tokens=16384) as t:
        yield t


@pytest.fixture(scope="module")
def runs(target: PlaitTarget) -> dict[str, tuple[Any, Run]]:
    out = {}
    for name in NAMES:
        workload = load(name)
        data = workload.build("smoke", TextMaker(target.tokenizer, seed=len(name)))
        out[name] = (data, workload.plait(data, target))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_workload_runs_on_plait(runs: dict[str, tuple[Any, Run]], name: str) -> None:
    _, run = runs[name]
    assert run.programs == len(run.latencies) == len(run.outputs) > 0
    assert 0 < max(run.latencies) <= run.seconds
    assert run.hit_rate is not None and 0.0 <= run.hit_rate <= 1.0
    assert run.optimum_hit is not None and run.hit_rate <= run.optimum_hit + 1e-9
    if name != "select_heavy":
        assert run.output_tokens > 0


def test_few_shot_reuses_the_whole_prefix(runs: dict[str, tuple[Any, Run]]) -> None:
    _, run = runs["few_shot_qa"]
    assert run.optimum_hit is not None and run.hit_rate is not None
    assert run.hit_rate >= 0.95 * run.optimum_hit


def test_json_outputs_are_valid(runs: dict[str, tuple[Any, Run]]) -> None:
    _, run = runs["json_extraction"]
    assert run.extra["valid_json"] == 1.0


def test_report_and_plots(runs: dict[str, tuple[Any, Run]], tmp_path: Path) -> None:
    rows = [row(name, PLAIT, run, run) for name, (_, run) in runs.items()]
    assert all(r["plait_speedup"] == 1.0 and r["same_output_as_plait"] == 1.0 for r in rows)
    text = table(rows)
    assert all(name in text for name in NAMES)
    assert any(c["met"] for c in check_targets(rows))  # the hit-rate target
    pytest.importorskip("matplotlib")
    from benchmarks.plot import plot_workloads

    info = {"rows": rows, "titles": {}}
    assert len(plot_workloads(info, tmp_path)) == len(NAMES)


def test_chat_prompt_is_what_the_peer_sends(target: PlaitTarget) -> None:
    """The transformers peer renders the same text as plait's roles (first turn)."""
    from benchmarks.workloads import multi_turn_chat as chat

    data = chat.build("smoke", TextMaker(target.tokenizer, seed=1))
    first = data.conversations[0][0]
    backend = target.backend
    assert isinstance(backend, RecordingBackend)
    backend.events.clear()
    chat.chat.run(
        system=data.system, turns=[first], new_tokens=2, index=0, clock=Clock(),
        backend=backend, temperature=0,
    )  # fmt: skip
    messages = [{"role": "system", "content": data.system}, {"role": "user", "content": first}]
    peer = target.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert backend.events[0][0] == peer


def test_optimum_counts_tokens_seen_before() -> None:
    events = [([1, 2, 3], True), ([1, 2, 3, 4, 5], False), ([1, 2, 3, 4, 6], True)]
    assert optimum_hit_rate(events) == pytest.approx(1 - 4 / 8)


@pytest.mark.parametrize("name", NAMES)
def test_head_keeps_the_first_items(runs: dict[str, tuple[Any, Run]], name: str) -> None:
    data, _ = runs[name]
    workload = load(name)
    cut = workload.head(data, 1)
    for field in workload.items:
        assert getattr(cut, field) == getattr(data, field)[:1]
    rest = set(vars(data)) - set(workload.items)
    assert all(getattr(cut, f) == getattr(data, f) for f in rest)

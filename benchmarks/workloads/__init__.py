"""The SGLang-paper-shaped workloads, each a plait program and the peers' plain calls."""

from __future__ import annotations

import importlib

from benchmarks.workloads.harness import Workload

NAMES = (
    "few_shot_qa",
    "select_heavy",
    "multi_turn_chat",
    "json_extraction",
    "react_agent",
    "tree_of_thought",
    "random_mix",
)


def load(name: str) -> Workload:
    """The `WORKLOAD` of module `benchmarks.workloads.<name>`."""
    if name not in NAMES:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(NAMES)}")
    workload = importlib.import_module(f"benchmarks.workloads.{name}").WORKLOAD
    assert isinstance(workload, Workload)
    return workload

"""From `Run`s to rows, ratios to plait, the targets, and the markdown table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.common import markdown_table
from benchmarks.workloads.harness import HF, OUTLINES, PLAIT, Run

HEADER = (
    "workload", "system", "programs/s", "tokens/s", "p50 s", "p90 s", "cache hit",
    "plait speed-up", "same output", "note",
)  # fmt: skip


@dataclass(frozen=True)
class Target:
    """plait must be `at_least` times faster than `system` on `workload` (programs/s)."""

    workload: str
    system: str
    at_least: float


TARGETS = (
    Target("few_shot_qa", HF, 5.0),
    Target("select_heavy", HF, 5.0),
    Target("multi_turn_chat", HF, 5.0),
    Target("random_mix", HF, 2.0),
    Target("json_extraction", OUTLINES, 5.0),
)
HIT_TARGET = ("few_shot_qa", 0.95)  # plait's hit rate / the optimum


def percentile(values: Sequence[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


def row(workload: str, system: str, run: Run, plait: Run | None) -> dict[str, Any]:
    """One table row as a dict (what the JSON keeps)."""
    throughput = run.programs / run.seconds
    out: dict[str, Any] = {
        "workload": workload, "system": system, "programs": run.programs,
        "seconds": run.seconds, "programs_per_s": throughput,
        "tokens_per_s": run.output_tokens / run.seconds, "output_tokens": run.output_tokens,
        "p50_s": percentile(run.latencies, 50), "p90_s": percentile(run.latencies, 90),
        "hit_rate": run.hit_rate, "optimum_hit_rate": run.optimum_hit, **run.extra,
    }  # fmt: skip
    if plait is not None:
        out["plait_speedup"] = (plait.programs / plait.seconds) / throughput
        mine = run.outputs  # a sampled run holds the first items only
        same = sum(a == b for a, b in zip(plait.outputs[: len(mine)], mine, strict=True))
        out["same_output_as_plait"] = same / len(run.outputs)
    return out


def unavailable(workload: str, system: str, reason: str) -> dict[str, Any]:
    return {"workload": workload, "system": system, "unavailable": reason}


def _cells(r: dict[str, Any]) -> list[Any]:
    if "unavailable" in r:
        return [r["workload"], r["system"], "n/a", "", "", "", "", "", "", r["unavailable"]]
    hit = "" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}"
    if r.get("optimum_hit_rate"):
        hit += f" (opt {r['optimum_hit_rate']:.1%})"
    return [
        r["workload"],
        r["system"],
        f"{r['programs_per_s']:.3g}",
        f"{r['tokens_per_s']:.3g}" if r["output_tokens"] else "-",
        f"{r['p50_s']:.3g}",
        f"{r['p90_s']:.3g}",
        hit,
        f"{r['plait_speedup']:.2f}x" if "plait_speedup" in r else "",
        f"{r['same_output_as_plait']:.0%}" if "same_output_as_plait" in r else "",
        _note(r),
    ]


def _note(r: dict[str, Any]) -> str:
    notes = [f"valid JSON {r['valid_json']:.0%}"] if "valid_json" in r else []
    if r.get("sampled_of"):
        notes.append(f"first {r['programs']} of {r['sampled_of']} items")
    return "; ".join(notes)


def table(rows: Sequence[dict[str, Any]]) -> str:
    return markdown_table(HEADER, [_cells(r) for r in rows])


def check_targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target with the measured value and whether it was met (None: not measured)."""
    found = {(r["workload"], r["system"]): r for r in rows}
    out = []
    for t in TARGETS:
        r = found.get((t.workload, t.system), {})
        value = r.get("plait_speedup")
        out.append({
            "target": f"plait >= {t.at_least:g}x {t.system} on {t.workload}",
            "value": value, "met": None if value is None else value >= t.at_least,
        })  # fmt: skip
    r = found.get((HIT_TARGET[0], PLAIT), {})
    if r.get("optimum_hit_rate"):
        value = r["hit_rate"] / r["optimum_hit_rate"]
        out.append({
            "target": f"plait hit rate >= {HIT_TARGET[1]:.0%} of optimum on {HIT_TARGET[0]}",
            "value": value, "met": value >= HIT_TARGET[1],
        })  # fmt: skip
    return out


def targets_table(checks: Sequence[dict[str, Any]]) -> str:
    cells = []
    for c in checks:
        met = {True: "met", False: "missed", None: "not measured"}[c["met"]]
        value = "" if c["value"] is None else f"{c['value']:.2f}"
        cells.append([c["target"], value, met])
    return markdown_table(["target", "measured", "result"], cells)

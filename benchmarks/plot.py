"""Bar charts of a workload run, and the latest table in docs/benchmarks.md.

    python -m benchmarks.plot [benchmarks/results/workloads.json]

One PNG per workload (`<out>/<workload>.png`): programs/s per system, with plait's speed-up
over each, and p50/p90 latency. `update_docs` replaces the text between the result markers
of docs/benchmarks.md with the table of the run.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.workloads.report import table, targets_table

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"
COLORS = {"plait": "#1d4e89", "variant": "#6fa8dc", "peer": "#adb5bd"}


def plot_workloads(info: dict[str, Any], out: Path) -> list[Path]:
    """One PNG per workload with at least one measured system; the paths written."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plots")
        return []
    matplotlib.use("Agg")
    paths = []
    for name in dict.fromkeys(r["workload"] for r in info["rows"]):
        rows = [r for r in info["rows"] if r["workload"] == name and "unavailable" not in r]
        if rows:
            title = f"{info.get('titles', {}).get(name, name)} [{info.get('scale', '')} run]"
            paths.append(plot_one(rows, title, out / f"{name}.png"))
    return paths


def plot_one(rows: Sequence[dict[str, Any]], title: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.6 * len(rows) + 2.2))
    throughput_panel(left, rows)
    latency_panel(right, rows)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def throughput_panel(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    """programs/s per system, each bar labelled with plait's speed-up over it."""
    systems = [r["system"] for r in rows]
    ys = range(len(rows))
    bars = ax.barh(
        ys, [r["programs_per_s"] for r in rows], color=[COLORS[kind(s)] for s in systems]
    )
    for bar, r in zip(bars, rows, strict=True):
        if "plait_speedup" in r and r["system"] != "plait":
            label = f" plait {r['plait_speedup']:.2f}x"
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, label, va="center")
    ax.set(yticks=list(ys), yticklabels=systems, xlabel="programs / s (higher is better)")
    ax.invert_yaxis()


def latency_panel(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    ys, height = range(len(rows)), 0.4
    ax.barh([y - height / 2 for y in ys], [r["p50_s"] for r in rows], height, label="p50")
    ax.barh([y + height / 2 for y in ys], [r["p90_s"] for r in rows], height, label="p90")
    ax.set(yticks=list(ys), yticklabels=[], xlabel="latency s (lower is better)")
    ax.invert_yaxis()
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, frameon=False)


def kind(system: str) -> str:
    if system == "plait":
        return "plait"
    return "variant" if system.startswith("plait") else "peer"


def results_section(info: dict[str, Any]) -> str:
    load = ", ".join(f"{x:.1f}" for x in info["load_avg_before"])
    return (
        f"Run finished {info['time']} ({info['scale']} run, {info['wall_s'] / 60:.0f} min, "
        f"load average before {load}; torch {info['torch']}).\n\n"
        + table(info["rows"])
        + "\n\n"
        + targets_table(info["targets"])
    )


def update_docs(info: dict[str, Any], docs: Path = DOCS) -> bool:
    """Replace the results section of docs/benchmarks.md; False if it has no markers."""
    if not docs.exists():
        return False
    text = docs.read_text()
    if START not in text or END not in text:
        return False
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    docs.write_text(f"{head}{START}\n{results_section(info)}\n{END}{tail}")
    return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else Path(__file__).with_name("results") / "workloads.json"
    info = json.loads(path.read_text())
    for png in plot_workloads(info, path.parent):
        print(png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

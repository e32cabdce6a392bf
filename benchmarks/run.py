"""`make bench`: every workload on plait, its ablations and the peers, then the other suites.

    python -m benchmarks.run [--quick] [--workloads few_shot_qa,random_mix] [--no-peers]
                             [--no-suites] [--out benchmarks/results]

All systems use the weights of plait-small and the same prompts; each ratio to plait is
measured in the same run. Prints a markdown table, writes `workloads.json` and one PNG per
workload under `--out`, and (full runs) the table into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import subprocess
import sys
import time
import traceback
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from benchmarks.common import RESULTS, setup_torch
from benchmarks.peers import Peers, Unavailable
from benchmarks.plot import plot_workloads, update_docs
from benchmarks.workloads import NAMES, load
from benchmarks.workloads.harness import (
    HTTP,
    MODEL,
    NO_JUMP,
    NO_RADIX,
    PLAIT,
    PlaitSystem,
    PlaitTarget,
    Run,
    Scale,
    Workload,
)
from benchmarks.workloads.report import check_targets, row, table, targets_table, unavailable
from benchmarks.workloads.text import TextMaker

PLAIT_SYSTEMS = {
    PLAIT: PlaitSystem(PLAIT),
    NO_RADIX: PlaitSystem(NO_RADIX, {"disable_radix_cache": True}),
    NO_JUMP: PlaitSystem(NO_JUMP, {"enable_jump_forward": False}),
    HTTP: PlaitSystem(HTTP, http=True),
}
# module and arguments; the 1B-class file of random Q4_K_M blocks is written on first use
# (docs/performance.md), llama.cpp given its 4,096-token context for plait too
SUITES = (
    ("runtime_core",), ("frontend_overhead",), ("kernels",), ("structured",), ("cpu_peers",),
    ("cpu_peers", "--model", "llama-1b", "--kv-tokens", "4096"),
    ("cpu_peers", "--model", "llama-1b", "--kv-tokens", "4096", "--activation-bits", "8"),
    ("decode_speed",),
    ("speculative",), ("extraction_accuracy",), ("tensor_parallel",), ("dp_router",),
)  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="small sizes, plait and peers only, no suites"
    )
    parser.add_argument(
        "--scale", choices=("full", "quick", "smoke"), default=None,
        help="sizes (smoke: tiny, every system: a check of the harness)",
    )  # fmt: skip
    parser.add_argument("--workloads", default=",".join(NAMES))
    parser.add_argument("--no-peers", action="store_true", help="plait systems only")
    parser.add_argument("--no-suites", action="store_true", help="skip the other benchmarks")
    parser.add_argument("--no-docs", action="store_true", help="leave docs/benchmarks.md")
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args(argv)


def system_runners(
    workload: Workload, data: Any, peers: Peers | None, quick: bool
) -> Iterator[tuple[str, Callable[[], Run]]]:
    """(system, thunk) for every system of the workload, plait first. Systems that share
    nothing between items run on the workload's sample in the full run."""
    sample = data if quick or workload.sample is None else workload.head(data, workload.sample)
    for name in (PLAIT,) if quick else workload.systems:
        system, items = PLAIT_SYSTEMS[name], sample if name == NO_RADIX else data

        def on_plait(system: PlaitSystem = system, items: Any = items) -> Run:
            with PlaitTarget(system, workload.kv_tokens) as target:
                return workload.plait(items, target)

        yield name, on_plait
    if peers is not None:
        for name, fn in workload.peers.items():
            yield name, functools.partial(peer_with_work, fn, sample, peers)


def peer_with_work(fn: Callable[[Any, Peers], Run], data: Any, peers: Peers) -> Run:
    """Run a peer and keep the tokens it put through the model (warm-up excluded)."""
    run = fn(data, peers)
    return dataclasses.replace(run, extra={"work": dict(peers.hf.work), **run.extra})


def run_workload(
    workload: Workload, scale: Scale, peers: Peers | None, maker: TextMaker, bar: Any
) -> list[dict[str, Any]]:
    data = workload.build(scale, maker)
    rows: list[dict[str, Any]] = []
    runs: dict[str, Run] = {}
    for name, thunk in system_runners(workload, data, peers, scale == "quick"):
        bar.set_description(f"{workload.name}: {name}")
        try:
            runs[name] = thunk()
            rows.append(row(workload.name, name, runs[name], runs.get(PLAIT)))
            if runs[name].programs < runs[PLAIT].programs:
                rows[-1]["sampled_of"] = runs[PLAIT].programs
        except Unavailable as exc:
            rows.append(unavailable(workload.name, name, str(exc)))
        except Exception as exc:  # noqa: BLE001 - one broken system must not end the run
            traceback.print_exc()
            rows.append(unavailable(workload.name, name, f"error: {exc}".splitlines()[0]))
        bar.update(1)
    return rows


def run_suites() -> dict[str, int]:
    """The other benchmark modules that exist, each as a subprocess; their exit codes."""
    codes = {}
    for name, *args in SUITES:
        if not (Path(__file__).parent / f"{name}.py").exists():
            continue
        cmd = [sys.executable, "-m", f"benchmarks.{name}", *args]
        print(f"\n== python {' '.join(cmd[1:])}", flush=True)
        codes[" ".join([name, *args])] = subprocess.run(cmd, check=False).returncode
    return codes


def environment() -> dict[str, Any]:
    return {
        "machine": platform.machine(), "python": platform.python_version(),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }  # fmt: skip


def save(info: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "workloads.json"
    path.write_text(json.dumps(info, indent=2))
    return path


def count_systems(workloads: list[Workload], peers: bool, quick: bool) -> int:
    plait = [1 if quick else len(w.systems) for w in workloads]
    return sum(plait) + sum(len(w.peers) for w in workloads if peers)


def measure(workloads: list[Workload], scale: Scale, peers: Peers | None) -> dict[str, Any]:
    """Every system on every workload; the run's rows, target checks and conditions."""
    from transformers import AutoTokenizer

    from plait.backend.model.builtin import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(MODEL))
    load_before, started = os.getloadavg(), time.time()
    rows: list[dict[str, Any]] = []
    total = count_systems(workloads, peers is not None, scale == "quick")
    with tqdm(total=total, unit="system") as bar:
        for w in workloads:
            maker = TextMaker(tokenizer, seed=zlib.crc32(w.name.encode()))
            rows += run_workload(w, scale, peers, maker, bar)
    return {
        **environment(), "scale": scale, "model": MODEL, "rows": rows,
        "targets": check_targets(rows), "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(), "wall_s": time.time() - started,
        "titles": {w.name: w.title for w in workloads},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_torch()
    scale: Scale = args.scale or ("quick" if args.quick else "full")
    workloads = [load(n.strip()) for n in args.workloads.split(",") if n.strip()]
    info = measure(workloads, scale, None if args.no_peers else Peers(MODEL))
    print("\n" + table(info["rows"]) + "\n\n" + targets_table(info["targets"]))
    if scale != "full":
        print(f"({scale} sizes: too small for the targets to mean anything; run the full set)")
    out = args.out or (RESULTS if scale == "full" else RESULTS / scale)
    path = save(info, out)
    print(f"\nwrote {path} and {len(plot_workloads(info, out))} plots under {out}")
    if scale == "full" and not args.no_docs:
        update_docs(info)
    failed = {} if scale != "full" or args.no_suites else run_suites()
    failed = {name: code for name, code in failed.items() if code != 0}
    if failed:
        print(f"suites that failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

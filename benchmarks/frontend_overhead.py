"""Frontend overhead: 256 small programs through run_batch on a LocalBackend.

The engine's busy time is the scheduler's own step time; everything else in the wall time of
`run_batch` is frontend work (tracing, greenlets, executors, result assembly) or idle gaps.

    python -m benchmarks.frontend_overhead [--programs 256] [--repeats 3]
"""

from __future__ import annotations

import argparse

import plait
from benchmarks.common import markdown_table, median, setup_torch, timed, write_results


@plait.program
def small(s, i):  # type: ignore[no-untyped-def]
    s += f"Item {i}: summarize in a few words. "
    s += plait.gen("a", max_tokens=8, min_tokens=8)


def run_once(backend: plait.LocalBackend, n: int) -> tuple[float, float]:
    before = backend.engine.stats().extra["busy_s"]
    wall, states = timed(
        lambda: small.run_batch([{"i": i} for i in range(n)], backend=backend, temperature=0)
    )
    busy = backend.engine.stats().extra["busy_s"] - before
    assert all(len(st["a"]) > 0 or st.meta("a")["usage"]["completion_tokens"] == 8 for st in states)
    return wall, busy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--programs", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="plait-tiny")
    args = parser.parse_args()
    setup_torch()
    with plait.LocalBackend(args.model, kv_tokens=65536) as backend:
        run_once(backend, 16)  # warm up
        runs = [run_once(backend, args.programs) for _ in range(args.repeats)]
    walls, busies = [w for w, _ in runs], [b for _, b in runs]
    fractions = [(w - b) / w for w, b in runs]
    rows = [[args.programs, median(walls), median(busies), median(fractions)]]
    print(markdown_table(["programs", "wall s", "engine busy s", "outside-engine fraction"], rows))
    write_results(
        "frontend_overhead",
        {
            "programs": args.programs,
            "model": args.model,
            "wall_s": walls,
            "engine_busy_s": busies,
            "outside_fraction": fractions,
        },
    )


if __name__ == "__main__":
    main()

"""The whole GPU check in one script, for a short lease of one CUDA device (issue 28).

    python -m benchmarks.gpu_check [--dry-run] [--out DIR] [--budget-s 420]
                                   [--only a,b] [--skip a,b] [--model NAME_OR_GGUF]

On CUDA, in this order (the most wanted first, so a short budget keeps them): the environment;
tensor parallel (NCCL needs 2 GPUs: said, not run); the device-to-device copy bandwidth, the
peak every share is taken of; every Triton kernel against its torch reference at real sizes,
timed (the mask kernel's and decode attention's share of that peak); the grammar mask against
xgrammar's own `apply_token_bitmask_inplace`; `pytest -m gpu` over tests/test_kernels_gpu.py and
tests/test_kernels_quant.py (TRITON_INTERPRET=0); the engine on `smollm2-135m` in bfloat16:
greedy tokens against transformers on the same GGUF, a JSON-schema program, decode tokens/s at
batch 1, 16 and 64, constrained against unconstrained throughput; the `make bench QUICK=1`
workloads (plait only); the CPU cases of tests/test_kernels_quant.py.

Without CUDA, or with `--dry-run`, the same sections run on the CPU at tiny sizes (plait-tiny,
the Triton kernels under TRITON_INTERPRET=1), so the script itself is exercised; the figures of a
dry run mean nothing. Each section runs in its own try/except; one that would not fit in what is
left of the budget is skipped, and a watchdog writes the summary and exits when the budget is
overrun by more than a minute. `gpu_check.json` and `gpu_check.md` are rewritten after every
section, under `--out`, else `$OUT`, else benchmarks/results/gpu_check (dry run:
benchmarks/results/smoke/gpu_check). Exit status 1 when a section failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from benchmarks.gpu_check_report import Report, render

if TYPE_CHECKING:
    from plait.backend.engine.engine import Engine

RESULTS = Path(__file__).resolve().parent / "results"
GRACE_S = 60.0
NOTES = (
    "Tensor parallel on NCCL needs 2 GPUs; a one-GPU lease cannot run it "
    "(tests/test_tensor_parallel.py covers TP on gloo on the CPU).",
    "CUDA graphs for decode are not implemented in plait: every decode step is launched eagerly.",
)


class Skip(Exception):
    """A section that cannot run here; the message says why."""


@dataclass(frozen=True)
class Section:
    """One part of the check: `cost_s` is about what it takes on the H200 (`dry_cost_s` on
    the CPU), checked against the budget before it starts."""

    name: str
    run: Callable[[Context], dict[str, Any]]
    cost_s: float
    dry_cost_s: float
    engine: bool = False


class Context:
    """What the sections share: the device, the clock, the output folder, the peak bandwidth
    and the engine (loaded on first use, closed after the last section that needs it)."""

    def __init__(
        self, *, dry_run: bool, out: Path, budget_s: float, model: str | None = None
    ) -> None:
        from benchmarks.gpu_check_engine import REAL, TINY

        self.dry_run, self.out = dry_run, out
        sizes = TINY if dry_run else REAL
        self.engine_sizes = sizes if model is None else dataclasses.replace(sizes, model=model)
        self.device = torch.device("cpu" if dry_run else "cuda")
        self.deadline = time.monotonic() + budget_s
        self.peak_gbps: float | None = None
        self.engine_info: dict[str, Any] = {}
        self._engine: Engine | None = None
        self._engine_error: str | None = None

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def engine(self) -> Engine:
        """The shared engine; a load that failed fails every section that needs it."""
        from benchmarks.gpu_check_engine import load_engine

        if self._engine_error is not None:
            raise RuntimeError(f"the engine did not load: {self._engine_error}")
        if self._engine is None:
            try:
                self._engine, self.engine_info = load_engine(self.engine_sizes)
            except Exception as exc:
                self._engine_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                raise
        return self._engine

    def close_engine(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None


def environment(ctx: Context) -> dict[str, Any]:
    from plait.kernels._dispatch import triton_interpreted

    packages = ("torch", "triton", "transformers", "xgrammar", "gguf")
    info: dict[str, Any] = {"python": platform.python_version()}
    info |= {name: version(name) for name in packages}
    info |= {"cuda_available": torch.cuda.is_available(), "device_count": torch.cuda.device_count(),
             "triton_interpreted": triton_interpreted()}  # fmt: skip
    if ctx.device.type == "cuda":
        props = torch.cuda.get_device_properties(ctx.device)
        info |= {"device": props.name, "capability": f"sm{props.major}{props.minor}",
                 "memory_gib": props.total_memory / 2**30, "cuda": torch.version.cuda}  # fmt: skip
    return info


def tensor_parallel(ctx: Context) -> dict[str, Any]:
    count = torch.cuda.device_count()
    reason = f"tensor parallel on NCCL needs 2 GPUs; this machine has {count}"
    if count >= 2:
        reason += " (not run by this script: see tests/test_tensor_parallel.py)"
    raise Skip(reason)


def copy_bandwidth(ctx: Context) -> dict[str, Any]:
    from benchmarks.gpu_check_kernels import REAL, TINY
    from benchmarks.gpu_check_kernels import copy_bandwidth as measure

    result = measure(ctx.device, TINY if ctx.dry_run else REAL)
    ctx.peak_gbps = result["gbps"]
    return result


def kernels(ctx: Context) -> dict[str, Any]:
    from benchmarks.gpu_check_kernels import REAL, TINY, kernel_checks
    from plait.kernels._dispatch import triton_interpreted

    if ctx.device.type == "cpu" and not triton_interpreted():
        raise Skip(
            "Triton on the CPU needs TRITON_INTERPRET=1 set before plait.kernels is imported"
        )
    if ctx.device.type == "cuda" and triton_interpreted():
        raise RuntimeError(
            "plait.kernels was imported under TRITON_INTERPRET=1: this would time the interpreter"
        )
    return kernel_checks(
        ctx.device, TINY if ctx.dry_run else REAL, ctx.peak_gbps, deadline=ctx.deadline
    )


def mask_vs_xgrammar(ctx: Context) -> dict[str, Any]:
    from benchmarks.gpu_check_kernels import REAL, TINY
    from benchmarks.gpu_check_kernels import mask_vs_xgrammar as measure

    return measure(ctx.device, TINY if ctx.dry_run else REAL)


def pytest_gpu(ctx: Context) -> dict[str, Any]:
    from benchmarks.gpu_check_engine import run_pytest

    files = ["tests/test_kernels_gpu.py", "tests/test_kernels_quant.py", "-m", "gpu"]
    return run_pytest(files, interpret=False, timeout=max(ctx.remaining(), 1.0))


def pytest_cpu(ctx: Context) -> dict[str, Any]:
    from benchmarks.gpu_check_engine import run_pytest

    files = ["tests/test_kernels_quant.py", "-m", "not gpu"]
    return run_pytest(files, interpret=True, timeout=max(ctx.remaining(), 1.0))


def engine_load(ctx: Context) -> dict[str, Any]:
    ctx.engine()
    return ctx.engine_info


def engine_section(name: str) -> Callable[[Context], dict[str, Any]]:
    """A section that runs `gpu_check_engine.<name>(engine, sizes)` on the shared engine."""

    def run(ctx: Context) -> dict[str, Any]:
        import benchmarks.gpu_check_engine as eng

        fn: Callable[..., dict[str, Any]] = getattr(eng, name)
        return fn(ctx.engine(), ctx.engine_sizes)

    return run


def workloads(ctx: Context) -> dict[str, Any]:
    from benchmarks.gpu_check_engine import workloads as run

    return run(ctx.out / "workloads", dry_run=ctx.dry_run, timeout=max(ctx.remaining(), 1.0))


SECTIONS = (
    Section("environment", environment, 5, 5),
    Section("tensor_parallel", tensor_parallel, 0, 0),
    Section("copy_bandwidth", copy_bandwidth, 5, 1),
    Section("kernels", kernels, 60, 10),
    Section("mask_vs_xgrammar", mask_vs_xgrammar, 10, 2),
    Section("pytest_gpu", pytest_gpu, 60, 15),
    Section("engine_load", engine_load, 40, 5, engine=True),
    Section(
        "greedy_vs_transformers", engine_section("greedy_vs_transformers"), 40, 15, engine=True
    ),
    Section("json_program", engine_section("json_program"), 15, 5, engine=True),
    Section("decode_throughput", engine_section("decode_throughput"), 40, 5, engine=True),
    Section("constrained_vs_plain", engine_section("constrained_vs_plain"), 40, 10, engine=True),
    Section("workloads", workloads, 60, 60),
    Section("pytest_cpu", pytest_cpu, 60, 60),
)


def run_section(ctx: Context, section: Section) -> dict[str, Any]:
    """One section's entry: ok / failed (its result says a check failed, or it raised) /
    skipped (with the reason: it cannot run here, or it would not fit in the budget)."""
    cost, left = (section.dry_cost_s if ctx.dry_run else section.cost_s), ctx.remaining()
    if left < cost:
        return {
            "status": "skipped",
            "reason": f"budget: {left:.0f} s left, needs about {cost:.0f} s",
        }
    started = time.perf_counter()
    try:
        result = section.run(ctx)
    except Skip as exc:
        return {"status": "skipped", "reason": str(exc), "seconds": time.perf_counter() - started}
    except Exception as exc:  # noqa: BLE001 - one section must not stop the others
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}".splitlines()[0],
                "traceback": traceback.format_exc().splitlines()[-12:],
                "seconds": time.perf_counter() - started}  # fmt: skip
    status = "failed" if result.get("ok") is False else "ok"
    return {"status": status, "seconds": time.perf_counter() - started, "result": result}


def run_all(ctx: Context, sections: list[Section], chosen: set[str], report: Report) -> None:
    """Every section in order (those not chosen recorded as such); the engine closed after the
    last chosen section that uses it, before the subprocess sections need the device."""
    last_engine = max(
        (i for i, s in enumerate(sections) if s.engine and s.name in chosen), default=-1
    )
    for i, section in enumerate(sections):
        if section.name not in chosen:
            report.record(section.name, {"status": "skipped", "reason": "not selected"})
            continue
        report.record(section.name, {"status": "running"})
        entry = run_section(ctx, section)
        report.record(section.name, entry)
        print(
            f"{section.name}: {entry['status']} {entry.get('reason') or entry.get('error') or ''}",
            flush=True,
        )
        if i == last_engine:
            ctx.close_engine()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    names = ",".join(s.name for s in SECTIONS)
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--dry-run", action="store_true", help="tiny sizes on the CPU (automatic without CUDA)"
    )
    ap.add_argument("--out", type=Path, default=None, help="output folder (default: $OUT)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="no section starts past this")
    ap.add_argument("--only", default="", help=f"comma-separated sections, of {names}")
    ap.add_argument("--skip", default="", help="comma-separated sections to leave out")
    ap.add_argument("--model", default=None, help="the engine's model: a name or a .gguf path")
    return ap.parse_args(argv)


def chosen_sections(only: str, skip: str) -> set[str]:
    names = [s.name for s in SECTIONS]
    wanted, dropped = ({n.strip() for n in arg.split(",") if n.strip()} for arg in (only, skip))
    unknown = (wanted | dropped) - set(names)
    if unknown:
        raise SystemExit(f"unknown sections {sorted(unknown)}; the sections are {names}")
    return (wanted or set(names)) - dropped


def prepare_triton(dry_run: bool) -> None:
    """Before plait.kernels is imported: the interpreter on the CPU, the real backend on CUDA
    (tests/conftest.py sets TRITON_INTERPRET=1 for the CPU, and on CUDA it must be off)."""
    if dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    else:
        os.environ["TRITON_INTERPRET"] = "0"


def output_dir(arg: Path | None, dry_run: bool) -> Path:
    if arg is not None:
        return arg
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"])
    return RESULTS / "smoke" / "gpu_check" if dry_run else RESULTS / "gpu_check"


def run_meta(ctx: Context, budget_s: float) -> dict[str, Any]:
    device = "cpu" if ctx.dry_run else torch.cuda.get_device_name()
    mode = "dry-run (CPU, tiny sizes)" if ctx.dry_run else "cuda"
    return {"mode": mode, "device": device, "model": ctx.engine_sizes.model,
            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "budget_s": budget_s,
            "notes": list(NOTES)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run the chosen sections, print the markdown summary; 1 when a section failed."""
    args = parse_args(argv)
    dry_run = args.dry_run or not torch.cuda.is_available()
    prepare_triton(dry_run)
    chosen = chosen_sections(args.only, args.skip)
    out = output_dir(args.out, dry_run)
    ctx = Context(dry_run=dry_run, out=out, budget_s=args.budget_s, model=args.model)
    report = Report(ctx.out, run_meta(ctx, args.budget_s))
    watchdog = threading.Timer(args.budget_s + GRACE_S, overrun, (report,))
    watchdog.daemon = True
    watchdog.start()
    try:
        run_all(ctx, list(SECTIONS), chosen, report)
    finally:
        watchdog.cancel()
        ctx.close_engine()
    print(render(report.data))
    print(f"wrote {ctx.out / 'gpu_check.json'} and {ctx.out / 'gpu_check.md'}")
    return 1 if report.failed() else 0


def overrun(report: Report) -> None:
    """The budget overrun by GRACE_S: what ran is written, the section running marked killed."""
    report.kill_running(f"killed: the budget was overrun by {GRACE_S:.0f} s")
    print(render(report.data), flush=True)
    os._exit(3)


if __name__ == "__main__":
    raise SystemExit(main())

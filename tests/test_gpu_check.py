"""`python -m benchmarks.gpu_check --dry-run`: its cheap sections on the CPU (the Triton kernels
under the interpreter, plait-tiny against transformers), the summary's structure, and the
runner's isolation of failures and its budget."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.append(str(Path(__file__).resolve().parents[1]))  # `benchmarks` lives at the root

from benchmarks import gpu_check  # noqa: E402
from benchmarks.gpu_check import SECTIONS, Context, Section, Skip, chosen_sections, run_all  # noqa: E402
from benchmarks.gpu_check_engine import TINY as ENGINE_TINY  # noqa: E402
from benchmarks.gpu_check_kernels import CHECKS  # noqa: E402
from benchmarks.gpu_check_report import Report  # noqa: E402

CHEAP = (
    "environment", "tensor_parallel", "copy_bandwidth", "kernels", "mask_vs_xgrammar",
    "engine_load", "greedy_vs_transformers", "decode_throughput",
)  # fmt: skip
KERNELS = {
    "apply_token_bitmask", "paged_decode_attention", "extend_attention", "rmsnorm", "rope",
    "store_kv", "top_k_top_p_sample", "quant_linear",
}  # fmt: skip


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("gpu_check")
    code = gpu_check.main(["--dry-run", "--out", str(out), "--only", ",".join(CHEAP)])
    assert code == 0
    return json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text()


def test_every_section_is_listed_in_order(summary: tuple[dict[str, Any], str]) -> None:
    data, md = summary
    assert list(data["sections"]) == [s.name for s in SECTIONS]
    assert data["mode"].startswith("dry-run") and data["failed"] == []
    assert data["model"] == ENGINE_TINY.model and f"- model: {ENGINE_TINY.model}" in md
    for name, entry in data["sections"].items():
        if name not in CHEAP:
            assert entry == {"status": "skipped", "reason": "not selected"}
        assert f"| {name} | {entry['status']} |" in md
    tp = data["sections"]["tensor_parallel"]
    assert tp["status"] == "skipped" and tp["reason"].startswith("tensor parallel on NCCL needs 2")
    assert any("needs 2 GPUs" in note for note in data["notes"])


def test_kernel_rows(summary: tuple[dict[str, Any], str]) -> None:
    data, md = summary
    assert data["sections"]["copy_bandwidth"]["result"]["gbps"] > 0
    result = data["sections"]["kernels"]["result"]
    assert result["errors"] == {} and result["left_out"] == [] and result["ok"] is True
    rows = result["rows"]
    assert {r["kernel"] for r in rows} == KERNELS and len(CHECKS) == 8
    for r in rows:
        assert r["ok"] is True and 0 <= r["max_err"] <= r["tol"], r
        assert r["triton_ms"] > 0 and r["torch_ms"] > 0 and r["gbytes"] > 0
        assert r["peak_share"] == pytest.approx(r["gbps"] / result["peak_gbps"])
    goal = {g["kernel"] for g in result["bandwidth_goal"]}
    assert goal == {"apply_token_bitmask", "paged_decode_attention"}
    assert "| quant_linear |" in md and "## kernels: ok" in md
    masks = data["sections"]["mask_vs_xgrammar"]["result"]["rows"]
    assert [(r["vocab"], r["batch"]) for r in masks] == [(500, 1), (500, 4)]
    assert all(r["equal"] for r in masks)


def test_engine_rows(summary: tuple[dict[str, Any], str]) -> None:
    sections = summary[0]["sections"]
    assert sections["engine_load"]["result"]["model"] == "plait-tiny"
    greedy = sections["greedy_vs_transformers"]["result"]
    assert len(greedy["rows"]) == ENGINE_TINY.greedy_prompts
    # float32 on the CPU: plait and transformers agree token for token
    assert greedy["identical"] is True and greedy["batched_equal_alone"] is True
    assert all(r["tokens"] == ENGINE_TINY.greedy_tokens for r in greedy["rows"])
    rows = sections["decode_throughput"]["result"]["rows"]
    assert [r["batch"] for r in rows] == list(ENGINE_TINY.batches)
    assert all(r["tok_s"] > 0 and r["decode_tok_s"] > 0 for r in rows)


def raises(ctx: Context) -> dict[str, Any]:
    raise ZeroDivisionError("boom")


def cannot_run(ctx: Context) -> dict[str, Any]:
    raise Skip("no such device")


def test_runner_isolates_failures_and_keeps_the_budget(tmp_path: Path) -> None:
    sections = [
        Section("raises", raises, 0, 0),
        Section("check_failed", lambda ctx: {"ok": False, "why": 1}, 0, 0),
        Section("cannot_run", cannot_run, 0, 0),
        Section("fine", lambda ctx: {"ok": True}, 0, 0),
        Section("too_long", lambda ctx: {"ok": True}, 1e6, 1e6),
        Section("left_out", lambda ctx: {"ok": True}, 0, 0),
    ]
    ctx = Context(dry_run=True, out=tmp_path, budget_s=100.0)
    report = Report(tmp_path, {"mode": "test", "device": "cpu", "started": "", "budget_s": 100})
    run_all(ctx, sections, {s.name for s in sections} - {"left_out"}, report)
    got = json.loads((tmp_path / "gpu_check.json").read_text())["sections"]
    assert (
        got["raises"]["status"] == "failed" and got["raises"]["error"] == "ZeroDivisionError: boom"
    )
    assert "ZeroDivisionError: boom" in got["raises"]["traceback"][-1]
    assert got["check_failed"]["status"] == "failed" and got["check_failed"]["result"]["why"] == 1
    assert got["cannot_run"]["status"] == "skipped"
    assert got["cannot_run"]["reason"] == "no such device"
    assert got["fine"]["status"] == "ok"
    assert got["too_long"]["status"] == "skipped" and got["too_long"]["reason"].startswith(
        "budget:"
    )
    assert got["left_out"] == {"status": "skipped", "reason": "not selected"}
    assert report.failed() == ["raises", "check_failed"]


def test_watchdog_marks_the_running_section_killed(tmp_path: Path) -> None:
    report = Report(tmp_path, {"mode": "test", "device": "cpu", "started": "", "budget_s": 1})
    report.record("done", {"status": "ok", "seconds": 1.0, "result": {}})
    report.record("slow", {"status": "running"})
    report.kill_running("killed: over budget")
    got = json.loads((tmp_path / "gpu_check.json").read_text())
    assert got["sections"]["slow"] == {"status": "killed", "reason": "killed: over budget"}
    assert (
        got["failed"] == ["slow"] and "| slow | killed |" in (tmp_path / "gpu_check.md").read_text()
    )
    with pytest.raises(ValueError, match="status must be one of"):
        report.record("odd", {"status": "maybe"})


def test_section_names_are_checked() -> None:
    assert chosen_sections("kernels, engine_load", "engine_load") == {"kernels"}
    with pytest.raises(SystemExit, match="unknown sections \\['nope'\\]"):
        chosen_sections("nope", "")

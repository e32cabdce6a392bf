"""The summary of `benchmarks.gpu_check`: built section by section, written as JSON and markdown
after each one (so a run cut short keeps what it measured)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

STATUSES = ("ok", "failed", "skipped", "running", "killed")


class Report:
    """The run's summary: `data` is what `gpu_check.json` holds; `gpu_check.md` renders it."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        self.out = out
        self.started = time.monotonic()
        self.data: dict[str, Any] = {**meta, "elapsed_s": 0.0, "sections": {}}
        self._lock = threading.Lock()

    def record(self, name: str, entry: dict[str, Any]) -> None:
        """Set a section's entry (`status` one of STATUSES) and rewrite both files."""
        if entry["status"] not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {entry['status']!r}")
        with self._lock:
            self.data["sections"][name] = entry
            self._write()

    def kill_running(self, reason: str) -> None:
        """The watchdog's last word: every running section marked killed, the files written."""
        with self._lock:
            for entry in self.data["sections"].values():
                if entry["status"] == "running":
                    entry.update(status="killed", reason=reason)
            self._write()

    def failed(self) -> list[str]:
        sections = self.data["sections"].items()
        return [name for name, e in sections if e["status"] in ("failed", "killed")]

    def _write(self) -> None:
        self.data["elapsed_s"] = time.monotonic() - self.started
        self.data["failed"] = self.failed()
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu_check.json").write_text(
            json.dumps(self.data, indent=2, default=str) + "\n"
        )
        (self.out / "gpu_check.md").write_text(render(self.data))


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, default=str, separators=(", ", ": "))
    return str(value)


def table(rows: list[dict[str, Any]]) -> list[str]:
    """A markdown table of dicts: the union of their keys, in first-seen order."""
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [fmt(row[k]).replace("|", "\\|") if k in row else "" for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def note(entry: dict[str, Any]) -> str:
    text = entry.get("reason") or entry.get("error") or ""
    return str(text).splitlines()[0][:160].replace("|", "\\|") if text else ""


def section_lines(name: str, entry: dict[str, Any]) -> list[str]:
    """A section's heading, then its scalars as a list, its row lists as tables and its lines
    of text (pytest's tail, a traceback) as code blocks."""
    lines = ["", f"## {name}: {entry['status']}", ""]
    body = {**entry.get("result", {}), **{k: v for k, v in entry.items() if k == "traceback"}}
    for key, value in body.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            lines += ["", f"{key}:", "", *table(value), ""]
        elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            lines += ["", f"{key}:", "", "```", *value, "```", ""]
        else:
            lines.append(f"- {key}: {fmt(value)}")
    return lines


def render(data: dict[str, Any]) -> str:
    """The markdown summary: the run, its notes, one row per section, then each section."""
    head = [f"# GPU check ({data['mode']})", ""]
    head += [
        f"- {k}: {fmt(data[k])}"
        for k in ("device", "model", "started", "budget_s", "elapsed_s")
        if k in data
    ]
    head += [f"- note: {n}" for n in data.get("notes", ())]
    head += ["", "| section | status | seconds | note |", "|---|---|---|---|"]
    sections = data["sections"]
    for name, entry in sections.items():
        head.append(
            f"| {name} | {entry['status']} | {entry.get('seconds', 0.0):.1f} | {note(entry)} |"
        )
    for name, entry in sections.items():
        if "result" in entry or "traceback" in entry:
            head += section_lines(name, entry)
    return "\n".join(head) + "\n"

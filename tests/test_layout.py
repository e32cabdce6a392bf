"""The package layout the docs promise: who may import the grammar package, and how."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
GRAMMAR_IMPORT = re.compile(r"^\s*(?:from|import)\s+plait\.backend\.grammar(\.\S+)?", re.M)


def production_modules() -> list[Path]:
    folders = ("frontend", "backend", "plait_kernels")
    return [p for folder in folders for p in (ROOT / folder).rglob("*.py")]


def test_only_the_scheduler_imports_the_grammar_package_and_only_its_public_names() -> None:
    importers = {}
    for path in production_modules():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("backend/grammar/"):
            continue
        for match in GRAMMAR_IMPORT.finditer(path.read_text()):
            importers[rel] = match.group(1)
    scheduler = {
        "backend/scheduler.py",
        "backend/step_results.py",
        "backend/scheduler_loop.py",
        "backend/spec_step.py",
    }
    assert set(importers) == scheduler
    assert set(importers.values()) == {None}  # `from plait.backend.grammar import ...`


def test_the_engine_is_importable_from_the_backend_package() -> None:
    from plait.backend import Engine
    from plait.backend.engine import Engine as Defined

    assert Engine is Defined

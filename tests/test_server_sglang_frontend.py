"""SGLang's own frontend (`sgl.RuntimeEndpoint`) runs an sgl program against `plait serve`.

sglang is no dependency of plait: the program runs in the current interpreter if it can
import sglang, else in the interpreter named by PLAIT_SGLANG_PYTHON (e.g. a throwaway venv
with `pip install --no-deps sglang` and the few packages its import needs); without either
the test is skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plait.runtime import Runtime

PROGRAM = Path(__file__).with_name("sglang_program.py")


def sglang_python() -> str | None:
    if importlib.util.find_spec("sglang") is not None:
        return sys.executable
    candidate = os.environ.get("PLAIT_SGLANG_PYTHON")
    return candidate if candidate and Path(candidate).exists() else None


@pytest.mark.skipif(sglang_python() is None, reason="sglang not importable")
def test_sglang_program_runs_unchanged(plait_server: Runtime, tmp_path: Path) -> None:
    python = sglang_python()
    assert python is not None
    run = subprocess.run(
        [python, str(PROGRAM), plait_server.url],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["verdict"] in ("yes", "no", "maybe")
    assert result["stream_equals_non_stream"]
    assert len(result["logprob_tokens"]) == 3

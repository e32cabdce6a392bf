"""Shared pytest setup: the Triton interpreter on CPU, one torch thread."""

from __future__ import annotations

import os

# Must be set before any Triton kernel is defined (i.e. before plait.kernels is imported).
os.environ.setdefault("TRITON_INTERPRET", "1")

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from plait.runtime import Runtime  # noqa: E402

torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `@pytest.mark.gpu` tests when CUDA is absent."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["xgrammar", "llguidance"])
def grammar_backend(request: pytest.FixtureRequest) -> str:
    """Each grammar backend in turn (tests of what both must do alike)."""
    return str(request.param)


@pytest.fixture(scope="session")
def smollm2_engine() -> Iterator[Any]:
    """The real model (SmolLM2-135M-Instruct, float32), loaded once for the real-model tier."""
    from plait.backend.engine.engine import Engine

    with Engine(
        "smollm2-135m", dtype="float32", kv_tokens=8192, check_integrity=True, num_threads=1
    ) as eng:
        yield eng


@pytest.fixture(scope="session")
def profile_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared server's --profile-dir."""
    return tmp_path_factory.mktemp("profiles").resolve()


@pytest.fixture(scope="session")
def plait_server(profile_dir: Path) -> Iterator[Runtime]:
    """One `plait serve` (plait-tiny, small KV pool) shared by the server test modules."""
    from server_helpers import server_args

    with Runtime(**server_args(profile_dir=profile_dir)) as runtime:
        yield runtime

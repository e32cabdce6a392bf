"""On-demand torch profiling of the scheduler's steps (SGLang's /start_profile, /stop_profile).

The profiler lives beside the scheduler loop, in whichever process owns the model. `start`
begins recording (CPU, plus CUDA when the device has it); `stop`, or the end of `num_steps`
steps, writes one Chrome trace (open it in chrome://tracing or Perfetto) and returns its path.

Traces are written only under the profile directory fixed when the engine starts
(`EngineConfig.profile_dir`, `plait serve --profile-dir`, else `$PLAIT_PROFILE_DIR`); without
one, profiling is refused. A request may name a subdirectory of it (`output_dir`, relative,
never leaving it). A trace that cannot be written ends the recording with an error; the
scheduler goes on.
"""

from __future__ import annotations

import os
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

PROFILE_DIR_ENV = "PLAIT_PROFILE_DIR"


@dataclass(frozen=True)
class ProfileRequest:
    """Where to write the trace (a subdirectory of the profile directory) and, optionally,
    how many scheduler steps to record."""

    output_dir: str | None = None
    num_steps: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ProfileRequest:
        data = dict(data or {})
        unknown = sorted(set(data) - {"output_dir", "num_steps"})
        if unknown:
            raise ValueError(f"profile: unknown field(s) {unknown}")
        steps = data.get("num_steps")
        if steps is not None and (
            not isinstance(steps, int) or isinstance(steps, bool) or steps < 1
        ):
            raise ValueError(f"num_steps must be a positive int, got {steps!r}")
        out = data.get("output_dir")
        if out is not None:
            check_subdirectory(out)
        return cls(output_dir=out, num_steps=steps)


def check_subdirectory(value: object) -> None:
    """Raise ValueError unless `value` is a relative path that stays where it starts."""
    if not isinstance(value, str):
        raise ValueError(f"output_dir must be a string, got {value!r}")
    path = PurePath(value)
    if path.is_absolute() or ".." in path.parts or "\0" in value:
        raise ValueError(
            f"output_dir must be a relative path inside the profile directory, got {value!r}"
        )


def profile_root(configured: str | None) -> Path | None:
    """The profile directory: the configured one, else $PLAIT_PROFILE_DIR, else None."""
    root = configured or os.environ.get(PROFILE_DIR_ENV)
    return Path(root).resolve() if root else None


class StepProfiler:
    """At most one recording at a time; `after_step` counts steps toward `num_steps`."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root
        self._prof: profile | None = None
        self._out = Path()
        self._request = ProfileRequest()
        self._steps = 0
        self.last_trace: str | None = None

    @property
    def active(self) -> bool:
        return self._prof is not None

    def start(self, request: ProfileRequest) -> str:
        if self._prof is not None:
            raise ValueError("a profile is already being recorded; stop it first")
        out = self._directory(request)
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=activities, with_stack=False)
        self._prof.start()
        self._request, self._steps, self._out = request, 0, out
        return "profiling started"

    def _directory(self, request: ProfileRequest) -> Path:
        """Where this recording's trace goes: checked to lie inside the root, created."""
        if self.root is None:
            raise ValueError(
                "profiling is off: start the server with --profile-dir DIR (or set "
                f"${PROFILE_DIR_ENV})"
            )
        if request.output_dir is not None:
            check_subdirectory(request.output_dir)
        out = (self.root / (request.output_dir or ".")).resolve()
        if out != self.root and self.root not in out.parents:
            raise ValueError(f"output_dir {request.output_dir!r} leaves the profile directory")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"cannot create the profile directory {out}: {exc}") from None
        return out

    def region(self, name: str) -> AbstractContextManager[Any]:
        """A named range in the trace while recording (nothing otherwise)."""
        return record_function(name) if self._prof is not None else nullcontext()

    def after_step(self) -> None:
        if self._prof is None or self._request.num_steps is None:
            return
        self._steps += 1
        if self._steps >= self._request.num_steps:
            self.stop()

    def stop(self) -> str:
        """End the recording and write its trace; returns the trace's path. A trace that
        cannot be written raises ValueError (the recording is over either way)."""
        if self._prof is None:
            raise ValueError("no profile is being recorded; start one first")
        prof, self._prof = self._prof, None
        path = self._out / f"plait-trace-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.json"
        try:
            prof.stop()
            prof.export_chrome_trace(str(path))
        except Exception as exc:  # noqa: BLE001 - a full disk must not stop the scheduler
            raise ValueError(f"writing the profile trace failed: {exc}") from None
        self.last_trace = str(path)
        return self.last_trace

"""On-demand torch profiling of the scheduler's steps (SGLang's /start_profile, /stop_profile).

The profiler lives beside the scheduler loop, in whichever process owns the model. `start`
begins recording (CPU, plus CUDA when the device has it); `stop`, or the end of `num_steps`
steps, writes one Chrome trace (open it in chrome://tracing or Perfetto) and returns its path.
"""

from __future__ import annotations

import os
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function


@dataclass(frozen=True)
class ProfileRequest:
    """Where to write the trace and, optionally, how many scheduler steps to record."""

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
        if out is not None and not isinstance(out, str):
            raise ValueError(f"output_dir must be a string, got {out!r}")
        return cls(output_dir=out, num_steps=steps)


class StepProfiler:
    """At most one recording at a time; `after_step` counts steps toward `num_steps`."""

    def __init__(self) -> None:
        self._prof: profile | None = None
        self._request = ProfileRequest()
        self._steps = 0
        self.last_trace: str | None = None

    @property
    def active(self) -> bool:
        return self._prof is not None

    def start(self, request: ProfileRequest) -> str:
        if self._prof is not None:
            raise ValueError("a profile is already being recorded; stop it first")
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=activities, with_stack=False)
        self._prof.start()
        self._request, self._steps = request, 0
        return "profiling started"

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
        """End the recording and write its trace; returns the trace's path."""
        if self._prof is None:
            raise ValueError("no profile is being recorded; start one first")
        prof, self._prof = self._prof, None
        prof.stop()
        out = Path(self._request.output_dir or os.environ.get("PLAIT_PROFILE_DIR", "/tmp"))
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"plait-trace-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.json"
        prof.export_chrome_trace(str(path))
        self.last_trace = str(path)
        return self.last_trace

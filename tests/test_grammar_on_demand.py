"""The grammar backend built at the first constrained request (`OnDemandGrammar`): nothing is
built or imported while the engine loads; requests submitted during the build wait and are
handed over once it ends; a failed build fails exactly the constrained requests."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import torch

from plait.backend.grammar import OnDemandGrammar
from plait.backend.grammar.hooks import GrammarHooks, MaskWaiter, Rewrite
from plait.backend.request.req import Req
from plait.backend.request.sampling_params import SamplingParams


class FakeBackend:
    """Records what it is given; every submitted request is ready at the next poll."""

    def __init__(self) -> None:
        self.submitted: list[str] = []
        self.released: list[str] = []
        self.warmed = False
        self.closed = False
        self._ready: list[Req] = []

    def submit(self, req: Req) -> None:
        self.submitted.append(req.rid)
        self._ready.append(req)

    def poll(self) -> tuple[list[Req], list[Req]]:
        ready, self._ready = self._ready, []
        return ready, []

    def begin_fill(self, reqs: Sequence[Req]) -> MaskWaiter:
        return lambda: None

    def accept(self, req: Req, token: int) -> None: ...

    def after_sample(self, req: Req) -> Rewrite | None:
        return None

    def draft_masks(self, req: Req, draft: Sequence[int]) -> tuple[int, torch.Tensor]:
        return 0, torch.zeros(1, 1, dtype=torch.int32)

    def release(self, req: Req) -> None:
        self.released.append(req.rid)

    def warm_up(self) -> None:
        self.warmed = True

    def close(self) -> None:
        self.closed = True


def request(rid: str) -> Req:
    params = SamplingParams.from_dict({"max_new_tokens": 8, "regex": "[ab]+"})
    return Req(rid=rid, input_ids=[5, 6, 7], params=params, eos_ids=[0])


def poll_until(hooks: GrammarHooks, n: int) -> tuple[list[Req], list[Req]]:
    ready: list[Req] = []
    failed: list[Req] = []
    deadline = time.monotonic() + 30
    while len(ready) + len(failed) < n and time.monotonic() < deadline:
        r, f = hooks.poll()
        ready, failed = ready + r, failed + f
        time.sleep(0.002)
    return ready, failed


def test_built_at_the_first_request_and_requests_held_until_then() -> None:
    gate, builds = threading.Event(), []
    fake = FakeBackend()

    def build() -> GrammarHooks:
        builds.append(1)
        gate.wait(10)
        return fake

    hooks = OnDemandGrammar(build=build)
    assert hooks.poll() == ([], []) and builds == []  # nothing built before it is needed
    first, second, dropped = request("a"), request("b"), request("c")
    for req in (first, second, dropped):
        hooks.submit(req)
    hooks.release(dropped)  # forgotten while held: never reaches the backend
    time.sleep(0.05)
    assert hooks.poll() == ([], []) and fake.submitted == []
    gate.set()
    ready, failed = poll_until(hooks, 2)
    assert [r.rid for r in ready] == ["a", "b"] and failed == []
    assert fake.submitted == ["a", "b"] and builds == [1]
    hooks.submit(request("d"))  # built: straight through
    assert fake.submitted == ["a", "b", "d"]
    hooks.release(first)
    assert fake.released == ["a"]
    hooks.close()
    assert fake.closed and not fake.warmed


def test_warm_up_builds_without_a_request_and_warms_the_backend() -> None:
    fake = FakeBackend()
    hooks = OnDemandGrammar(build=lambda: fake)
    hooks.warm_up()
    hooks.close()  # waits for the build
    assert fake.warmed and fake.closed


def test_a_failed_build_fails_the_constrained_requests_with_its_message() -> None:
    def build() -> GrammarHooks:
        raise ValueError("no vocabulary")

    hooks = OnDemandGrammar(build=build)
    reqs = [request("a"), request("b")]
    for req in reqs:
        hooks.submit(req)
    ready, failed = poll_until(hooks, 2)
    assert ready == [] and [r.rid for r in failed] == ["a", "b"]
    for req in failed:
        assert req.finished is not None and req.finished.kind == "error"
        assert "no vocabulary" in (req.finished.message or "")
    later = request("c")
    hooks.submit(later)
    assert poll_until(hooks, 1) == ([], [later])
    hooks.close()


def test_an_engine_loads_without_importing_the_grammar_backends() -> None:
    code = (
        "import sys\n"
        "from plait.backend import Engine\n"
        "e = Engine('plait-tiny', num_threads=1, kv_tokens=256)\n"
        "out = e.generate(input_ids=[1, 2, 3], sampling_params={'max_new_tokens': 2,"
        " 'ignore_eos': True})\n"
        "assert len(out['output_ids']) == 2, out\n"
        "print(sorted(m for m in ('xgrammar', 'llguidance') if m in sys.modules))\n"
        "out = e.generate(input_ids=[1, 2, 3], sampling_params={'max_new_tokens': 4,"
        " 'regex': 'ab'})\n"
        "print(out['text'], 'xgrammar' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[:2] == ["[]", "ab True"], run.stdout

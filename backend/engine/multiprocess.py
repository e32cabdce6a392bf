"""The runtime of `plait serve`: scheduler and detokenizer in their own processes.

`MultiProcessRuntime` has the interface of `InProcessRuntime` (`send`, `close`, `tokenizer`,
`info`, `failure`): the Engine and its TokenizerManager cannot tell them apart. Requests go
out on a ZMQ PUSH socket; a receiver thread takes the detokenizer's BatchStrOut and
ControlReply messages off a PULL socket and hands them to `deliver`. The same thread watches
the children: when one dies it sets `failure` and calls `on_failure` within a second.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Protocol

import torch
import zmq

from plait.backend.config import EngineConfig
from plait.backend.engine.processes import (
    ROLES,
    ChildSpec,
    IpcAddresses,
    child_command,
    pull_socket,
    push_socket,
    recv_all,
    run_child,
)
from plait.backend.model.builtin import resolve_model_path
from plait.backend.request.messages import ModelInfo, ProcessFailed, ProcessReady, encode
from plait.backend.text.tokenizer import load_tokenizer

START_METHODS = ("auto", "fork", "exec")
STARTUP_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 10.0
FAILURE_REPORT_WAIT_S = 2.0

log = logging.getLogger("plait.multiprocess")


class RuntimeStartError(RuntimeError):
    """A child process failed to start (the message carries its error)."""


class Child(Protocol):
    """What the runtime needs of a child process (a subset of `subprocess.Popen`)."""

    pid: int

    def poll(self) -> int | None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class ForkedChild:
    """A `multiprocessing` fork-context process behind the `Child` interface."""

    def __init__(self, proc: BaseProcess) -> None:
        self.proc = proc
        self.pid = proc.pid or 0

    def poll(self) -> int | None:
        return self.proc.exitcode

    def terminate(self) -> None:
        self.proc.terminate()

    def kill(self) -> None:
        self.proc.kill()

    def wait(self, timeout: float | None = None) -> int:
        self.proc.join(timeout)
        if self.proc.exitcode is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return self.proc.exitcode


class MultiProcessRuntime:
    """Scheduler and detokenizer processes behind ZMQ sockets in a private temp dir (0700).

    `start_method`: "fork" starts the children in milliseconds with every module already
    imported, but is only safe while this process has a single thread and no CUDA state;
    "exec" starts fresh interpreters (seconds); "auto" forks on Linux for a CPU model when
    single-threaded, else execs.
    """

    def __init__(
        self,
        *,
        config: EngineConfig,
        deliver: Callable[[object], None],
        on_failure: Callable[[str], None] | None = None,
        start_method: str = "auto",
    ) -> None:
        if start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {START_METHODS}")
        self._deliver = deliver
        self._on_failure = on_failure
        self.failure: str | None = None
        self._closed = False
        self._closing = threading.Event()
        self._send_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.processes: dict[str, Child] = {}
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        spec = ChildSpec(config=config, model_path=str(resolve_model_path(config.model)))
        self._dir = tempfile.mkdtemp(prefix="plait-ipc-")  # private: mode 0700
        os.chmod(self._dir, 0o700)
        self.addrs = IpcAddresses.in_dir(self._dir)
        try:
            self._start(spec, _pick_method(start_method, config))
        except BaseException:
            self.close()
            raise
        self._thread = threading.Thread(target=self._receive, name="plait-receiver", daemon=True)
        self._thread.start()

    # --- lifecycle --------------------------------------------------------------------
    def _start(self, spec: ChildSpec, method: str) -> None:
        """Children first (a fork must not inherit a ZMQ context), then our sockets, the
        tokenizer, and the children's ready reports."""
        self._start_children(spec, method)
        self._ctx = zmq.Context()
        self._inbox = pull_socket(self._ctx, self.addrs.main)
        self._outbox = push_socket(self._ctx, self.addrs.scheduler)
        self.tokenizer = load_tokenizer(spec.model_path)
        self.info = self._await_ready()

    def _start_children(self, spec: ChildSpec, method: str) -> None:
        if method == "exec":
            spec.write(self._dir)
        for name in ROLES:
            self.processes[name] = self._fork(name, spec) if method == "fork" else self._exec(name)

    def _fork(self, name: str, spec: ChildSpec) -> Child:
        ctx = multiprocessing.get_context("fork")
        kwargs = {"addrs": self.addrs, "parent_pid": os.getpid()}
        proc = ctx.Process(
            target=run_child, args=(name, spec), kwargs=kwargs, name=f"plait-{name}", daemon=True
        )
        proc.start()
        return ForkedChild(proc)

    def _exec(self, name: str) -> Child:
        return subprocess.Popen(child_command(name, self._dir), stdin=subprocess.DEVNULL)

    def _await_ready(self) -> ModelInfo:
        """Wait for both children's ProcessReady; raise if one fails or dies first."""
        ready: dict[str, ProcessReady] = {}
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while len(ready) < len(ROLES):
            for msg in recv_all(self._inbox, True):
                if isinstance(msg, ProcessFailed):
                    raise RuntimeStartError(f"the {msg.name} process failed:\n{msg.error}")
                if isinstance(msg, ProcessReady):
                    ready[msg.name] = msg
            dead = self._dead_child()
            if dead is not None and len(ready) < len(ROLES):
                raise RuntimeStartError(self._startup_error(f"{dead} while starting"))
            if time.monotonic() > deadline:
                raise RuntimeStartError(f"children not ready after {STARTUP_TIMEOUT_S:.0f}s")
        info = ready["scheduler"].info
        assert info is not None
        return info

    def _startup_error(self, fallback: str) -> str:
        """The ProcessFailed report still in transit from a child that just died, if any."""
        deadline = time.monotonic() + FAILURE_REPORT_WAIT_S
        while time.monotonic() < deadline:
            for msg in recv_all(self._inbox, True):
                if isinstance(msg, ProcessFailed):
                    return f"the {msg.name} process failed:\n{msg.error}"
        return fallback

    def close(self) -> None:
        """Stop the receiver, then the children (SIGTERM, then SIGKILL), then the sockets."""
        with self._send_lock:
            if self._closed:
                return
            self._closed = True
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.processes.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
        shutil.rmtree(self._dir, ignore_errors=True)

    # --- messages ---------------------------------------------------------------------
    def send(self, msg: object) -> None:
        """Ship one message to the scheduler (any thread)."""
        data = encode(msg)
        with self._send_lock:
            if not self._closed:
                self._outbox.send(data)

    def _receive(self) -> None:
        """Deliver what the detokenizer sends; notice a dead child within one poll."""
        while not self._closing.is_set():
            for msg in recv_all(self._inbox, True):
                try:
                    self._deliver(msg)
                except Exception:  # noqa: BLE001 - one bad delivery must not stop the rest
                    log.exception("delivering %s failed", type(msg).__name__)
            dead = self._dead_child()
            if dead is not None and not self._closing.is_set():
                self._fail(dead)
                return

    def _dead_child(self) -> str | None:
        for name, proc in self.processes.items():
            code = proc.poll()
            if code is not None:
                return f"the {name} process died (exit code {code})"
        return None

    def _fail(self, message: str) -> None:
        log.error("%s", message)
        self.failure = message
        if self._on_failure is not None:
            self._on_failure(message)


def _pick_method(requested: str, config: EngineConfig) -> str:
    """Fork only on Linux, from a single thread, and for a CPU model (a forked child cannot
    use CUDA once the parent has touched it)."""
    if requested != "auto":
        return requested
    single = threading.active_count() == 1
    on_cpu = config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available())
    return "fork" if sys.platform.startswith("linux") and single and on_cpu else "exec"

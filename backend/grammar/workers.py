"""Grammar building in worker processes that can be stopped.

Turning a constraint into a grammar has no cost bound: xgrammar's schema converter and
llguidance's grammar construction are native code that no thread can interrupt, and schema
rewriting and a regex's DFA are Python that holds the GIL (a DFA of `a{10000}` takes most of
a minute). So `build_grammar` runs in child processes
(fresh interpreters running `worker_main`), each driven by one thread of the engine's process:

- a job waits in one queue with a deadline (`grammar_timeout_s` from its submission, or from
  when its worker became ready if that was later: queueing behind other jobs counts, a
  worker's start does not), so a queued job times out like a running one;
- a thread hands the job to its worker and waits for the result until the deadline; past it,
  the worker is killed (SIGKILL), the job fails, and a new worker starts;
- the worker sends the grammar back serialized (refused past `max_bytes`; llguidance's is
  validated there, so a grammar it refuses fails within the deadline), and the thread
  compiles it against the vocabulary (`compile_built`: milliseconds, GIL released).

The scheduler never waits on any of this: it polls the jobs' futures. A worker exits when its
pipe closes, so none outlives the engine.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from plait.backend.grammar.compiler import (
    CompiledConstraint,
    Compilers,
    build_grammar,
    compile_built,
)
from plait.backend.grammar.errors import GrammarError, clean_error
from plait.backend.grammar.keys import BuiltGrammar, GrammarKey
from plait.backend.grammar.vocab import Vocab
from plait.backend.host import set_process_name

MAX_GRAMMAR_BYTES = 16 << 20  # a serialized grammar (before compilation) larger than this fails
KILL_WAIT_S = 5.0
STARTUP_TIMEOUT_S = 300.0
# A worker dies with the engine's process even when that is SIGKILLed: before its (slow)
# imports it asks Linux for SIGKILL when its parent goes (PR_SET_PDEATHSIG), then checks that
# the parent did not go already.
WORKER_CODE = "; ".join([
    "import ctypes, os, sys",
    "sys.platform.startswith('linux') and ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)",
    "os.getppid() == int(sys.argv[3]) or os._exit(0)",
    "from plait.backend.grammar.workers import worker_main",
    "worker_main()",
])  # fmt: skip

log = logging.getLogger("plait.grammar")


@dataclass
class CompileJob:
    """One key to compile within `timeout_s` of `submitted` (time.monotonic); its future gets
    the result or a GrammarError."""

    key: GrammarKey
    submitted: float
    timeout_s: float
    future: Future[CompiledConstraint] = field(default_factory=Future)

    def deadline(self, worker: Worker) -> float:
        """Its deadline on `worker`: the part of the worker's start this job waited through
        does not count; queueing behind other jobs does."""
        startup = max(0.0, worker.ready_at - max(self.submitted, worker.spawned_at))
        return self.submitted + self.timeout_s + startup


class WorkerPool:
    """`size` compile workers behind one job queue; started at the first `submit` (or
    `start`). A worker killed past a deadline is replaced at once."""

    def __init__(self, *, vocab: Vocab, size: int, max_bytes: int) -> None:
        self.vocab = vocab
        self.size = max(size, 1)
        self.max_bytes = max_bytes
        self._jobs: queue.Queue[CompileJob | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._workers: set[Worker] = set()
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        with self._lock:
            if self._threads or self._closed:
                return
            for i in range(self.size):
                thread = threading.Thread(
                    target=self._serve, name=f"plait-grammar-{i}", daemon=True
                )
                self._threads.append(thread)
                thread.start()

    def submit(self, key: GrammarKey, *, timeout_s: float) -> CompileJob:
        self.start()
        job = CompileJob(key, time.monotonic(), timeout_s)
        self._jobs.put(job)
        return job

    def close(self) -> None:
        """Stop the threads and kill the workers (jobs still queued fail)."""
        with self._lock:
            self._closed = True
            workers = list(self._workers)
        for _ in self._threads:
            self._jobs.put(None)
        for worker in workers:
            worker.kill()

    def pids(self) -> list[int]:
        with self._lock:
            return [w.proc.pid for w in self._workers]

    def ready(self) -> int:
        """How many workers are up and waiting for jobs or compiling."""
        with self._lock:
            return sum(w.is_ready for w in self._workers)

    # --- one thread per worker ----------------------------------------------------------
    def _serve(self) -> None:
        compilers = Compilers(self.vocab)
        worker: Worker | None = None
        while not self._closed:
            if worker is None:
                worker = self._spawn()
            job = self._jobs.get()
            if job is None or self._closed:
                if job is not None:
                    job.future.set_exception(GrammarError("the engine is shutting down"))
                break
            if worker is None:
                job.future.set_exception(GrammarError("the grammar compiler could not start"))
            elif time.monotonic() >= job.deadline(worker):
                job.future.set_exception(timed_out(job))
            else:
                worker = self._run(worker, job, compilers)
        if worker is not None:
            self._retire(worker)

    def _run(self, worker: Worker, job: CompileJob, compilers: Compilers) -> Worker | None:
        """Build `job`'s grammar on `worker` and compile it here; returns the worker to use
        next, None if it had to be killed (past the deadline) or died."""
        try:
            start = time.perf_counter()
            built = worker.build(job)
            job.future.set_result(compile_built(compilers, job.key, built, since=start))
            return worker
        except Exception as exc:  # noqa: BLE001 - timeout, dead worker, bad result
            error = exc if isinstance(exc, GrammarError) else GrammarError(f"grammar: {exc}")
            job.future.set_exception(error)
            if isinstance(exc, WorkerLost):
                log.warning("%s; starting a new grammar worker", exc)
                self._retire(worker)
                return None
            return worker

    def _spawn(self) -> Worker | None:
        """A new worker, once it is ready; None if it cannot start (logged)."""
        try:
            worker = Worker.spawn(max_bytes=self.max_bytes)
        except OSError:
            log.exception("starting a grammar worker failed")
            return None
        with self._lock:
            self._workers.add(worker)
            if self._closed:
                worker.kill()
        if worker.wait_ready(STARTUP_TIMEOUT_S):
            return worker
        if not self._closed:
            log.error("a grammar worker did not start (exit code %s)", worker.proc.poll())
        self._retire(worker)
        return None

    def _retire(self, worker: Worker) -> None:
        worker.kill()
        with self._lock:
            self._workers.discard(worker)


def timed_out(job: CompileJob) -> GrammarError:
    return GrammarError(f"{job.key.kind}: grammar compilation timed out after {job.timeout_s:g}s")


class WorkerLost(GrammarError):
    """The worker had to be killed (past the deadline) or died; the job fails with this."""


class Worker:
    """One compile process and its two pipes (jobs in, results out)."""

    _ids = itertools.count()

    def __init__(self, proc: subprocess.Popen[bytes], jobs: Connection, results: Connection):
        self.proc = proc
        self.jobs = jobs
        self.results = results
        self.is_ready = False
        self.spawned_at = time.monotonic()
        self.killed = False
        self._kill_lock = threading.Lock()
        self.ready_at = float("inf")

    def wait_ready(self, timeout: float) -> bool:
        """Wait for the worker's "ready" (it has imported plait and xgrammar)."""
        try:
            self.is_ready = self.results.poll(timeout) and self.results.recv() == ("ready",)
        except (EOFError, OSError):
            self.is_ready = False
        self.ready_at = time.monotonic()
        return self.is_ready

    @classmethod
    def spawn(cls, *, max_bytes: int) -> Worker:
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        argv = [sys.executable, "-c", WORKER_CODE, str(to_child), str(from_child), str(os.getpid())]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, pass_fds=(to_child, from_child))
        os.close(to_child)
        os.close(from_child)
        jobs = Connection(from_parent, readable=False)
        worker = cls(proc, jobs, Connection(to_parent, writable=False))
        try:
            jobs.send(max_bytes)
        except OSError:
            worker.kill()
            raise
        return worker

    def build(self, job: CompileJob) -> BuiltGrammar:
        """Send `job`, wait for its grammar until the deadline (WorkerLost past it)."""
        job_id = next(self._ids)
        deadline = job.deadline(self)
        try:
            self.jobs.send((job_id, job.key))
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not self.results.poll(left):
                    raise WorkerLost(str(timed_out(job)))
                reply = self.results.recv()
                if reply[0] == job_id:
                    return _built(reply[1])
        except (EOFError, OSError) as exc:
            raise WorkerLost(f"{job.key.kind}: the grammar compiler process died ({exc})") from None

    def kill(self) -> None:
        """Kill the process and close its pipes, once (the pool's close and the worker's own
        thread may both ask: a second close of a pipe could close a reused descriptor)."""
        with self._kill_lock:
            if self.killed:
                return
            self.killed = True
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                log.warning("grammar worker %d did not exit", self.proc.pid)
        for conn in (self.jobs, self.results):
            conn.close()


def _built(result: tuple[Any, ...]) -> BuiltGrammar:
    """The worker's answer as a BuiltGrammar, or its error raised."""
    if result[0] == "error":
        raise GrammarError(result[1])
    _, backend, data, fsm, warnings = result
    return BuiltGrammar(backend, data, fsm, tuple(warnings))


# --- the worker process -----------------------------------------------------------------------
def worker_main() -> None:
    """Entry point of a compile worker: `-c ... JOBS_FD RESULTS_FD`. Builds grammars until
    its jobs pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_process_name("plait-grammar")
    jobs = Connection(int(sys.argv[1]), writable=False)
    results = Connection(int(sys.argv[2]), readable=False)
    try:
        max_bytes = jobs.recv()
        results.send(("ready",))
        while True:
            job_id, key = jobs.recv()
            results.send((job_id, built_result(key, max_bytes=max_bytes)))
    except (EOFError, OSError):  # the engine is gone or done with this worker
        return


def built_result(key: GrammarKey, *, max_bytes: int) -> tuple[Any, ...]:
    """("ok", backend, serialized grammar, regex DFA, warnings) or ("error", message)."""
    try:
        built = build_grammar(key)
    except GrammarError as exc:
        return ("error", str(exc))
    except Exception as exc:  # noqa: BLE001 - any failure is this constraint's
        return ("error", f"invalid {key.kind}: {clean_error(exc)}")
    if len(built.data) > max_bytes:
        size, limit = len(built.data) >> 20, max_bytes >> 20
        return ("error", f"{key.kind}: the grammar is too large ({size} MiB; at most {limit} MiB)")
    return ("ok", built.backend, built.data, built.regex_fsm, built.warnings)

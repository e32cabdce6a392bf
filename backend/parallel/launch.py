"""Starting, watching and stopping the ranks of `--tp N`.

Rank 0 lives in the process that runs the scheduler (the scheduler process of `plait serve`,
or the Engine's own process); it starts the other ranks of its machine as processes
(`python -m plait.backend.parallel.follower`, the config in the environment), each dying with
it (PR_SET_PDEATHSIG), and all join torch.distributed's TCP rendezvous. On the other machines
`plait serve --node-rank K` starts that machine's ranks (`run_node`) and waits on them. A
watcher thread on rank 0 notices a local rank that exits; a remote one breaks the next
collective. Either is fatal: `TensorParallel.fail` tells the runtime (by default the process
exits 1 after killing its ranks).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import torch

from plait.backend.config import EngineConfig
from plait.backend.devices import pick_device
from plait.backend.host import die_with_parent
from plait.backend.parallel.comm import TPComm

log = logging.getLogger("plait.parallel")
WATCH_S = 0.2
EXIT_WAIT_S = 1.0  # how long a failed collective waits to learn whether a rank exited
ENV_CONFIG, ENV_RANK, ENV_INIT = "PLAIT_TP_CONFIG", "PLAIT_TP_RANK", "PLAIT_TP_INIT"


def node_ranks(config: EngineConfig) -> range:
    """The ranks that run on this machine (`tp // nnodes` of them)."""
    per = config.tp // config.nnodes
    return range(config.node_rank * per, (config.node_rank + 1) * per)


def rank_device(config: EngineConfig, rank: int) -> torch.device:
    """Rank `rank`'s device: its own GPU on CUDA (by its index on the machine), else the CPU."""
    device = pick_device(config.device)
    if device.type == "cuda":
        return torch.device("cuda", rank % (config.tp // config.nnodes))
    return device


def _init_addr(config: EngineConfig) -> str:
    if config.dist_init_addr:
        return config.dist_init_addr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def spawn_rank(config: EngineConfig, rank: int, init_addr: str) -> subprocess.Popen[bytes]:
    """Start rank `rank` as a process of this one (killed when this one dies)."""
    env = dict(os.environ)
    env[ENV_CONFIG] = json.dumps(dataclasses.asdict(config))
    env[ENV_RANK], env[ENV_INIT] = str(rank), init_addr
    return subprocess.Popen(
        [sys.executable, "-m", "plait.backend.parallel.follower"],
        env=env, stdin=subprocess.DEVNULL,
        preexec_fn=die_with_parent(signal.SIGKILL),
    )  # fmt: skip


class TensorParallel:
    """One rank's part in `--tp`: the group handle, and on rank 0 the ranks it started and
    their watcher. `on_failure(message)` runs once when a rank is lost."""

    def __init__(self, *, comm: TPComm, procs: list[subprocess.Popen[bytes]]) -> None:
        self.comm, self.procs = comm, procs
        self.failure: str | None = None
        self.on_failure: Callable[[str], None] = lambda message: None  # the runtime's to set
        self._lock = threading.Lock()
        self._closing = threading.Event()
        if procs:
            threading.Thread(target=self._watch, name="plait-tp-watch", daemon=True).start()

    @classmethod
    def start(cls, config: EngineConfig) -> TensorParallel:
        """Rank 0: start this machine's other ranks, then join the group with them."""
        init_addr = _init_addr(config)
        procs = [spawn_rank(config, r, init_addr) for r in node_ranks(config) if r != 0]
        try:
            comm = _join_watching(
                procs,
                lambda: TPComm.init(
                    rank=0, world=config.tp, init_method=f"tcp://{init_addr}",
                    device=rank_device(config, 0),
                ),
            )  # fmt: skip
        except BaseException:
            kill_all(procs)
            raise
        return cls(comm=comm, procs=procs)

    @property
    def rank(self) -> int:
        return self.comm.rank

    def fail(self, message: str) -> None:
        """A rank is lost: record why (a rank's exit, when one exited: a collective with a
        dead peer usually fails before the watcher sees the exit) and call `on_failure`
        (once)."""
        if self.failure is not None or self._closing.is_set():
            return
        message = self._exit_cause(wait_s=EXIT_WAIT_S) or message
        with self._lock:
            if self.failure is not None or self._closing.is_set():
                return
            self.failure = message
        log.error("tensor parallelism: %s", message)
        self.on_failure(message)

    def _exit_cause(self, *, wait_s: float) -> str | None:
        """Which rank process exited, waiting up to `wait_s` for one to be reaped."""
        deadline = time.monotonic() + wait_s
        while True:
            for proc in self.procs:
                code = proc.poll()
                if code is not None:
                    return f"tensor-parallel rank process {proc.pid} exited (code {code})"
            if time.monotonic() >= deadline:
                return None
            time.sleep(WATCH_S / 4)

    def _watch(self) -> None:
        while not self._closing.wait(WATCH_S):
            for proc in self.procs:
                code = proc.poll()
                if code is not None and not self._closing.is_set():
                    self.fail(f"tensor-parallel rank process {proc.pid} exited (code {code})")
                    return

    def abort(self) -> None:
        """Setup failed: kill the ranks started here and leave the group (no stop message:
        the ranks may be out of step)."""
        self._closing.set()
        try:
            kill_all(self.procs)
        finally:
            self.comm.close()

    def close(self, stop: Callable[[], None]) -> None:
        """Stop the followers (`stop` broadcasts the stop), wait for them, leave the group."""
        if self.failure is None:
            try:
                stop()
            except Exception:  # noqa: BLE001 - the ranks are killed below anyway
                log.warning("telling the ranks to stop failed", exc_info=True)
        self._closing.set()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        kill_all(self.procs)
        self.comm.close()


def _join_watching(procs: list[subprocess.Popen[bytes]], join: Callable[[], TPComm]) -> TPComm:
    """`join()` (the rendezvous, which waits for every rank) on a thread, given up with a
    RuntimeError when one of `procs` exits first (the thread is left behind)."""
    box: list[TPComm | BaseException] = []
    thread = threading.Thread(target=lambda: box.append(_capture(join)), daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(WATCH_S)
        dead = [p for p in procs if p.poll() is not None]
        if dead and thread.is_alive():
            raise RuntimeError(f"tensor-parallel rank process {dead[0].pid} exited while starting")
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _capture(fn: Callable[[], TPComm]) -> TPComm | BaseException:
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001 - re-raised by the waiting thread
        return exc


def kill_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


def exit_on_failure(message: str) -> None:
    """The default reaction to a lost rank in a server's scheduler process: exit 1 (the
    main process fails the requests in flight and exits; the ranks die with this process)."""
    log.error("exiting: %s", message)
    logging.shutdown()
    os._exit(1)


def run_node(config: EngineConfig) -> int:
    """`plait serve --node-rank K` (K > 0): start this machine's ranks and wait for them;
    the exit code is 1 if any failed."""
    if not config.dist_init_addr:
        raise ValueError("--dist-init-addr is needed on every node")
    procs = [spawn_rank(config, r, config.dist_init_addr) for r in node_ranks(config)]
    codes = [proc.wait() for proc in procs]
    kill_all(procs)
    return 1 if any(codes) else 0

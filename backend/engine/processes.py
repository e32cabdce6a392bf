"""The server's child processes: the scheduler (owns the model and the device) and the
detokenizer. Each is either forked from a still single-threaded parent (`run_child`: fast,
every module already imported) or a fresh interpreter running `main()` with the arguments
`ROLE DIR PARENT_PID` (never re-running the user's main module, unlike multiprocessing's
spawn). DIR is the private temporary directory (mode 0700) holding the ipc sockets and the
pickled `ChildSpec`.

    main  --PUSH ipc://.../scheduler-->    scheduler  --PUSH ipc://.../detokenizer-->
    detokenizer  --PUSH ipc://.../main-->  main

Every socket pair is ZMQ PUSH/PULL over ipc:// in a private temporary directory; messages
are the frozen dataclasses of `messages.py` through its codec. A child ignores SIGINT (the
main process shuts it down), stops on SIGTERM, and stops by itself once its parent is gone,
so no child outlives the server.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import torch
import zmq

from plait.backend.config import EngineConfig
from plait.backend.host import keep_freed_memory, set_process_name
from plait.backend.parallel.launch import exit_on_failure
from plait.backend.request.messages import (
    BatchStrOut,
    BatchTokenOut,
    ProcessFailed,
    ProcessReady,
    decode,
    encode,
)
from plait.backend.scheduler.loop import build_scheduler, describe, run_loop
from plait.backend.text.detokenizer import Detokenizer
from plait.backend.text.tokenizer import load_tokenizer, make_decoder

SPEC_FILE = "spec.pickle"
POLL_MS = 200
FAILURE_LINGER_MS = 2000

log = logging.getLogger("plait.processes")


@dataclass(frozen=True)
class IpcAddresses:
    """Where each process's PULL socket is bound (one ipc:// endpoint per receiver)."""

    scheduler: str
    detokenizer: str
    main: str

    @property
    def directory(self) -> Path:
        return Path(self.main.removeprefix("ipc://")).parent

    @classmethod
    def in_dir(cls, directory: str | Path) -> IpcAddresses:
        d = Path(directory)
        return cls(
            scheduler=f"ipc://{d / 'scheduler'}",
            detokenizer=f"ipc://{d / 'detokenizer'}",
            main=f"ipc://{d / 'main'}",
        )


@dataclass(frozen=True)
class ChildSpec:
    """What both children need to start: the engine config and the resolved model path."""

    config: EngineConfig
    model_path: str

    def write(self, directory: str | Path) -> None:
        Path(directory, SPEC_FILE).write_bytes(pickle.dumps(self))

    @classmethod
    def read(cls, directory: str | Path) -> ChildSpec:
        spec = pickle.loads(Path(directory, SPEC_FILE).read_bytes())  # noqa: S301 - our own file
        assert isinstance(spec, cls)
        return spec


# --- sockets ----------------------------------------------------------------------------
def pull_socket(ctx: zmq.Context[zmq.Socket[bytes]], addr: str) -> zmq.Socket[bytes]:
    """A bound PULL socket with no receive limit."""
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.bind(addr)
    return sock


def push_socket(ctx: zmq.Context[zmq.Socket[bytes]], addr: str) -> zmq.Socket[bytes]:
    """A connected PUSH socket that never blocks on a slow receiver."""
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.connect(addr)
    return sock


def recv_all(sock: zmq.Socket[bytes], block: bool) -> list[object]:
    """Every message waiting on `sock`; with `block`, wait up to POLL_MS for the first."""
    msgs: list[object] = []
    if block and not sock.poll(POLL_MS):
        return msgs
    while True:
        try:
            data = sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return msgs
        try:
            msgs.append(decode(data))
        except Exception:  # noqa: BLE001 - a message that cannot be read is dropped, logged
            log.exception("dropping a message that cannot be decoded (%d bytes)", len(data))


# --- child process plumbing ---------------------------------------------------------------
def _child_setup(name: str, parent_pid: int) -> Callable[[], bool]:
    """Signals, process name and logging of a child; returns its `should_stop`."""
    stop = threading.Event()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    set_process_name(f"plait-{name}")
    logging.basicConfig(level=logging.INFO, format=f"[plait {name}] %(levelname)s %(message)s")
    return lambda: stop.is_set() or os.getppid() != parent_pid


def _fail(ctx: zmq.Context[zmq.Socket[bytes]], sock: zmq.Socket[bytes], *, name: str) -> NoReturn:
    """Report a startup failure downstream, then exit non-zero."""
    log.error("startup failed:\n%s", traceback.format_exc())
    sock.send(encode(ProcessFailed(name, traceback.format_exc(limit=8))))
    ctx.destroy(linger=FAILURE_LINGER_MS)
    sys.exit(1)


def _exit_cleanly(
    ctx: zmq.Context[zmq.Socket[bytes]], addrs: IpcAddresses, *, parent_pid: int
) -> None:
    """Close the sockets; an orphan (the parent was killed) also removes the socket dir."""
    ctx.destroy(linger=0)
    if os.getppid() != parent_pid:
        shutil.rmtree(addrs.directory, ignore_errors=True)


# --- the scheduler process ----------------------------------------------------------------
def scheduler_process(spec: ChildSpec, *, addrs: IpcAddresses, parent_pid: int) -> None:
    """Load the model, then serve requests until told to stop."""
    config = spec.config
    should_stop = _child_setup("scheduler", parent_pid)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    inbox = pull_socket(ctx, addrs.scheduler)
    outbox = push_socket(ctx, addrs.detokenizer)
    try:
        torch.set_num_threads(config.num_threads)
        scheduler, _ = build_scheduler(config)
    except Exception:  # noqa: BLE001 - reported to the main process, which exits
        _fail(ctx, outbox, name="scheduler")
    if scheduler.runner.device.type == "cpu":  # this process is plait's: its malloc too
        kept = keep_freed_memory()
        log.info("host memory: freed activations %s", "kept for reuse" if kept else "returned")
    parallel = scheduler.runner.parallel
    if parallel is not None:  # a lost tensor-parallel rank ends this process (exit 1)
        parallel.on_failure = exit_on_failure
        if parallel.failure is not None:
            exit_on_failure(parallel.failure)
    if scheduler.grammar is not None:
        scheduler.grammar.warm_up()  # compile workers start while the server does
    outbox.send(encode(ProcessReady("scheduler", describe(scheduler))))
    run_loop(
        scheduler,
        recv=lambda block: recv_all(inbox, block),
        send=lambda msg: outbox.send(encode(msg)),
        should_stop=should_stop,
    )
    _exit_cleanly(ctx, addrs, parent_pid=parent_pid)


# --- the detokenizer process --------------------------------------------------------------
def detokenizer_process(spec: ChildSpec, *, addrs: IpcAddresses, parent_pid: int) -> None:
    """Turn the scheduler's token outputs into text; pass everything else on unchanged."""
    should_stop = _child_setup("detokenizer", parent_pid)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    inbox = pull_socket(ctx, addrs.detokenizer)
    outbox = push_socket(ctx, addrs.main)
    try:
        detokenizer = Detokenizer(decode=make_decoder(load_tokenizer(spec.model_path)))
    except Exception:  # noqa: BLE001 - reported to the main process, which exits
        _fail(ctx, outbox, name="detokenizer")
    outbox.send(encode(ProcessReady("detokenizer")))
    while not should_stop():
        for msg in recv_all(inbox, True):
            outbox.send(encode(_detokenize(detokenizer, msg)))
    _exit_cleanly(ctx, addrs, parent_pid=parent_pid)


def _detokenize(detokenizer: Detokenizer, msg: object) -> object:
    if not isinstance(msg, BatchTokenOut):
        return msg
    return BatchStrOut(detokenizer.process(msg.outputs))


ROLES = ("scheduler", "detokenizer")


def child_command(role: str, directory: str) -> list[str]:
    """The command line that starts the `role` child of this process."""
    code = "import sys; from plait.backend.engine.processes import main; main(sys.argv[1:])"
    return [sys.executable, "-c", code, role, directory, str(os.getpid())]


def run_child(role: str, spec: ChildSpec, *, addrs: IpcAddresses, parent_pid: int) -> None:
    """Body of a child, forked or exec'd."""
    if role not in ROLES:
        raise ValueError(f"unknown child role {role!r}; known: {ROLES}")
    entry = scheduler_process if role == "scheduler" else detokenizer_process
    entry(spec, addrs=addrs, parent_pid=parent_pid)


def main(argv: list[str]) -> None:
    """Entry point of an exec'd child: `ROLE DIR PARENT_PID`."""
    role, directory, parent_pid = argv
    addrs = IpcAddresses.in_dir(directory)
    run_child(role, ChildSpec.read(directory), addrs=addrs, parent_pid=int(parent_pid))

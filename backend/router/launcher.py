"""`plait serve --dp N`: N `plait serve` workers on this machine and the router in front.

    launcher process (this one): the router (uvicorn) on --host/--port
        ├── worker 0: plait serve on 127.0.0.1:<free port>, its own process group
        │     └── scheduler, detokenizer
        ├── worker 1: ...
        └── with --router sglang, SGLang's Model Gateway on --host/--port instead of the
            router (gateway.py), its own process group, started once the workers answer

Workers start together, each on its own GPU when there are N (CUDA_VISIBLE_DEVICES), else
sharing the device (each sizes its KV pool from 1/N of `--mem-fraction`); on the CPU each
gets 1/N of `--num-threads` (at least one). The router starts
once every worker answers /health. A worker that exits is taken out of rotation (its process
group killed, so nothing of it is left) and the others go on serving; when none is left the
launcher exits 1 (as when the gateway exits; a dead worker is left to the gateway's health
checks). SIGTERM or Ctrl-C: the workers are told to stop first (SIGTERM: their requests in
flight end with "the server is shutting down", passed through the router), then the router
stops, then anything left of a worker is killed; exit 0. The workers and the gateway die
with the launcher even if it is killed (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import httpx
import uvicorn

from plait.backend.config import EngineConfig
from plait.backend.host import die_with_parent
from plait.backend.router.config import RouterConfig
from plait.backend.router.gateway import METRICS_PORT as GATEWAY_METRICS_PORT
from plait.backend.router.gateway import GatewayProcess, require_gateway
from plait.backend.router.server import Terminated, make_server, raise_terminated
from plait.backend.router.workers import WorkerPool
from plait.backend.server.args import ServerArgs, settings_flags

START_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 15.0
POLL_S = 0.2
ROUTERS = ("plait", "sglang")  # plait's router, or SGLang's Model Gateway (gateway.py)

log = logging.getLogger("plait.router")


class WorkerProcesses:
    """The `plait serve` processes of `--dp`: start, wait healthy, watch, stop."""

    def __init__(self, args: ServerArgs, dp: int) -> None:
        self.args, self.dp = args, dp
        self.ports = [_free_port() for _ in range(dp)]
        self.urls = [f"http://127.0.0.1:{port}" for port in self.ports]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.exited: set[int] = set()
        self.told_to_stop: set[int] = set()  # pids
        self.key_dir: str | None = None

    def start(self) -> None:
        devices = _device_plan(self.args.engine, self.dp)
        engine = self.args.engine
        sized = engine.kv_tokens is not None or engine.kv_memory_mib is not None
        if devices is None and not sized:  # the workers share one device's memory
            share = engine.memory_fraction("cuda" if _uses_cuda(engine) else "cpu") / self.dp
            engine = dataclasses.replace(engine, mem_fraction=share)
        if not _uses_cuda(engine):  # --num-threads is the machine's total: the workers share it
            engine = dataclasses.replace(engine, num_threads=max(1, engine.num_threads // self.dp))
        for i, port in enumerate(self.ports):
            env = dict(os.environ)
            if devices is not None:
                env["CUDA_VISIBLE_DEVICES"] = devices[i]
            command = worker_command(self.args, engine, port) + self._key_flags()
            proc = subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGTERM),
            )  # fmt: skip
            self.procs.append(proc)
            log.info("worker %d: pid %d, %s", i, proc.pid, self.urls[i])

    def _key_flags(self) -> list[str]:
        """`--api-key-file`/`--admin-api-key-file` for the workers: the launcher's keys,
        written once to files only this user can read."""
        keys = {"--api-key-file": self.args.keys.api, "--admin-api-key-file": self.args.keys.admin}
        if not any(keys.values()):
            return []
        if self.key_dir is None:
            self.key_dir = tempfile.mkdtemp(prefix="plait-dp-keys-")
        flags = []
        for flag, values in keys.items():
            if values:
                path = os.path.join(self.key_dir, flag.strip("-"))
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as out:
                    out.write("".join(key + "\n" for key in values))
                flags += [flag, path]
        return flags

    def wait_healthy(self, timeout: float = START_TIMEOUT_S) -> None:
        """Until every worker answers /health 200; RuntimeError if one exits first."""
        deadline, waiting = time.monotonic() + timeout, set(range(self.dp))
        with httpx.Client(timeout=2.0) as client:
            while waiting:
                for i in sorted(waiting):
                    code = self.procs[i].poll()
                    if code is not None:
                        raise RuntimeError(f"worker {i} exited with code {code} while starting")
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(self.urls[i] + "/health").status_code == 200:
                            waiting.discard(i)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"workers {sorted(waiting)} not healthy after {timeout}s")
                time.sleep(POLL_S)

    def reap(self) -> list[str]:
        """The URLs of the workers whose process exited since the last call (what is left
        of each one's process group is killed)."""
        gone = []
        for i, proc in enumerate(self.procs):
            if i not in self.exited and proc.poll() is not None:
                self.exited.add(i)
                log.error("worker %d (pid %d) exited with code %s", i, proc.pid, proc.poll())
                _kill_group(proc.pid)
                gone.append(self.urls[i])
        return gone

    def all_exited(self) -> bool:
        return len(self.exited) == self.dp

    async def watch(self, pool: WorkerPool, on_all_exited: Callable[[], None]) -> None:
        """Take a worker whose process exited out of the router's rotation."""
        while not self.all_exited():
            for url in self.reap():
                pool.mark_dead(url)
            await asyncio.sleep(POLL_S)
        log.error("every worker exited: shutting down")
        on_all_exited()

    def terminate(self) -> None:
        """Ask every running worker to stop (SIGTERM to its main process, once: a second one
        would cut its shutdown short)."""
        for proc in self.procs:
            if proc.poll() is None and proc.pid not in self.told_to_stop:
                self.told_to_stop.add(proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM, wait up to STOP_TIMEOUT_S, then SIGKILL whatever is left of each group."""
        self.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            _kill_group(proc.pid)
            proc.wait()
        if self.key_dir is not None:
            shutil.rmtree(self.key_dir, ignore_errors=True)


class DataParallelServer(uvicorn.Server):
    """The router's uvicorn server; on shutdown it stops the workers first, so that their
    requests in flight end (with the workers' shutdown error) instead of being cut."""

    def __init__(self, config: uvicorn.Config, *, workers: WorkerProcesses) -> None:
        super().__init__(config)
        self.workers = workers

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.workers.terminate()
        await super().shutdown(sockets)


def serve_dp(
    args: ServerArgs, dp: int, *, router: str = "plait",
    gateway_metrics_port: int = GATEWAY_METRICS_PORT, **policy: Any,
) -> int:  # fmt: skip
    """Run N workers and the router (`router`: one of ROUTERS) until SIGTERM/Ctrl-C (0), or
    until every worker or the gateway exits (1)."""
    logging.basicConfig(level=args.log_level.upper(), format="[plait] %(levelname)s %(message)s")
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    workers, status = WorkerProcesses(args, dp), 0
    gateway: GatewayProcess | None = None
    try:  # bad flags fail before anything starts
        config = RouterConfig(
            workers=tuple(workers.urls), host=args.host, port=args.port,
            api_keys=args.keys.api + args.keys.admin, log_level=args.log_level, **policy,
        )  # fmt: skip
        if router not in ROUTERS:
            raise ValueError(f"--router must be one of {ROUTERS}, not {router!r}")
        if router == "sglang":
            require_gateway()
        workers.start()
        workers.wait_healthy()
        if router == "plait":
            status = _run_router(config, workers)
        else:
            gateway = GatewayProcess(config, metrics_port=gateway_metrics_port)
            status = _run_gateway(gateway, workers)
    except (KeyboardInterrupt, Terminated):
        log.info("shutting down")
    except (RuntimeError, TimeoutError, OSError, ValueError) as exc:
        log.error("plait serve --dp failed: %s", exc)
        status = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if gateway is not None:  # the workers first, as in DataParallelServer.shutdown
            workers.terminate()
            gateway.stop()
        workers.stop()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return status


def _run_router(config: RouterConfig, workers: WorkerProcesses) -> int:
    outcome = {"status": 0}
    server: DataParallelServer | None = None

    def all_exited() -> None:
        outcome["status"] = 1
        if server is not None:
            server.should_exit = True

    async def watch(pool: WorkerPool) -> None:
        await workers.watch(pool, all_exited)

    plain = make_server(config, background=[watch])
    server = DataParallelServer(plain.config, workers=workers)
    server.run()
    return outcome["status"]


def _run_gateway(gateway: GatewayProcess, workers: WorkerProcesses) -> int:
    """Until the gateway or every worker exits (1); a dead worker is left to the gateway's
    health checks (its process group is killed here)."""
    gateway.wait_ready()
    log.info("SGLang's Model Gateway on %s -> %s", gateway.url, ", ".join(workers.urls))
    while gateway.running():
        workers.reap()
        if workers.all_exited():
            log.error("every worker exited: shutting down")
            return 1
        time.sleep(POLL_S)
    log.error("the gateway exited with code %s", gateway.proc.poll())
    return 1


def worker_command(args: ServerArgs, engine: EngineConfig, port: int) -> list[str]:
    """`plait serve` for one worker: the HTTP and engine flags that differ from the defaults
    (keys go through files, `key_flags`, never the command line)."""
    flags = ["--host", "127.0.0.1", "--port", str(port), "--log-level", args.log_level]
    flags += settings_flags(args.settings)
    for f in dataclasses.fields(EngineConfig):
        value = getattr(engine, f.name)
        if value == f.default or value is None:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, str(value)]
    return [sys.executable, "-m", "plait.cli", "serve", *flags]


def _uses_cuda(engine: EngineConfig) -> bool:
    if engine.device.startswith("cpu"):
        return False
    import torch

    return bool(torch.cuda.is_available())


def _device_plan(engine: EngineConfig, dp: int) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES per worker when there is a GPU for each (else None)."""
    if engine.device not in ("auto", "cuda") or not _uses_cuda(engine):
        return None
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    return ids[:dp] if len(ids) >= dp else None


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])

"""`plait.Runtime`: a `plait serve` subprocess owned by this program.

    with Runtime(model="plait-tiny", kv_tokens=16384) as rt:
        httpx.post(rt.url + "/generate", json={"text": "Hi"})

Starts the server on a free port, waits until /health answers 200, and stops it (SIGTERM,
then SIGKILL) on `close()`, on leaving the `with` block, or when the interpreter exits.
Keyword arguments become `plait serve` flags (`kv_tokens=16384` -> `--kv-tokens 16384`,
`disable_radix_cache=True` -> `--disable-radix-cache`).
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import time
from typing import Any

import httpx

START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 15.0
POLL_S = 0.1


class Runtime:
    """A plait server running as a child process of this program, reachable at `url`."""

    def __init__(
        self,
        model: str = "plait-tiny",
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        api_key: str | None = None,
        timeout: float = START_TIMEOUT_S,
        log_level: str = "warning",
        **server_args: Any,
    ) -> None:
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.api_key = api_key
        flags = {"host": host, "port": self.port, "log_level": log_level}
        self.command = serve_command(model, **flags, **server_args)
        env = dict(os.environ)
        if api_key is not None:  # the environment, not the command line (visible in ps)
            env["PLAIT_API_KEY"] = api_key
        self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, env=env)
        atexit.register(self.close)
        try:
            self._wait_healthy(timeout)
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self.process.pid

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                code = self.process.poll()
                if code is not None:
                    raise RuntimeError(f"plait serve exited with code {code} while starting")
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(POLL_S)
        raise TimeoutError(f"plait serve not healthy after {timeout:.0f}s")

    def close(self) -> None:
        """Stop the server and its child processes (idempotent)."""
        atexit.unregister(self.close)
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Runtime(url={self.url!r}, pid={self.pid})"


def serve_command(model: str, **flags: Any) -> list[str]:
    """The `plait serve` command line (this interpreter) for `model` and `flags`."""
    return [sys.executable, "-m", "plait.cli", "serve", *to_flags({"model": model, **flags})]


def to_flags(args: dict[str, Any]) -> list[str]:
    """{"kv_tokens": 16384, "check_integrity": True} -> ["--kv-tokens", "16384",
    "--check-integrity"]; False gives "--no-<flag>", None leaves the flag out."""
    flags: list[str] = []
    for name, value in args.items():
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    return flags


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])

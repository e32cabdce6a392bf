"""SGLang's Model Gateway (PyPI `sglang-router`, a Rust binary inside the wheel) as the router
of `plait serve --dp N --router sglang`: its command line, derived from the same
`RouterConfig` as plait's router, and its process (started once the workers answer, ready
when it has registered every one of them, stopped after them).

    python -m plait.backend.router.gateway FLAGS    # the gateway with FLAGS, key from the env

How the gateway handles a dead worker (sglang-router 0.3.2; docs/scale.md has the runs): a
request that cannot be sent is a 500 for that attempt, retried after a backoff on the worker
the policy picks, which stays the dead one until a health check or the circuit breaker takes
it out. The breaker counts every answer that is not 2xx, a client's 400 included: ten bad
requests in a row take a healthy worker out for a minute. So the failover flags here turn
the breaker off and space the retries to outlast the health checks that take a dead worker
out (`failover_flags`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
import signal
import subprocess
import sys
import time

import httpx

from plait.backend.host import die_with_parent
from plait.backend.router.config import RouterConfig

METRICS_PORT = 29000  # the gateway's own default for its Prometheus exporter
KEY_ENV = "PLAIT_GATEWAY_API_KEY"
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0
SHUTDOWN_GRACE_S = 3  # the gateway's wait for requests in flight once told to stop
POLL_S = 0.2
RETRY_FIRST_S, RETRY_MAX_S, RETRY_JITTER = 0.1, 1.0, 0.2  # backoff doubles from the first
LOG_LEVELS = {"debug": "debug", "info": "info", "warning": "warn", "error": "error"}

log = logging.getLogger("plait.router")


def require_gateway() -> None:
    """RuntimeError unless the `sglang_router` package can be imported."""
    if importlib.util.find_spec("sglang_router") is None:
        raise RuntimeError(
            "--router sglang needs SGLang's Model Gateway: pip install sglang-router"
        )


def retry_attempts(span_s: float) -> int:
    """The fewest attempts whose backoffs (0.1, 0.2, 0.4, 0.8 s, then 1 s each, less the
    jitter) add up to `span_s`."""
    waited, delay, attempts = 0.0, 0.0, 1
    while waited * (1 - RETRY_JITTER) < span_s:
        delay = min(RETRY_MAX_S, delay * 2 or RETRY_FIRST_S)
        waited, attempts = waited + delay, attempts + 1
    return attempts


def failover_flags(config: RouterConfig) -> list[str]:
    """The gateway's health, retry and circuit-breaker flags: health checks as plait's
    router makes them (whole seconds), no breaker, and retries that outlast the checks that
    take a dead worker out by an interval and a second (checks run late on a busy machine: a
    request once waited 3.4 s for two checks 1 s apart), so a request sent to a dead worker
    is retried until it goes to another."""
    interval = max(1, math.ceil(config.health_interval_s))
    timeout = max(1, math.ceil(config.health_timeout_s))
    span = (config.health_failures + 1) * interval + 1
    return [
        "--health-check-interval-secs", str(interval), "--health-check-timeout-secs", str(timeout),
        "--health-failure-threshold", str(config.health_failures),
        "--health-success-threshold", "1", "--disable-circuit-breaker",
        "--retry-max-retries", str(retry_attempts(span)),
        "--retry-initial-backoff-ms", str(int(RETRY_FIRST_S * 1000)),
        "--retry-max-backoff-ms", str(int(RETRY_MAX_S * 1000)),
        "--retry-backoff-multiplier", "2", "--retry-jitter-factor", str(RETRY_JITTER),
    ]  # fmt: skip


def gateway_flags(config: RouterConfig, *, metrics_port: int = METRICS_PORT) -> list[str]:
    """The gateway's flags for `config` (its API key goes through the environment)."""
    return [
        "--host", config.host, "--port", str(config.port), "--worker-urls", *config.workers,
        "--policy", config.policy, "--cache-threshold", str(config.cache_threshold),
        "--balance-abs-threshold", str(config.balance_abs_threshold),
        "--balance-rel-threshold", str(config.balance_rel_threshold),
        "--max-tree-size", str(config.max_tree_chars),
        "--prometheus-host", config.host, "--prometheus-port", str(metrics_port),
        "--log-level", LOG_LEVELS[config.log_level],
        "--shutdown-grace-period-secs", str(SHUTDOWN_GRACE_S),
        *failover_flags(config),
    ]  # fmt: skip


class GatewayProcess:
    """The gateway as a child process: start, wait until ready, stop."""

    def __init__(self, config: RouterConfig, *, metrics_port: int = METRICS_PORT) -> None:
        self.config = config
        self.url = f"http://{_reachable(config.host)}:{config.port}"
        env = dict(os.environ)
        if config.api_keys:  # the gateway checks one key, and calls the workers with it
            env[KEY_ENV] = config.api_keys[0]
        command = [sys.executable, "-m", "plait.backend.router.gateway"]
        self.proc = subprocess.Popen(
            command + gateway_flags(config, metrics_port=metrics_port), env=env,
            stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGTERM),
        )  # fmt: skip
        log.info("SGLang's Model Gateway: pid %d, %s", self.proc.pid, self.url)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until /workers lists every worker healthy; RuntimeError if the gateway exits.
        (Not /readiness: the gateway logs each of its 503s as an error.)"""
        deadline, headers = time.monotonic() + timeout, self._auth()
        with httpx.Client(timeout=2.0, headers=headers) as client:
            while not self._ready(client):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the gateway exited with code {self.proc.poll()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the gateway was not ready after {timeout}s")
                time.sleep(POLL_S)

    def _ready(self, client: httpx.Client) -> bool:
        try:
            listed = client.get(self.url + "/workers").json()["workers"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return False
        healthy = {w.get("url") for w in listed if w.get("is_healthy")}
        return healthy == set(self.config.workers)

    def _auth(self) -> dict[str, str]:
        keys = self.config.api_keys
        return {"Authorization": f"Bearer {keys[0]}"} if keys else {}

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM, wait up to STOP_TIMEOUT_S, then SIGKILL its process group."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def _reachable(host: str) -> str:
    """Where this machine reaches a server bound to `host`."""
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def main(argv: list[str]) -> None:
    """Run the gateway with `argv`, plus `--api-key` from `$PLAIT_GATEWAY_API_KEY` (so the
    key is never on a command line that `ps` shows)."""
    from sglang_router.launch_router import launch_router, parse_router_args

    key = os.environ.pop(KEY_ENV, None)
    launch_router(parse_router_args(argv + (["--api-key", key] if key else [])))


if __name__ == "__main__":
    main(sys.argv[1:])

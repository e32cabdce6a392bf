"""`plait router`: flags, and running the router until SIGTERM or Ctrl-C.

    plait router --worker http://10.0.0.1:30000 --worker http://10.0.0.2:30000 --port 8000

The policy flags (`--router-policy`, `--cache-threshold`, ...) are shared with
`plait serve --dp N`, which starts its workers and this router in front of them.
"""

from __future__ import annotations

import argparse
import logging
import signal
import types
from collections.abc import Sequence
from typing import Any

import uvicorn

from plait.backend.router.app import Background, create_router_app
from plait.backend.router.config import POLICIES, RouterConfig, normalize_url
from plait.backend.server.auth import add_key_arguments, keys_from_namespace

GRACEFUL_SHUTDOWN_S = 3
POLICY_FIELDS = (
    "policy", "cache_threshold", "balance_abs_threshold", "balance_rel_threshold",
    "max_tree_chars", "health_interval_s", "max_attempts",
)  # fmt: skip

log = logging.getLogger("plait.router")


class Terminated(Exception):
    """SIGTERM arrived (raised from the signal handler in the main thread)."""


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """The routing flags of `plait router` and `plait serve --dp`."""
    group = parser.add_argument_group("router (data parallelism)")
    defaults = RouterConfig(workers=("http://x",))
    group.add_argument(
        "--router-policy", dest="policy", choices=POLICIES, default=defaults.policy,
        help="cache_aware: longest cached prefix unless the load is imbalanced (default)",
    )  # fmt: skip
    numbers: tuple[tuple[str, type, str], ...] = (
        ("cache_threshold", float, "least fraction of the text a worker's tree must match"),
        ("balance_abs_threshold", int, "in-flight difference that counts as imbalance"),
        ("balance_rel_threshold", float, "in-flight ratio that counts as imbalance"),
        ("max_tree_chars", int, "characters kept per worker's prefix tree"),
        ("health_interval_s", float, "seconds between health checks"),
        ("max_attempts", int, "workers tried for a request that did not start"),
    )
    for name, kind, text in numbers:
        flag = "--" + name.removesuffix("_s").replace("_", "-")
        default = getattr(defaults, name)
        group.add_argument(flag, dest=name, type=kind, default=default, help=f"{text} ({default})")


def add_router_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `plait router`."""
    parser.add_argument(
        "--worker", dest="workers", action="extend", nargs="+", required=True, metavar="URL",
        help="a worker's URL (http://host:port); repeat or list several",
    )  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=30000)
    add_key_arguments(parser, admin=False)  # the router also calls the workers with them
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    add_policy_arguments(parser)


def policy_options(ns: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(ns, name) for name in POLICY_FIELDS}


def config_from_namespace(ns: argparse.Namespace) -> RouterConfig:
    return RouterConfig(
        workers=tuple(normalize_url(u) for u in ns.workers),
        host=ns.host,
        port=ns.port,
        api_keys=keys_from_namespace(ns).api,
        log_level=ns.log_level,
        **policy_options(ns),
    )


def run_router(config: RouterConfig, *, background: Sequence[Background] = ()) -> int:
    """Serve until SIGTERM or Ctrl-C (exit code 0)."""
    logging.basicConfig(level=config.log_level.upper(), format="[plait] %(levelname)s %(message)s")
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        make_server(config, background=background).run()
    except (KeyboardInterrupt, Terminated):
        log.info("router shutting down")
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def make_server(config: RouterConfig, *, background: Sequence[Background] = ()) -> uvicorn.Server:
    app = create_router_app(config, background=background)
    uv = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    log.info(
        "router (%s) on http://%s:%d -> %s",
        config.policy, config.host, config.port, ", ".join(config.workers),
    )  # fmt: skip
    return uvicorn.Server(uv)


def raise_terminated(signum: int, frame: types.FrameType | None) -> None:
    raise Terminated()

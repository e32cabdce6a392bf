"""The `plait` command line: `plait serve --model plait-tiny --port 30000 ...`,
`plait serve --dp 2 ...` (two workers behind a router: plait's, or SGLang's Model Gateway
with `--router sglang`), `plait serve --tp 2 ...` (tensor parallelism; `--node-rank K` on
the other machines), `plait router --worker URL ...`."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from plait.backend.router.gateway import METRICS_PORT
from plait.backend.router.launcher import ROUTERS, serve_dp
from plait.backend.router.server import (
    add_policy_arguments,
    add_router_arguments,
    config_from_namespace,
    policy_options,
    run_router,
)
from plait.backend.server.args import add_serve_arguments, args_from_namespace


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="plait", description="plait: structured generation")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the HTTP server (OpenAI-compatible and SGLang-native APIs)",
        description="Start the plait server: main process (HTTP), scheduler and detokenizer.",
    )
    add_serve_arguments(serve)
    serve.add_argument(
        "--dp", type=int, default=1, metavar="N",
        help="data parallelism: N workers on this machine behind a router (default 1)",
    )  # fmt: skip
    serve.add_argument(
        "--router", choices=ROUTERS, default="plait",
        help="the router of --dp: plait's (default) or sglang, SGLang's Model Gateway "
        "(pip install sglang-router)",
    )  # fmt: skip
    serve.add_argument(
        "--gateway-metrics-port", type=int, default=METRICS_PORT, metavar="PORT",
        help=f"--router sglang: the gateway's Prometheus port on --host (default {METRICS_PORT})",
    )  # fmt: skip
    add_policy_arguments(serve)
    router = commands.add_parser(
        "router",
        help="route requests to plait serve workers (data parallelism across machines)",
        description="A cache-aware router in front of running plait serve workers.",
    )
    add_router_arguments(router)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `plait` console script; returns the exit code."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command == "serve" and ns.dp < 1:
        parser.error("--dp must be >= 1")
    if ns.command == "serve" and ns.router != "plait" and ns.dp < 2:
        parser.error(f"--router {ns.router} routes between --dp workers: give --dp N > 1")
    if ns.command == "serve" and ns.dp > 1:
        gateway = {"router": ns.router, "gateway_metrics_port": ns.gateway_metrics_port}
        exit_now(serve_dp(args_from_namespace(ns), ns.dp, **gateway, **policy_options(ns)))
    if ns.command == "serve" and ns.node_rank > 0:  # another machine's tensor-parallel ranks
        from plait.backend.parallel.launch import run_node  # lazy: loads torch

        exit_now(run_node(args_from_namespace(ns).engine))
    if ns.command == "serve":
        from plait.backend.server.launch import serve  # lazy: loads the runtime

        exit_now(serve(args_from_namespace(ns)))
    if ns.command == "router":
        try:
            config = config_from_namespace(ns)
        except ValueError as exc:
            parser.error(str(exc))
        exit_now(run_router(config))
    raise NotImplementedError(f"unknown command {ns.command!r}")


def exit_now(code: int) -> None:
    """Exit without the interpreter's slow teardown of torch & co. (seconds): everything
    that needed closing (children, sockets, temp dir) is closed already."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())

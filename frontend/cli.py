"""The `plait` command line: `plait serve --model plait-tiny --port 30000 ...`."""

from __future__ import annotations

import argparse
import logging
import os
import sys


def build_parser() -> argparse.ArgumentParser:
    from plait.backend.server.launch import add_serve_arguments

    parser = argparse.ArgumentParser(prog="plait", description="plait: structured generation")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the HTTP server (OpenAI-compatible and SGLang-native APIs)",
        description="Start the plait server: main process (HTTP), scheduler and detokenizer.",
    )
    add_serve_arguments(serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `plait` console script; returns the exit code."""
    ns = build_parser().parse_args(argv)
    if ns.command == "serve":
        from plait.backend.server.launch import args_from_namespace, serve

        exit_now(serve(args_from_namespace(ns)))
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

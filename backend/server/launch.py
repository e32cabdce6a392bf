"""`plait serve`: process startup, signals and the exit code (its flags: args.py).

    main process:  uvicorn + FastAPI + TokenizerManager (+ a receiver thread)
        | ZMQ PUSH ipc://<private dir>/scheduler
    scheduler process -> ZMQ PUSH .../detokenizer -> detokenizer process -> .../main -> main

SIGTERM and Ctrl-C stop the server and both children and exit 0; if a child dies, the
server fails its requests, reports unhealthy, and exits 1.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import socket
import types

import uvicorn

from plait.backend.engine.engine import Engine
from plait.backend.server.app import create_app
from plait.backend.server.args import ServerArgs

GRACEFUL_SHUTDOWN_S = 3
SHUTDOWN_MESSAGE = "the server is shutting down"

log = logging.getLogger("plait.server")


class Terminated(Exception):
    """SIGTERM arrived (raised from the signal handler in the main thread)."""


class PlaitServer(uvicorn.Server):
    """uvicorn's server, ending the requests in flight (with an error saying the server is
    shutting down) before it waits for their connections to close."""

    def __init__(self, config: uvicorn.Config, *, engine: Engine) -> None:
        super().__init__(config)
        self.engine = engine

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.engine.tokenizer_manager.fail_all(SHUTDOWN_MESSAGE, final=True)
        await super().shutdown(sockets)


# --- running ------------------------------------------------------------------------------
def serve(args: ServerArgs) -> int:
    """Run the server until SIGTERM/Ctrl-C (exit code 0) or a child's death (1)."""
    logging.basicConfig(level=args.log_level.upper(), format="[plait] %(levelname)s %(message)s")
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    engine: Engine | None = None
    try:
        engine = Engine(processes=True, **dataclasses.asdict(args.engine))
        _run_http(engine, args)
    except (KeyboardInterrupt, Terminated):
        log.info("shutting down")
    except Exception as exc:  # noqa: BLE001 - a startup failure: say why, exit 1
        log.error("plait serve failed: %s", exc)
        return 1
    finally:
        if engine is not None:
            engine.shutdown()
        signal.signal(signal.SIGTERM, previous)
    return 1 if engine is not None and engine.failure is not None else 0


def _run_http(engine: Engine, args: ServerArgs) -> None:
    settings = args.settings
    server: PlaitServer | None = None

    def stop() -> None:
        if server is not None:
            server.should_exit = True

    app = create_app(engine, settings=settings, on_fatal=stop)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    server = PlaitServer(config, engine=engine)
    log.info("serving %s on http://%s:%d", engine.info.model, args.host, args.port)
    server.run()


def _raise_terminated(signum: int, frame: types.FrameType | None) -> None:
    raise Terminated()

"""The HTTP application: a FastAPI app built around one Engine by `create_app`.

No global state: the app factory binds the routes of `openai_api` and `native_api` to a
`ServerContext`, adds bearer-token authentication (every path but /health) when an API key
is set, maps every error onto a JSON body (validation errors: HTTP 400 naming the field),
serves /metrics, and watches the engine: once a child process dies it reports unhealthy,
and after a short grace calls `on_fatal` (the launcher stops uvicorn and exits non-zero).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from plait.backend.engine import Engine
from plait.backend.request_checks import RequestError
from plait.backend.server.native_api import NativeApi
from plait.backend.server.openai_api import OpenAIApi
from plait.backend.server.protocol import ApiError, error_body, validation_message
from plait.backend.server.serving import ServerContext

WATCH_INTERVAL_S = 0.1
STATS_TIMEOUT_S = 5.0
OPEN_PATHS = frozenset({"/health"})

log = logging.getLogger("plait.server")


@dataclass(frozen=True)
class ServerSettings:
    """HTTP-side settings: the name the model is served under, the API key, and how long
    to keep reporting unhealthy before shutting down after a child process died."""

    model_name: str | None = None
    api_key: str | None = None
    fatal_grace_s: float = 1.0


class ApiKeyMiddleware:
    """Reject requests without `Authorization: Bearer <key>` (HTTP 401), except OPEN_PATHS."""

    def __init__(self, app: ASGIApp, *, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        body = error_body(401, "missing or invalid API key (Authorization: Bearer <key>)")
        response = JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        headers = dict(scope.get("headers") or [])
        return hmac.compare_digest(headers.get(b"authorization", b""), self.expected)


def create_app(
    engine: Engine,
    *,
    settings: ServerSettings | None = None,
    on_fatal: Callable[[], None] | None = None,
) -> FastAPI:
    """The server application around `engine` (in-process or multi-process)."""
    settings = settings or ServerSettings()
    ctx = ServerContext(engine=engine, model_name=settings.model_name or engine.info.model)
    engine.tokenizer_manager.observer = ctx.metrics.observe
    lifespan = _lifespan(ctx, grace_s=settings.fatal_grace_s, on_fatal=on_fatal)
    app = FastAPI(title="plait", lifespan=lifespan)
    _add_error_handlers(app)
    app.include_router(OpenAIApi(ctx).router())
    app.include_router(NativeApi(ctx).router())
    app.add_api_route("/metrics", _metrics_endpoint(ctx), methods=["GET"])
    if settings.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)
    return app


def _lifespan(
    ctx: ServerContext, *, grace_s: float, on_fatal: Callable[[], None] | None
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        watcher = asyncio.create_task(_watch(ctx.engine, grace_s=grace_s, on_fatal=on_fatal))
        try:
            yield
        finally:
            watcher.cancel()

    return lifespan


async def _watch(engine: Engine, *, grace_s: float, on_fatal: Callable[[], None] | None) -> None:
    """Once the runtime fails, keep answering (unhealthy) for `grace_s`, then `on_fatal`."""
    while engine.failure is None:
        await asyncio.sleep(WATCH_INTERVAL_S)
    log.error("runtime failed: %s; shutting down", engine.failure)
    await asyncio.sleep(grace_s)
    if on_fatal is not None:
        on_fatal()


def _metrics_endpoint(ctx: ServerContext) -> Callable[[], object]:
    async def metrics() -> PlainTextResponse:
        try:
            stats = await asyncio.wait_for(ctx.engine.async_stats(), STATS_TIMEOUT_S)
        except (RuntimeError, TimeoutError):
            stats = None
        return PlainTextResponse(ctx.metrics.render(stats), media_type="text/plain; version=0.0.4")

    return metrics


def _add_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return JSONResponse(error_body(exc.status, exc.message, param=exc.param), exc.status)

    async def on_request_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestError)
        return JSONResponse(error_body(400, str(exc), param=exc.field), status_code=400)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        message, field = validation_message(exc.errors())
        return JSONResponse(error_body(400, message, param=field), status_code=400)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        return JSONResponse(error_body(exc.status_code, str(exc.detail)), exc.status_code)

    async def on_other(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s", request.url.path, exc_info=exc)
        return JSONResponse(error_body(500, f"internal error: {exc!r}"), status_code=500)

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestError, on_request_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(Exception, on_other)

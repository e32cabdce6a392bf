"""The HTTP application: a FastAPI app built around one Engine by `create_app`.

No global state: the app factory binds the routes of `openai_api` and `native_api` to a
`ServerContext`, adds authentication (`auth`: API and admin keys, each request's caller) and
a request body limit (413), maps every error onto a JSON body (validation errors: HTTP 400
naming the field), serves /metrics, and watches the engine: once a child process dies it
reports unhealthy, and after a short grace calls `on_fatal` (the launcher stops uvicorn and
exits non-zero).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from plait.backend.engine.engine import Engine
from plait.backend.request.checks import RequestError
from plait.backend.server.args import ServerSettings
from plait.backend.server.auth import AuthMiddleware
from plait.backend.server.native_api import NativeApi
from plait.backend.server.openai_api import OpenAIApi
from plait.backend.server.openapi import install as install_openapi
from plait.backend.server.protocol import (
    ApiError,
    SafeJSONResponse,
    error_body,
    validation_message,
)
from plait.backend.server.serving import ServerContext
from plait.backend.text.chat_template import ChatRenderer, TemplateLimits

WATCH_INTERVAL_S = 0.1
STATS_TIMEOUT_S = 5.0

log = logging.getLogger("plait.server")


class MetricsResponse(PlainTextResponse):
    """Prometheus' text exposition format."""

    media_type = "text/plain; version=0.0.4"


class BodyTooLarge(Exception):
    """A request body passed the limit while it was being read."""


class BodyLimitMiddleware:
    """HTTP 413 for a body over `limit` bytes: at once from its Content-Length, or as soon as
    that many bytes have arrived."""

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.limit:
            await self._refuse(scope, receive, send)
            return
        seen, over, refused = 0, False, False

        async def counted() -> Message:
            nonlocal seen, over
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                over = True
                raise BodyTooLarge()
            return message

        async def guarded(message: Message) -> None:  # the app's answer to a cut body
            nonlocal refused
            if not over:
                await send(message)
            elif not refused:
                refused = True
                await self._refuse(scope, receive, send)

        with suppress(BodyTooLarge):
            await self.app(scope, counted, guarded)
        if over and not refused:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = f"body: the request body is larger than {self.limit} bytes"
        response = SafeJSONResponse(error_body(413, message, param="body"), status_code=413)
        await response(scope, receive, send)


def create_app(
    engine: Engine,
    *,
    settings: ServerSettings | None = None,
    on_fatal: Callable[[], None] | None = None,
) -> FastAPI:
    """The server application around `engine` (in-process or multi-process)."""
    settings = settings or ServerSettings()
    ctx = ServerContext(
        engine=engine,
        model_name=settings.model_name or engine.info.model,
        renderer=ChatRenderer(
            special_tokens=engine.tokenizer.special_tokens_map,
            limits=TemplateLimits(settings.template_timeout_s, engine.max_prompt_chars),
        ),
        allow_request_chat_template=settings.allow_request_chat_template,
        health_stall_s=settings.health_stall_s,
    )
    engine.tokenizer_manager.observer = ctx.metrics.observe
    lifespan = _lifespan(ctx, grace_s=settings.fatal_grace_s, on_fatal=on_fatal)
    app = FastAPI(title="plait", lifespan=lifespan, default_response_class=SafeJSONResponse)
    _add_error_handlers(app)
    app.include_router(OpenAIApi(ctx).router())
    app.include_router(NativeApi(ctx).router())
    app.add_api_route(
        "/metrics", _metrics_endpoint(ctx), methods=["GET"], response_class=MetricsResponse,
        responses={200: {"description": "Prometheus text format"}},
    )  # fmt: skip
    install_openapi(app)
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    app.add_middleware(AuthMiddleware, auth=settings.auth)  # outermost: runs first
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
            ctx.executor.shutdown(wait=False, cancel_futures=True)

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
    async def metrics() -> MetricsResponse:
        try:
            stats = await asyncio.wait_for(ctx.engine.async_stats(), STATS_TIMEOUT_S)
        except (RuntimeError, TimeoutError):
            stats = None
        return MetricsResponse(ctx.metrics.render(stats))

    return metrics


def _add_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return SafeJSONResponse(error_body(exc.status, exc.message, param=exc.param), exc.status)

    async def on_request_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestError)
        return SafeJSONResponse(error_body(400, str(exc), param=exc.field), status_code=400)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        message, field = validation_message(exc.errors())
        return SafeJSONResponse(error_body(400, message, param=field), status_code=400)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        headers = dict(exc.headers or {})
        methods = _methods_of(request.app, request.url.path)
        if exc.status_code == 405 and methods:  # all of the path's (a route has only one)
            headers["Allow"] = ", ".join(methods)
        body = error_body(exc.status_code, str(exc.detail))
        return SafeJSONResponse(body, exc.status_code, headers=headers)

    async def on_other(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s", request.url.path, exc_info=exc)
        return SafeJSONResponse(error_body(500, f"internal error: {exc!r}"), status_code=500)

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestError, on_request_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(Exception, on_other)


def _methods_of(app: FastAPI, path: str) -> list[str]:
    """The methods /openapi.json documents at `path`."""
    operations = app.openapi().get("paths", {}).get(path, {})
    return sorted(method.upper() for method in operations)

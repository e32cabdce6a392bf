"""The router's HTTP application: the workers' OpenAI and native APIs, passed through.

- `/generate`, `/v1/completions`, `/v1/chat/completions`: routed by the policy (session key
  from the `X-Plait-Session` header, routing text from the body), retried while not started.
- `/flush_cache`, `/abort_request`, `/start_profile`, `/stop_profile`: sent to every worker.
- `/health`: 200 while at least one worker is healthy (503 otherwise).
- `/metrics`: the router's counters and each worker's metrics labelled by worker.
- `/workers`: each worker's state (JSON).
- anything else (`/v1/models`, `/get_model_info`, `/tokenize`, ...): the least loaded worker.

With an API key, every path but /health needs `Authorization: Bearer KEY`; the header is
passed on to the workers, and the router's own calls to them (metrics, server info) carry it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any

import httpx
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from plait.backend.router.config import SESSION_HEADER, RouterConfig
from plait.backend.router.metrics import merge_worker_metrics, router_lines
from plait.backend.router.policy import Routing
from plait.backend.router.proxy import Forward, Proxy, error_response
from plait.backend.router.request_text import GENERATION_PATHS, routing_texts
from plait.backend.router.workers import WorkerPool

BROADCAST_PATHS = frozenset({"/flush_cache", "/abort_request", "/start_profile", "/stop_profile"})
OPEN_PATHS = frozenset({"/health"})
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]
MAX_CONNECTIONS = 1024
MAX_KEEPALIVE = 256
Background = Callable[[WorkerPool], Coroutine[Any, Any, None]]


class RouterState:
    """Everything the handlers share: the pool, the policy, the proxy and its HTTP client."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.pool = WorkerPool(config)
        self.routing = Routing(config, self.pool)
        limits = httpx.Limits(
            max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_KEEPALIVE
        )
        timeout = httpx.Timeout(None, connect=config.connect_timeout_s)
        self.client = httpx.AsyncClient(timeout=timeout, limits=limits)
        self.proxy = Proxy(config, self.pool, self.routing, self.client)

    @property
    def own_headers(self) -> dict[str, str]:
        """Headers of the router's own calls to the workers."""
        keys = self.config.api_keys
        return {"Authorization": f"Bearer {keys[0]}"} if keys else {}


def create_router_app(config: RouterConfig, *, background: Sequence[Background] = ()) -> FastAPI:
    """The router in front of `config.workers`; `background` tasks run while it serves
    (each gets the worker pool; `plait serve --dp` watches its worker processes this way)."""
    state = RouterState(config)
    app = FastAPI(title="plait router", lifespan=_lifespan(state, background))
    app.state.router = state
    app.add_api_route("/health", _health(state), methods=["GET"])
    app.add_api_route("/metrics", _metrics(state), methods=["GET"])
    app.add_api_route("/workers", _workers(state), methods=["GET"])
    app.add_api_route("/{path:path}", _forward(state), methods=METHODS)
    if config.api_keys:
        app.add_middleware(ApiKeyCheck, api_keys=config.api_keys)
    return app


def _lifespan(
    state: RouterState, background: Sequence[Background]
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.pool.check_all(state.client)
        tasks = [asyncio.create_task(state.pool.watch(state.client))]
        tasks += [asyncio.create_task(job(state.pool)) for job in background]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await state.client.aclose()

    return lifespan


def _forward(state: RouterState) -> Callable[[Request], Awaitable[Response]]:
    async def forward(request: Request) -> Response:
        fwd = await Forward.of(request)
        if fwd.path in BROADCAST_PATHS:
            response = await state.proxy.broadcast(fwd)
            if fwd.path == "/flush_cache" and response.status_code == 200:
                state.routing.forget_all()
            return response
        texts = _texts(fwd) if fwd.path in GENERATION_PATHS else []
        session = request.headers.get(SESSION_HEADER) or None
        return await state.proxy.route(request, fwd, texts=texts, session=session)

    return forward


def _texts(fwd: Forward) -> list[str]:
    try:
        return routing_texts(fwd.path, json.loads(fwd.body))
    except ValueError:  # malformed JSON: any worker answers the 400
        return []


def _health(state: RouterState) -> Callable[[], Awaitable[Response]]:
    async def health() -> Response:
        if state.pool.available():
            return Response(status_code=200)
        return error_response(503, "no healthy worker")

    return health


def _workers(state: RouterState) -> Callable[[], Awaitable[JSONResponse]]:
    async def workers() -> JSONResponse:
        rows: list[dict[str, Any]] = [
            {"url": w.url, "healthy": w.available, "dead": w.dead, "in_flight": w.in_flight,
             "routed": w.routed, "cache_hits": w.cache_hits, "session_hits": w.session_hits,
             "retried": w.retried, "failures": w.failures, "tree_chars": w.tree.chars}
            for w in state.pool.workers
        ]  # fmt: skip
        return JSONResponse({"policy": state.config.policy, "workers": rows})

    return workers


def _metrics(state: RouterState) -> Callable[[], Awaitable[PlainTextResponse]]:
    async def metrics() -> PlainTextResponse:
        workers = state.pool.available()
        pages = await asyncio.gather(*(_scrape(state, w.url) for w in workers))
        lines = router_lines(state.pool.workers)
        scraped = [(w.url, page) for w, page in zip(workers, pages, strict=True) if page]
        lines += merge_worker_metrics(scraped)
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    return metrics


async def _scrape(state: RouterState, url: str) -> str:
    try:
        resp = await state.client.get(
            url + "/metrics", headers=state.own_headers, timeout=state.config.health_timeout_s
        )
    except httpx.HTTPError:
        return ""
    return resp.text if resp.status_code == 200 else ""


class ApiKeyCheck:
    """Pure ASGI middleware: 401 without `Authorization: Bearer <key>` for one of `api_keys`,
    except OPEN_PATHS."""

    def __init__(self, app: ASGIApp, *, api_keys: Sequence[str]) -> None:
        self.app = app
        self.expected = [f"Bearer {key}".encode() for key in api_keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        response = error_response(401, "missing or invalid API key (Authorization: Bearer <key>)")
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization", b"")
        return any([hmac.compare_digest(given, expected) for expected in self.expected])

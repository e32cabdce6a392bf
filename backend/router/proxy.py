"""Forwarding: one request to a chosen worker (retried elsewhere until one answers it whole),
or to every worker; streams passed back as they arrive.

A request is retried on another worker when the worker never answered it: the connection
failed, the worker closed it without a whole response (it died, possibly between the headers
and the body), or it answered 503 (its runtime is gone or shutting down). Answers other than
server-sent events are read whole before the client sees any of them (they are written at
once when the work is done), so such a break is still retried. A stream is passed through as
it arrives and never replayed: one cut short by a dying worker ends with an error event and
`data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from plait.backend.router.config import WORKER_HEADER, RouterConfig
from plait.backend.router.policy import Decision, Routing
from plait.backend.router.workers import Worker, WorkerPool

log = logging.getLogger("plait.router")

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "trailer",
     "proxy-authorization", "proxy-authenticate", "host", "content-length"}
)  # fmt: skip
NOT_RELAYED = HOP_BY_HOP - {"content-length"} | {"date", "server"}
NOT_STARTED = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout,
               httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)  # fmt: skip
UNAVAILABLE = 503
CLIENT_GONE = 499  # nginx's code: nobody reads it


def error_response(status: int, message: str) -> JSONResponse:
    """The server's error body (`{"error": {"message", "type", "param", "code"}}`)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return JSONResponse(body, status_code=status)


@dataclass(frozen=True)
class Forward:
    """What is sent to a worker: the client's method, path, query, headers and body."""

    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    @classmethod
    async def of(cls, request: Request) -> Forward:
        headers = tuple((k, v) for k, v in request.headers.items() if k not in HOP_BY_HOP)
        body = await request.body()
        return cls(request.method, request.url.path, request.url.query, headers, body)

    def build(self, client: httpx.AsyncClient, worker: Worker) -> httpx.Request:
        url = worker.url + self.path + (f"?{self.query}" if self.query else "")
        return client.build_request(self.method, url, headers=self.headers, content=self.body)


class RelayedResponse(StreamingResponse):
    """A worker's streamed answer; `release` runs when it is done, even if the client left
    before its body was read."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        status_code: int,
        headers: dict[str, str],
        *,
        release: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(content, status_code=status_code, headers=headers)
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.release()


class Proxy:
    """Sends requests to the workers the routing policy picks."""

    def __init__(
        self, config: RouterConfig, pool: WorkerPool, routing: Routing, client: httpx.AsyncClient
    ) -> None:
        self.config, self.pool, self.routing, self.client = config, pool, routing, client

    async def route(
        self, request: Request, fwd: Forward, *, texts: list[str], session: str | None
    ) -> Response:
        """Send to the policy's worker; retry on another while the request has not started."""
        tried: frozenset[str] = frozenset()
        refusal: Response | None = None
        for _ in range(self.config.max_attempts):
            decision = self.routing.choose(texts, session, tried)
            if decision is None:
                break
            worker = _count(decision)
            worker.in_flight += 1
            try:
                upstream = await self._send(request, fwd, worker)
            except NOT_STARTED as exc:
                worker.in_flight -= 1
                self._not_started(worker, f"{type(exc).__name__}: {exc}")
                tried |= {worker.url}
                continue
            except BaseException:
                worker.in_flight -= 1
                raise
            if upstream is None:
                worker.in_flight -= 1
                return Response(status_code=CLIENT_GONE)
            if upstream.status_code != UNAVAILABLE and _is_stream(upstream):
                return self._relay(upstream, worker)
            try:
                answer = await _buffered(upstream, worker)
            except httpx.HTTPError as exc:
                answer, reason = None, f"its answer broke off: {exc!r}"
            else:
                reason = "it answered 503"
            finally:
                worker.in_flight -= 1
            if answer is not None and answer.status_code != UNAVAILABLE:
                return answer
            refusal = answer or refusal
            self._not_started(worker, reason)
            tried |= {worker.url}
        return refusal or error_response(UNAVAILABLE, _no_worker_message(tried))

    def _not_started(self, worker: Worker, reason: str) -> None:
        worker.failures += 1
        worker.retried += 1
        self.pool.mark_unreachable(worker, reason)
        log.warning("no whole answer from %s (%s): trying another worker", worker.url, reason)

    async def _send(self, request: Request, fwd: Forward, worker: Worker) -> httpx.Response | None:
        """The worker's response headers (body not read); None if the client left first
        (the worker's request is then cancelled, which aborts it there)."""
        send = asyncio.ensure_future(self.client.send(fwd.build(self.client, worker), stream=True))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({send, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (gone, send):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        return None if send.cancelled() else send.result()

    def _relay(self, upstream: httpx.Response, worker: Worker) -> Response:
        """Stream the worker's events back as they arrive (status and headers unchanged)."""
        released = False

        async def release() -> None:  # once, whether or not the body was ever read
            nonlocal released
            if not released:
                released = True
                worker.in_flight -= 1
                await upstream.aclose()

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            except httpx.HTTPError as exc:
                worker.failures += 1
                log.warning("stream from %s broke off: %r", worker.url, exc)
                yield _sse_error(f"worker {worker.url} failed during the response: {exc!r}")
            finally:
                await release()

        headers = _relayed_headers(upstream, worker)
        return RelayedResponse(body(), upstream.status_code, headers, release=release)

    async def broadcast(self, fwd: Forward) -> Response:
        """Send to every available worker; 200 if all answered 200 (else the first other
        answer, unchanged). Equal bodies are passed once, different ones one per line."""
        workers = self.pool.available()
        if not workers:
            return error_response(UNAVAILABLE, _no_worker_message(frozenset()))
        answers = await asyncio.gather(
            *(self._one_buffered(fwd, w) for w in workers), return_exceptions=True
        )
        replies: list[Response] = []
        for worker, answer in zip(workers, answers, strict=True):
            if isinstance(answer, BaseException):
                return error_response(502, f"worker {worker.url}: {answer!r}")
            if answer.status_code != 200:
                return answer
            replies.append(answer)
        if all(r.body == replies[0].body for r in replies):
            return replies[0]
        lines = [
            f"{w.url}: {bytes(r.body).decode(errors='replace').strip()}"
            for w, r in zip(workers, replies, strict=True)
        ]
        return Response("\n".join(lines) + "\n", media_type="text/plain")

    async def _one_buffered(self, fwd: Forward, worker: Worker) -> Response:
        try:
            upstream = await self.client.send(fwd.build(self.client, worker), stream=True)
        except httpx.HTTPError:
            worker.failures += 1
            raise
        return await _buffered(upstream, worker)


def _is_stream(upstream: httpx.Response) -> bool:
    return upstream.headers.get("content-type", "").startswith("text/event-stream")


async def _buffered(upstream: httpx.Response, worker: Worker) -> Response:
    """The whole answer, its bytes as sent (any content-encoding kept, like its header)."""
    try:
        content = b"".join([chunk async for chunk in upstream.aiter_raw()])
    finally:
        await upstream.aclose()
    return Response(content, upstream.status_code, headers=_relayed_headers(upstream, worker))


def _relayed_headers(upstream: httpx.Response, worker: Worker) -> dict[str, str]:
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in NOT_RELAYED}
    headers[WORKER_HEADER] = worker.url
    return headers


def _count(decision: Decision) -> Worker:
    worker = decision.worker
    worker.routed += 1
    worker.cache_hits += decision.reason == "cache_hit"
    worker.session_hits += decision.reason == "session"
    return worker


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (its body was read already)."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:  # noqa: BLE001 - the connection is unusable: as good as gone
        return


def _sse_error(message: str) -> bytes:
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": 502}}
    return f"\n\ndata: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()


def _no_worker_message(tried: frozenset[str]) -> str:
    if tried:
        return f"no worker could take the request (tried {', '.join(sorted(tried))})"
    return "no healthy worker"

"""What the HTTP backends share: one connection pool per event loop, error checks,
server-sent events, and the program run's session key on every request."""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator
from typing import Any

import httpx

from plait.clients.session import session_headers

MAX_CONNECTIONS = 512
MAX_KEEPALIVE = 64


class HttpError(RuntimeError):
    """The server refused a request (the message is the server's)."""


class LoopClients:
    """One `httpx.AsyncClient` per event loop (each program run has its own loop)."""

    def __init__(self, *, headers: dict[str, str], timeout: float) -> None:
        self.headers = headers
        self.timeout = timeout
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient]
        self._clients = weakref.WeakKeyDictionary()

    def get(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            limits = httpx.Limits(
                max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_KEEPALIVE
            )
            client = httpx.AsyncClient(headers=self.headers, timeout=self.timeout, limits=limits)
            self._clients[loop] = client
        return client

    async def post(self, url: str, body: dict[str, Any]) -> Any:
        """POST JSON; the decoded JSON answer (HttpError unless it is a 200)."""
        resp = await self.get().post(url, json=body, headers=session_headers())
        check(resp)
        return resp.json()

    async def events(self, url: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """POST JSON and yield each server-sent event's JSON until `data: [DONE]`."""
        headers = session_headers()
        async with self.get().stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                await resp.aread()
                check(resp)
            async for line in resp.aiter_lines():
                if line.startswith("data:") and line.strip() != "data: [DONE]":
                    yield json.loads(line[5:])


def check(resp: httpx.Response) -> None:
    """HttpError with the server's message unless the answer is a 200."""
    if resp.status_code != 200:
        try:
            detail = resp.json()
        except ValueError:
            detail = resp.text
        raise HttpError(f"HTTP {resp.status_code} from {resp.request.url}: {detail}")

"""The workers behind the router: their health, load and counters, and the health checks.

A worker is healthy after its `/health` answered 200, and unhealthy after
`health_failures` checks in a row failed (at once when nothing listens on its port, when the
router could not connect to it, or when it was marked dead): an unhealthy worker gets no new
requests until a check succeeds again. `in_flight` (requests sent and not yet answered in
full) is the load the policies balance.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import httpx

from plait.backend.router.config import RouterConfig
from plait.backend.router.prefix_tree import PrefixTree

log = logging.getLogger("plait.router")


@dataclass
class Worker:
    """One worker's state in the router (mutated on the router's event loop only)."""

    url: str
    tree: PrefixTree = field(default_factory=PrefixTree)
    healthy: bool = False
    dead: bool = False  # its process is known to have exited (`plait serve --dp`)
    failed_checks: int = 0
    in_flight: int = 0
    routed: int = 0
    retried: int = 0
    failures: int = 0
    cache_hits: int = 0
    session_hits: int = 0

    @property
    def available(self) -> bool:
        return self.healthy and not self.dead


class WorkerPool:
    """The workers in the order given, and the loop that checks their health."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.workers = [Worker(url) for url in config.workers]
        self._by_url = {w.url: w for w in self.workers}

    def __getitem__(self, url: str) -> Worker:
        return self._by_url[url]

    def available(self, exclude: frozenset[str] = frozenset()) -> list[Worker]:
        return [w for w in self.workers if w.available and w.url not in exclude]

    def least_loaded(self, exclude: frozenset[str] = frozenset()) -> Worker | None:
        candidates = self.available(exclude)
        return min(candidates, key=lambda w: (w.in_flight, w.tree.chars)) if candidates else None

    def mark_unreachable(self, worker: Worker, reason: str) -> None:
        """No new requests until a health check succeeds again."""
        if worker.healthy:
            log.warning("worker %s is unreachable (%s): taken out of rotation", worker.url, reason)
        worker.healthy = False
        worker.failed_checks = max(worker.failed_checks, self.config.health_failures)

    def mark_dead(self, url: str) -> None:
        """The worker's process exited: never route to it again."""
        worker = self._by_url[url]
        worker.dead, worker.healthy = True, False

    # --- health checks ------------------------------------------------------------------
    async def check_all(self, client: httpx.AsyncClient) -> None:
        await asyncio.gather(*(self._check(client, w) for w in self.workers if not w.dead))

    async def watch(self, client: httpx.AsyncClient) -> None:
        """Check every worker each `health_interval_s`, forever (cancel to stop); the first
        check one interval after the router's startup check."""
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            await self.check_all(client)

    async def _check(self, client: httpx.AsyncClient, worker: Worker) -> None:
        try:
            resp = await client.get(worker.url + "/health", timeout=self.config.health_timeout_s)
        except httpx.ConnectError as exc:
            self.mark_unreachable(worker, f"connect: {exc}")
            return
        except httpx.HTTPError as exc:
            self._failed(worker, repr(exc))
            return
        if resp.status_code != 200:
            self._failed(worker, f"/health answered {resp.status_code}")
        elif not worker.healthy:
            log.info("worker %s is healthy", worker.url)
            worker.tree.clear()  # back from a failure: its cache may be gone
            worker.healthy, worker.failed_checks = True, 0
        else:
            worker.failed_checks = 0

    def _failed(self, worker: Worker, reason: str) -> None:
        worker.failed_checks += 1
        if worker.failed_checks >= self.config.health_failures:
            self.mark_unreachable(worker, reason)

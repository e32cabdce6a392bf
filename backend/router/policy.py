"""Which worker gets a request: session pinning, then `cache_aware` or `round_robin`.

`Routing.choose` is called once per attempt with the request's routing texts (see
`request_text`) and its session key; the workers already tried are excluded. A session
stays on the worker it was first routed to while that worker is available, so a program's
forks and turns find their shared prefix in one cache. Whatever the reason, the chosen
worker's tree then remembers the texts.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from plait.backend.router.config import RouterConfig
from plait.backend.router.workers import Worker, WorkerPool

EVICT_SLACK = 0.9  # a tree over its budget is cut to this fraction of it


@dataclass(frozen=True)
class Decision:
    """The worker chosen and why: "session", "cache_hit", "balance", "new_prefix",
    "round_robin" or "any" (a request without routing text)."""

    worker: Worker
    reason: str
    matched_chars: int = 0


class Routing:
    """The routing policy over a `WorkerPool`, with the session table."""

    def __init__(self, config: RouterConfig, pool: WorkerPool) -> None:
        self.config, self.pool = config, pool
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._next = 0  # round robin position

    def choose(
        self, texts: list[str], session: str | None, exclude: frozenset[str] = frozenset()
    ) -> Decision | None:
        """The worker for this attempt (None when no worker is available)."""
        candidates = self.pool.available(exclude)
        if not candidates:
            return None
        decision = self._pinned(session, exclude) or self._policy(texts, candidates)
        if session is not None:
            self._pin(session, decision.worker.url)
        self._remember(decision.worker, texts)
        return decision

    def _policy(self, texts: list[str], candidates: list[Worker]) -> Decision:
        if not texts:
            return Decision(min(candidates, key=_load), "any")
        if self.config.policy == "round_robin":
            return self._round_robin(candidates)
        return self._cache_aware(texts[0], candidates)

    def _round_robin(self, candidates: list[Worker]) -> Decision:
        order = self.pool.workers
        for step in range(len(order)):
            worker = order[(self._next + step) % len(order)]
            if worker in candidates:
                self._next = (order.index(worker) + 1) % len(order)
                return Decision(worker, "round_robin")
        raise AssertionError("a candidate is always among the pool's workers")

    def _cache_aware(self, text: str, candidates: list[Worker]) -> Decision:
        idlest = min(candidates, key=_load)
        if self._imbalanced(candidates):
            return Decision(idlest, "balance")
        matches = [(w.tree.match(text), w) for w in candidates]
        matched, best = max(matches, key=lambda m: (m[0], -m[1].in_flight))
        if text and matched / len(text) > self.config.cache_threshold:
            return Decision(best, "cache_hit", matched)
        roomiest = min(candidates, key=lambda w: (w.tree.chars, w.in_flight))
        return Decision(roomiest, "new_prefix", matched)

    def _imbalanced(self, candidates: list[Worker]) -> bool:
        loads = [w.in_flight for w in candidates]
        most, least = max(loads), min(loads)
        return (
            most - least > self.config.balance_abs_threshold
            and most > least * self.config.balance_rel_threshold
        )

    def _pinned(self, session: str | None, exclude: frozenset[str]) -> Decision | None:
        url = self._sessions.get(session) if session is not None else None
        if url is None or url in exclude or not self.pool[url].available:
            return None
        return Decision(self.pool[url], "session")

    def _pin(self, session: str, url: str) -> None:
        self._sessions[session] = url
        self._sessions.move_to_end(session)
        while len(self._sessions) > self.config.max_sessions:
            self._sessions.popitem(last=False)

    def _remember(self, worker: Worker, texts: list[str]) -> None:
        for text in texts:
            worker.tree.insert(text)
        if worker.tree.chars > self.config.max_tree_chars:
            worker.tree.evict(int(self.config.max_tree_chars * EVICT_SLACK))

    def forget_all(self) -> None:
        """The workers' caches were flushed: so are the trees."""
        for worker in self.pool.workers:
            worker.tree.clear()


def _load(worker: Worker) -> tuple[int, int]:
    """Least loaded first; among equals the smallest tree (the most room in its cache)."""
    return (worker.in_flight, worker.tree.chars)

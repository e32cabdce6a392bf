"""The grammars compiled so far and the compilations under way.

Requests with the same key share one compilation and, once it is done, one cached
`CompiledConstraint` (or its error). The scheduler thread owns the cache and the job table,
so no locks are needed.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from plait.backend.grammar.compiler import CompiledConstraint, GrammarKey
from plait.backend.grammar.workers import CompileJob, WorkerPool


class GrammarCache:
    """Compiled grammars by key (LRU, `capacity` entries), the jobs still compiling (one per
    key, shared by every request that asks for it), and the keys that failed lately (a
    failure is not retried for each request that repeats it)."""

    def __init__(self, *, pool: WorkerPool, capacity: int, timeout_s: float) -> None:
        self.pool = pool
        self.capacity = max(capacity, 0)
        self.timeout_s = timeout_s
        self.entries: OrderedDict[GrammarKey, CompiledConstraint] = OrderedDict()
        self.failures: OrderedDict[GrammarKey, str] = OrderedDict()
        self.jobs: dict[GrammarKey, CompileJob] = {}

    def get(self, key: GrammarKey) -> CompiledConstraint | str | None:
        """The compiled grammar of `key`, the error it failed with lately, or None."""
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
            return entry
        return self.failures.get(key)

    def start(self, key: GrammarKey) -> CompileJob:
        """The job compiling `key`, started now unless one is already running."""
        job = self.jobs.get(key)
        if job is None:
            job = self.pool.submit(key, timeout_s=self.timeout_s)
            self.jobs[key] = job
        return job

    def collect(self) -> None:
        """Move finished compilations into the cache, failed ones into `failures`."""
        for key, job in list(self.jobs.items()):
            if job.future.done():
                del self.jobs[key]
                exc = job.future.exception()
                if exc is None:
                    self._put(self.entries, key, job.future.result())
                else:
                    self._put(self.failures, key, str(exc))

    def _put(self, table: OrderedDict[GrammarKey, Any], key: GrammarKey, value: Any) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > self.capacity:
            table.popitem(last=False)

    def close(self) -> None:
        self.pool.close()

"""Token bitmasks of a step's constrained requests, filled on a worker thread while the
forward runs (xgrammar and llguidance release the GIL): xgrammar's rows through its
`BatchGrammarMatcher`, llguidance's through its `LLExecutor`, both into the same int32
[rows, ceil(V/32)] buffer; llguidance's rows then get the request's stop tokens
(`LlgMatcher.fix_row`).

A row whose matcher fails is reported with its exception (its request fails, the others
are filled one by one). A fill that has not finished after `timeout_s` is abandoned: its
thread cannot be stopped, so the filler moves on to a new thread and every request of that
fill is reported failed (their matchers stay with the old thread and are never used again).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

import llguidance as llg
import torch
import xgrammar as xgr

from plait.backend.grammar.hooks import Matcher
from plait.backend.grammar.keys import LLGUIDANCE, XGRAMMAR
from plait.backend.grammar.llg_matcher import LlgMatcher

TIMING_LOG_SIZE = 1 << 16
FILL_TIMEOUT_S = 20.0

log = logging.getLogger("plait.grammar")


@dataclass(frozen=True)
class Filled:
    """A filled int32 [rows, ceil(V/32)] mask, and the rows whose matcher failed."""

    mask: torch.Tensor | None
    failed: dict[int, Exception] = field(default_factory=dict)


FillWaiter = Callable[[], Filled]


class MaskFiller:
    """Fills bitmask rows on a worker thread; int32 [rows, ceil(V/32)], pinned for CUDA.
    `log` keeps (seconds, rows, backend) of recent fills, one entry per backend a fill
    used."""

    def __init__(self, *, vocab_size: int, pin: bool, timeout_s: float = FILL_TIMEOUT_S) -> None:
        self.words = (vocab_size + 31) // 32
        self.pin = pin
        self.timeout_s = timeout_s
        self.buffer = torch.empty((0, self.words), dtype=torch.int32)
        self.log: deque[tuple[float, int, str]] = deque(maxlen=TIMING_LOG_SIZE)
        self._new_thread()

    def _new_thread(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plait-mask")
        self.batch = xgr.BatchGrammarMatcher(max_threads=1)
        self.executor = llg.LLExecutor(num_threads=1)

    def begin(self, matchers: Sequence[Matcher | None]) -> FillWaiter:
        rows = [i for i, m in enumerate(matchers) if m is not None]
        if not rows:
            return lambda: Filled(None)
        mask = self._rows(len(matchers))
        mask[[i for i, m in enumerate(matchers) if m is None]] = -1  # rows left unmasked
        chosen = [m for m in matchers if m is not None]
        job = self.pool.submit(
            self._fill, (self.batch, self.executor), chosen, mask=mask, rows=rows
        )

        def wait() -> Filled:
            try:
                return job.result(timeout=self.timeout_s)
            except FutureTimeout:
                return self._abandon(rows)

        return wait

    def _abandon(self, rows: list[int]) -> Filled:
        """The fill is stuck: leave it to its thread, fail its rows, use a new thread (and a
        new buffer, which the old thread may still write)."""
        log.error("a grammar mask fill took over %gs; abandoning it", self.timeout_s)
        self.pool.shutdown(wait=False)
        self._new_thread()
        self.buffer = torch.empty((0, self.words), dtype=torch.int32)
        error = TimeoutError(f"filling the grammar mask took over {self.timeout_s:g}s")
        return Filled(None, {row: error for row in rows})

    def _rows(self, n: int) -> torch.Tensor:
        if self.buffer.shape[0] < n:
            size = max(n, 2 * self.buffer.shape[0])
            self.buffer = torch.empty((size, self.words), dtype=torch.int32, pin_memory=self.pin)
        return self.buffer[:n]

    def _fill(
        self,
        fillers: Fillers,
        matchers: list[Matcher],
        *,
        mask: torch.Tensor,
        rows: list[int],
    ) -> Filled:
        """Each backend's rows in one call; a call that fails is redone row by row."""
        split: dict[str, list[tuple[Matcher, int]]] = {XGRAMMAR: [], LLGUIDANCE: []}
        for matcher, row in zip(matchers, rows, strict=True):
            split[LLGUIDANCE if isinstance(matcher, LlgMatcher) else XGRAMMAR].append(
                (matcher, row)
            )
        failed: dict[int, Exception] = {}
        for backend, part in split.items():
            if not part:
                continue
            start = time.perf_counter()
            try:
                failed.update(_FILLS[backend](fillers, part, mask))
            except Exception:  # noqa: BLE001 - fill row by row to find the matchers at fault
                log.exception("filling grammar masks failed; filling each row alone")
                failed.update(self._fill_each(part, mask=mask))
                continue
            self.log.append((time.perf_counter() - start, len(part), backend))
        return Filled(mask, failed)

    @staticmethod
    def _fill_each(part: list[tuple[Matcher, int]], *, mask: torch.Tensor) -> dict[int, Exception]:
        failed: dict[int, Exception] = {}
        for matcher, row in part:
            try:
                matcher.fill_next_token_bitmask(mask, row)
            except Exception as exc:  # noqa: BLE001 - this row's request fails
                failed[row] = exc
        return failed


Fillers = tuple[xgr.BatchGrammarMatcher, llg.LLExecutor]
Part = list[tuple[Matcher, int]]


def _fill_xgr(fillers: Fillers, part: Part, mask: torch.Tensor) -> dict[int, Exception]:
    """xgrammar's rows in one call."""
    matchers = [m for m, _ in part if isinstance(m, xgr.GrammarMatcher)]
    fillers[0].batch_fill_next_token_bitmask(matchers, mask, [r for _, r in part])
    return {}


def _fill_llg(fillers: Fillers, part: Part, mask: torch.Tensor) -> dict[int, Exception]:
    """llguidance's rows in one call, then each row's stop tokens; rows whose matcher has
    failed (a parser limit hit) are returned."""
    rows = [(m, r) for m, r in part if isinstance(m, LlgMatcher)]
    live = [(m, r) for m, r in rows if not m.terminated]
    for matcher, row in rows:
        if matcher.terminated:
            mask[row] = 0  # a finished output allows nothing more
    if live:
        pairs = [(m.inner, r) for m, r in live]
        fillers[1].unsafe_compute_mask_ptr(pairs, mask.data_ptr(), mask.shape[1] * 4, mask.shape[0])
    failed: dict[int, Exception] = {}
    bits = mask.numpy()
    for matcher, row in live:
        try:
            matcher.fix_row(bits, row)
        except RuntimeError as exc:
            failed[row] = exc
    return failed


_FILLS = {XGRAMMAR: _fill_xgr, LLGUIDANCE: _fill_llg}

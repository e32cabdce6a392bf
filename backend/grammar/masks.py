"""Token bitmasks of a step's constrained requests, filled on a worker thread while the
forward runs (xgrammar releases the GIL)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
import xgrammar as xgr

from plait.backend.grammar.hooks import MaskWaiter

TIMING_LOG_SIZE = 1 << 16


class MaskFiller:
    """Fills bitmask rows on a worker thread; int32 [rows, ceil(V/32)], pinned for CUDA.
    `log` keeps (seconds, rows) of recent fills."""

    def __init__(self, *, vocab_size: int, pin: bool) -> None:
        self.words = (vocab_size + 31) // 32
        self.pin = pin
        self.buffer = torch.empty((0, self.words), dtype=torch.int32)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plait-mask")
        self.batch = xgr.BatchGrammarMatcher(max_threads=1)
        self.log: deque[tuple[float, int]] = deque(maxlen=TIMING_LOG_SIZE)

    def begin(self, matchers: Sequence[xgr.GrammarMatcher | None]) -> MaskWaiter:
        rows = [i for i, m in enumerate(matchers) if m is not None]
        if not rows:
            return lambda: None
        mask = self._rows(len(matchers))
        chosen = [m for m in matchers if m is not None]
        job = self.pool.submit(self._fill, chosen, mask=mask, rows=rows)
        return lambda: job.result()

    def _rows(self, n: int) -> torch.Tensor:
        if self.buffer.shape[0] < n:
            size = max(n, 2 * self.buffer.shape[0])
            self.buffer = torch.empty((size, self.words), dtype=torch.int32, pin_memory=self.pin)
        return self.buffer[:n]

    def _fill(
        self, matchers: list[xgr.GrammarMatcher], *, mask: torch.Tensor, rows: list[int]
    ) -> torch.Tensor:
        start = time.perf_counter()
        self.batch.batch_fill_next_token_bitmask(matchers, mask, rows)
        self.log.append((time.perf_counter() - start, len(rows)))
        return mask

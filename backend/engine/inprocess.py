"""Run the scheduler and the detokenizer on one background thread of this process."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import torch

from plait.backend.config import EngineConfig
from plait.backend.request.messages import BatchStrOut, BatchTokenOut
from plait.backend.scheduler.loop import build_scheduler, describe, run_loop
from plait.backend.text.detokenizer import Detokenizer
from plait.backend.text.tokenizer import make_decoder

log = logging.getLogger("plait.inprocess")


class InProcessRuntime:
    """The engine's runtime when everything lives in one process: messages travel through a
    `queue.Queue`, results go to `deliver` from the scheduler thread."""

    def __init__(
        self,
        *,
        config: EngineConfig,
        deliver: Callable[[object], None],
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        torch.set_num_threads(config.num_threads)
        self.scheduler, self.tokenizer = build_scheduler(config)
        self.runner = self.scheduler.runner
        self.info = describe(self.scheduler)
        # the thread cannot die on its own; a lost tensor-parallel rank ends the runtime
        self.failure: str | None = None
        self._on_failure = on_failure
        parallel = self.runner.parallel
        if parallel is not None:
            parallel.on_failure = self._rank_lost
        self.detokenizer = Detokenizer(decode=make_decoder(self.tokenizer))
        self._deliver = deliver
        self._inbox: queue.Queue[object] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="plait-scheduler", daemon=True)
        self._thread.start()
        if parallel is not None and parallel.failure is not None:
            self._rank_lost(parallel.failure)

    def _rank_lost(self, message: str) -> None:
        """A tensor-parallel rank is gone: stop serving and report it (like a dead child of
        the multi-process runtime)."""
        self.failure = message
        self._stop.set()
        if self._on_failure is not None:
            self._on_failure(message)

    def send(self, msg: object) -> None:
        self._inbox.put(msg)

    def close(self) -> None:
        self._stop.set()
        self._inbox.put(None)
        self._thread.join(timeout=30)

    def _recv(self, block: bool) -> list[object]:
        msgs: list[object] = []
        try:
            msgs.append(self._inbox.get(block=block, timeout=0.5 if block else None))
            while True:
                msgs.append(self._inbox.get_nowait())
        except queue.Empty:
            pass
        return [m for m in msgs if m is not None]

    def _send(self, msg: object) -> None:
        if isinstance(msg, BatchTokenOut):
            msg = BatchStrOut(self.detokenizer.process(msg.outputs))
        try:
            self._deliver(msg)
        except Exception:  # noqa: BLE001 - one bad delivery must not stop the scheduler
            log.exception("delivering %s failed", type(msg).__name__)

    def _run(self) -> None:
        torch.set_num_threads(self.scheduler.config.num_threads)
        run_loop(self.scheduler, recv=self._recv, send=self._send, should_stop=self._stop.is_set)

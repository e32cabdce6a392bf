"""The grammar backend built when it is first needed, not while the model loads.

Building it (xgrammar's view of the vocabulary, every token's bytes, the retokenizer's
prefixes) takes about a second of a 50k-token vocabulary, which an engine that never sees a
constrained request need not spend. `OnDemandGrammar` is the scheduler's `GrammarHooks`: the
first constrained request (or `warm_up`, which the server calls while it starts) starts the
build on a thread; requests submitted meanwhile wait in `poll` as compiles do, and are handed
to the backend once it is built. A build that fails fails those requests and every later
constrained one, with its message; unconstrained requests never touch it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import torch
from transformers import PreTrainedTokenizerBase

from plait.backend.config import EngineConfig
from plait.backend.grammar.hooks import GrammarHooks, MaskWaiter, Rewrite
from plait.backend.request.req import INTERNAL_ERROR, FinishReason, Req

log = logging.getLogger(__name__)
CLOSE_WAIT_S = 10.0  # how long `close` waits for a build still running (its thread is a daemon)


class OnDemandGrammar:
    """`GrammarHooks` over the backend `build()` returns, built on a thread at first use."""

    def __init__(self, *, build: Callable[[], GrammarHooks]) -> None:
        self._build = build
        self._backend: GrammarHooks | None = None
        self._error: str | None = None
        self._thread: threading.Thread | None = None
        self._held: list[Req] = []  # submitted before the backend was built
        self._warm = False

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="grammar-build", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            backend = self._build()
            try:
                if self._warm:
                    backend.warm_up()
            except BaseException:
                backend.close()
                raise
            self._backend = backend
        except Exception as exc:  # noqa: BLE001 - reported to the requests that need it
            log.exception("building the grammar backend failed")
            self._error = f"{INTERNAL_ERROR}: building the grammar backend failed: {exc!r}"

    def _ready(self) -> GrammarHooks | None:
        """The backend once its build has ended (None before, or when it failed)."""
        thread = self._thread
        return self._backend if thread is not None and not thread.is_alive() else None

    def submit(self, req: Req) -> None:
        self._start()
        backend = self._ready()
        if backend is None:
            self._held.append(req)
        else:
            backend.submit(req)

    def poll(self) -> tuple[list[Req], list[Req]]:
        thread = self._thread
        if thread is None or thread.is_alive():
            return [], []
        held, self._held = self._held, []
        if self._backend is None:
            for req in held:
                req.finish(FinishReason("error", message=self._error or INTERNAL_ERROR))
            return [], held
        for req in held:
            self._backend.submit(req)
        return self._backend.poll()

    def begin_fill(self, reqs: Sequence[Req]) -> MaskWaiter:
        return self._built().begin_fill(reqs)

    def accept(self, req: Req, token: int) -> None:
        self._built().accept(req, token)

    def after_sample(self, req: Req) -> Rewrite | None:
        return self._built().after_sample(req)

    def draft_masks(self, req: Req, draft: Sequence[int]) -> tuple[int, torch.Tensor]:
        return self._built().draft_masks(req, draft)

    def backend(self) -> GrammarHooks:
        """The backend, waiting for its build (started now if need be): for the tools and
        tests that look inside it. Raises RuntimeError when the build failed."""
        self._start()
        assert self._thread is not None
        self._thread.join()
        if self._backend is None:
            raise RuntimeError(self._error or "the grammar backend was not built")
        return self._backend

    def _built(self) -> GrammarHooks:
        """The backend, for calls the scheduler makes only for requests it gave a grammar."""
        backend = self._ready()
        if backend is None:
            raise RuntimeError("no grammar backend: no request can have a grammar yet")
        return backend

    def release(self, req: Req) -> None:
        if req in self._held:
            self._held.remove(req)
        backend = self._ready()
        if backend is not None:
            backend.release(req)

    def warm_up(self) -> None:
        """Start building now (the server, while it starts); the backend's own warm-up (its
        compile workers) follows the build."""
        self._warm = True
        self._start()

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join(CLOSE_WAIT_S)
        backend = self._ready()
        if backend is not None:
            backend.close()


def grammar_on_demand(
    config: EngineConfig, tokenizer: PreTrainedTokenizerBase, vocab_size: int
) -> OnDemandGrammar:
    """The scheduler's grammar hooks: `make_grammar`'s backend, imported and built at the first
    constrained request."""

    def build() -> GrammarHooks:
        from plait.backend.grammar.backend import make_grammar

        return make_grammar(config, tokenizer, vocab_size)

    return OnDemandGrammar(build=build)

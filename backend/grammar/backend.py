"""Constrained decoding: the scheduler's `GrammarHooks`, over either grammar backend.

Each constraint is compiled off-thread by the backend its key names (xgrammar, llguidance, or
`auto`: per constraint, xgrammar unless llguidance enforces keywords xgrammar would only warn
about; `compiler`) and cached by key. One matcher per constrained request (`req.grammar`, a
`RequestGrammar`: xgrammar's `GrammarMatcher` or an `LlgMatcher`). Each step the bitmask rows
of the constrained requests are filled on a worker thread while the forward runs (`masks`);
after sampling the matcher accepts the token, and the `Rewriter` writes what the grammar
forces or, near the token limit, a completion (`rewrite`). Both backends go through the same
calls, so batches may mix them.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from plait.backend.config import EngineConfig
from plait.backend.grammar.cache import GrammarCache
from plait.backend.grammar.compiler import CompiledConstraint, grammar_key
from plait.backend.grammar.errors import GrammarError, clean_error
from plait.backend.grammar.hooks import MaskWaiter, Matcher, Rewrite
from plait.backend.grammar.jump_forward import Retokenizer
from plait.backend.grammar.masks import TIMING_LOG_SIZE, MaskFiller
from plait.backend.grammar.matcher import RequestGrammar, new_matcher
from plait.backend.grammar.reasoning_gate import make_gate
from plait.backend.grammar.rewrite import Rewriter
from plait.backend.grammar.vocab import Vocab
from plait.backend.grammar.workers import MAX_GRAMMAR_BYTES, CompileJob, WorkerPool
from plait.backend.request.req import INTERNAL_ERROR, FinishReason, Req
from plait.kernels.bitmask import prepare_cpu_kernel

# past the workers' own deadline (which a worker's start may push back), the scheduler gives
# up by itself
TIMEOUT_GRACE_S = 120.0


log = logging.getLogger("plait.grammar")


@dataclass(frozen=True)
class _Waiting:
    """A submitted request: its compile job (or cached grammar, or error) and when."""

    source: CompileJob | CompiledConstraint | str
    since: float


class GrammarBackend:
    """`GrammarHooks` over xgrammar and llguidance: compile cache, per-request matchers,
    masks, rewrites."""

    def __init__(
        self, *, config: EngineConfig, vocab: Vocab, retokenizer: Retokenizer, pin: bool
    ) -> None:
        self.config = config
        self.vocab = vocab
        self.token_bytes = retokenizer.token_bytes
        pool = WorkerPool(vocab=vocab, size=config.grammar_workers, max_bytes=MAX_GRAMMAR_BYTES)
        self.cache = GrammarCache(
            pool=pool, capacity=config.grammar_cache_size, timeout_s=config.grammar_timeout_s
        )
        self.rewriter = Rewriter(retokenizer=retokenizer, jump_forward=config.enable_jump_forward)
        self.filler = MaskFiller(vocab_size=vocab.vocab_size, pin=pin)
        self.waiting: dict[Req, _Waiting] = {}
        self.compile_log: deque[float] = deque(maxlen=TIMING_LOG_SIZE)

    # --- compilation ------------------------------------------------------------------
    def submit(self, req: Req) -> None:
        now = time.monotonic()
        try:
            key = grammar_key(req.params, backend=self.config.grammar_backend)
        except GrammarError as exc:
            self.waiting[req] = _Waiting(str(exc), now)
            return
        except Exception as exc:  # noqa: BLE001 - malformed input fails this request only
            kind = req.params.constraint[0] if req.params.constraint else "constraint"
            self.waiting[req] = _Waiting(f"invalid {kind}: {type(exc).__name__}: {exc}", now)
            return
        cached = self.cache.get(key)
        self.waiting[req] = _Waiting(cached or self.cache.start(key), now)

    def poll(self) -> tuple[list[Req], list[Req]]:
        ready: list[Req] = []
        failed: list[Req] = []
        for req, waiting in list(self.waiting.items()):
            outcome = self._outcome(waiting)
            if outcome is None:
                continue
            del self.waiting[req]
            if not isinstance(outcome, str):
                outcome = self._refused(outcome) or outcome
            if not isinstance(outcome, str):
                try:
                    self._attach(req, outcome)
                except Exception as exc:  # noqa: BLE001 - this request fails, not the poll
                    log.exception("starting the grammar of %s failed", req.rid)
                    outcome = f"{INTERNAL_ERROR}: starting its grammar failed: {exc!r}"
            if isinstance(outcome, str):
                req.finish(FinishReason("error", message=outcome))
                failed.append(req)
            else:
                ready.append(req)
        self._collect()
        return ready, failed

    def warm_up(self) -> None:
        """Start the compile workers now rather than at the first constrained request."""
        self.cache.pool.start()

    def _outcome(self, waiting: _Waiting) -> CompiledConstraint | str | None:
        source = waiting.source
        if not isinstance(source, CompileJob):
            return source
        limit = self.config.grammar_timeout_s
        if source.future.done():
            exc = source.future.exception()
            if exc is None:
                return source.future.result()
            return str(exc) if isinstance(exc, GrammarError) else f"grammar: {clean_error(exc)}"
        if time.monotonic() - waiting.since > limit + TIMEOUT_GRACE_S:
            return f"{source.key.kind}: grammar compilation timed out after {limit:g}s"
        return None

    def _collect(self) -> None:
        for job in self.cache.jobs.values():
            if job.future.done() and job.future.exception() is None:
                self.compile_log.append(job.future.result().compile_s)
        self.cache.collect()

    def _refused(self, compiled: CompiledConstraint) -> str | None:
        """With `strict_schemas`, a constraint with warnings fails its request (an error
        naming the constraint's field, so the server answers 400)."""
        if not (self.config.strict_schemas and compiled.warnings):
            return None
        gaps = "; ".join(compiled.warnings)
        kind = compiled.key.kind
        return f"{kind}: the grammar cannot enforce this schema (strict schemas): {gaps}"

    def _attach(self, req: Req, compiled: CompiledConstraint) -> None:
        stops = sorted(req.eos_ids | set(req.params.stop_token_ids)) or None
        matcher = new_matcher(compiled, stops=stops, vocab=self.vocab)
        state = RequestGrammar(compiled, matcher=matcher, token_bytes=self.token_bytes)
        parser = self.config.reasoning_parser
        state.gate = make_gate(req, parser=parser, token_bytes=self.token_bytes)
        req.grammar = state
        req.warnings = req.warnings + compiled.warnings

    # --- decoding ---------------------------------------------------------------------
    def begin_fill(self, reqs: Sequence[Req]) -> MaskWaiter:
        """Start filling; the waiter fails the requests whose row could not be filled."""
        wait = self.filler.begin([_matcher(r) for r in reqs])

        def waiter() -> torch.Tensor | None:
            filled = wait()
            for row, exc in filled.failed.items():
                reqs[row].fail(f"{INTERNAL_ERROR}: its grammar mask failed: {exc}")
            return filled.mask

        return waiter

    def accept(self, req: Req, token: int) -> None:
        """Advance the matcher; a token outside the grammar (only possible when every
        allowed token was banned, e.g. stop tokens before min_new_tokens) ends the request."""
        state: RequestGrammar = req.grammar
        gate = state.gate
        if gate is not None and gate.open:
            gate.feed(token)
            state.start = len(req.output_ids)
            return
        if state.accept(token):
            return
        _drop_last_token(req)
        if state.matcher.is_completed():
            req.finish(FinishReason("stop"))
        else:
            message = f"token {token} is outside the grammar (all allowed tokens were banned)"
            req.finish(FinishReason("error", message=message))

    def after_sample(self, req: Req) -> Rewrite | None:
        state: RequestGrammar = req.grammar
        if state.gate is None or req.finished is not None:
            return self.rewriter.after_sample(req)
        room = req.params.max_new_tokens - len(req.output_ids)
        edit = state.gate.edit(req.output_ids, encode=self.rewriter.retokenizer.encode, room=room)
        if edit is not None:
            del req.output_ids[edit.kept :]
            req.output_ids.extend(edit.appended)
            state.start = len(req.output_ids)
            return Rewrite(edit.kept)
        if state.waiting or state.start == len(req.output_ids):
            req.hold_from = None
            return None
        return self.rewriter.after_sample(req)

    def draft_masks(self, req: Req, draft: Sequence[int]) -> tuple[int, torch.Tensor]:
        state: RequestGrammar = req.grammar
        if state.gate is not None and state.gate.open:
            # inside the reasoning: no mask, and no draft (the end marker could fall inside it)
            return 0, torch.full((1, self.filler.words), -1, dtype=torch.int32)
        mask = torch.empty((len(draft) + 1, self.filler.words), dtype=torch.int32)
        n = state.fill_draft(draft, mask)
        return n, mask[: n + 1]

    def release(self, req: Req) -> None:
        self.waiting.pop(req, None)
        req.grammar = None

    def close(self) -> None:
        self.cache.close()


def _drop_last_token(req: Req) -> None:
    """Forget the token just sampled (and its logprobs, recorded before `accept`)."""
    req.output_ids.pop()
    rec = req.logprobs
    if req.params.return_logprob and len(rec.output) > len(req.output_ids):
        rec.output.pop()
        if rec.output_top:
            rec.output_top.pop()


def _matcher(req: Req) -> Matcher | None:
    """The request's matcher; None for no grammar, or one waiting out a reasoning section."""
    state: RequestGrammar | None = req.grammar
    return state.matcher if state is not None and not state.waiting else None


def make_grammar(
    config: EngineConfig, tokenizer: PreTrainedTokenizerBase, vocab_size: int
) -> GrammarBackend:
    """The grammar backend for constrained requests, one per model."""
    vocab = Vocab(tokenizer=tokenizer, vocab_size=vocab_size)
    retokenizer = Retokenizer(token_bytes=vocab.token_bytes, encode=vocab.encode)
    pin = config.device != "cpu" and torch.cuda.is_available()
    if not pin:  # masks are applied on the CPU
        prepare_cpu_kernel()  # built once per machine (cached), so no request waits for it
    return GrammarBackend(config=config, vocab=vocab, retokenizer=retokenizer, pin=pin)

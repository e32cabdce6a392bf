"""Constrained decoding with xgrammar: the scheduler's `GrammarHooks`.

One `GrammarMatcher` per constrained request (`req.grammar`, a `RequestGrammar`), built from a
grammar compiled off-thread and cached by key (`grammar_compiler`). Each step the bitmask rows
of the constrained requests are filled on a worker thread while the forward runs (xgrammar
releases the GIL); after sampling the matcher accepts the token, and jump-forward appends
the text the grammar forces (`jump_forward`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
import xgrammar as xgr
from transformers import PreTrainedTokenizerBase

from plait.backend.closing import Closer, CloseState
from plait.backend.config import EngineConfig
from plait.backend.grammar_api import GrammarHooks, MaskWaiter
from plait.backend.grammar_compiler import (
    CompiledConstraint,
    CompileJob,
    GrammarCache,
    GrammarError,
    clean_error,
    grammar_key,
    new_compiler,
)
from plait.backend.jump_forward import Encoder, Jump, Retokenizer
from plait.backend.regex_fsm import RegexCursor
from plait.backend.req import FinishReason, Req
from plait.kernels.bitmask import prepare_cpu_kernel

COMPILE_WORKERS = 2
JSON_KINDS = frozenset({"json_schema", "json_object"})
TIMING_LOG_SIZE = 1 << 16


class RequestGrammar:
    """One request's grammar state: its matcher and, for regex constraints, its DFA cursor."""

    def __init__(self, compiled: CompiledConstraint, *, stop_ids: list[int] | None) -> None:
        self.compiled = compiled
        self.matcher = xgr.GrammarMatcher(compiled.grammar, override_stop_tokens=stop_ids)
        self.cursor = RegexCursor(compiled.regex_fsm) if compiled.regex_fsm else None
        self.closing = CloseState()

    def is_terminated(self) -> bool:
        return bool(self.matcher.is_terminated())

    def accept(self, token: int, data: bytes) -> bool:
        """Advance by one token (`data`: its bytes); False (state unchanged) if rejected."""
        if not self.matcher.accept_token(token):
            return False
        if self.cursor is not None:
            self.cursor.advance(data)
        return True

    def rollback(self, n: int) -> None:
        if n > 0:
            self.matcher.rollback(n)
            if self.cursor is not None:
                self.cursor.rollback(n)

    def forced_text(self) -> str:
        """The text every continuation starts with: the regex DFA's chain of single
        transitions, or xgrammar's jump-forward string."""
        if self.cursor is not None and self.cursor.state is not None:
            return self.cursor.forced()
        return str(self.matcher.find_jump_forward_string())


@dataclass(frozen=True)
class _Waiting:
    """A submitted request: its compile job (or cached grammar, or error) and when."""

    source: CompileJob | CompiledConstraint | str
    since: float


class MaskFiller:
    """Fills bitmask rows on a worker thread; int32 [rows, ceil(V/32)], pinned for CUDA."""

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


class XGrammarBackend:
    """`GrammarHooks` over xgrammar: compile cache, per-request matchers, masks, jumps."""

    def __init__(
        self,
        *,
        config: EngineConfig,
        info: xgr.TokenizerInfo,
        retokenizer: Retokenizer,
        pin: bool,
    ) -> None:
        self.config = config
        self.info = info
        self.token_bytes = retokenizer.token_bytes
        self.cache = GrammarCache(
            compiler=new_compiler(info), capacity=config.grammar_cache_size, workers=COMPILE_WORKERS
        )
        self.retokenizer = retokenizer
        self.closer = Closer(retokenizer=retokenizer)
        self.filler = MaskFiller(vocab_size=info.vocab_size, pin=pin)
        self.waiting: dict[Req, _Waiting] = {}
        self.compile_log: deque[float] = deque(maxlen=TIMING_LOG_SIZE)

    # --- compilation ------------------------------------------------------------------
    def submit(self, req: Req) -> None:
        now = time.monotonic()
        try:
            key = grammar_key(req.params)
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
            if isinstance(outcome, str):
                req.finish(FinishReason("error", message=outcome))
                failed.append(req)
            else:
                self._attach(req, outcome)
                ready.append(req)
        self._collect()
        return ready, failed

    def _outcome(self, waiting: _Waiting) -> CompiledConstraint | str | None:
        source = waiting.source
        if not isinstance(source, CompileJob):
            return source
        assert source.future is not None
        if source.future.done():
            exc = source.future.exception()
            if exc is None:
                return source.future.result()
            return str(exc) if isinstance(exc, GrammarError) else f"grammar: {clean_error(exc)}"
        started = max(source.started or float("inf"), waiting.since)
        limit = self.config.grammar_timeout_s
        if time.monotonic() - started > limit:
            return f"{source.key.kind}: grammar compilation timed out after {limit:g}s"
        return None

    def _collect(self) -> None:
        for job in self.cache.jobs.values():
            if job.future is not None and job.future.done() and job.future.exception() is None:
                self.compile_log.append(job.future.result().compile_s)
        self.cache.collect()

    def _attach(self, req: Req, compiled: CompiledConstraint) -> None:
        stops = sorted(req.eos_ids | set(req.params.stop_token_ids)) or None
        req.grammar = RequestGrammar(compiled, stop_ids=stops)
        req.warnings = req.warnings + compiled.warnings

    # --- decoding ---------------------------------------------------------------------
    def begin_fill(self, reqs: Sequence[Req]) -> MaskWaiter:
        return self.filler.begin([_matcher(r) for r in reqs])

    def accept(self, req: Req, token: int) -> None:
        """Advance the matcher; a token outside the grammar (only possible when every
        allowed token was banned, e.g. stop tokens before min_new_tokens) ends the request."""
        state: RequestGrammar = req.grammar
        if state.accept(token, self.token_bytes[token]):
            return
        _drop_last_token(req)
        if state.matcher.is_completed():
            req.finish(FinishReason("stop"))
        else:
            message = f"token {token} is outside the grammar (all allowed tokens were banned)"
            req.finish(FinishReason("error", message=message))

    def jump_forward(self, req: Req, max_rollback: int) -> int:
        state: RequestGrammar = req.grammar
        forced = state.forced_text()
        if not forced:
            return 0
        out = req.output_ids
        tail = out[len(out) - max_rollback :] if max_rollback > 0 else []
        room = req.params.max_new_tokens - len(out)
        plan = self.retokenizer.plan(tail=tail, forced=forced, room=room)
        return plan.removed if plan is not None and self._apply(state, out, plan) else 0

    def _apply(self, state: RequestGrammar, out: list[int], jump: Jump) -> bool:
        """Replace the last `jump.removed` tokens of `out` by `jump.appended`, matcher
        included; False (nothing changed) if the grammar rejects them."""
        removed = out[len(out) - jump.removed :] if jump.removed else []
        if not self._replace(state, removed=removed, appended=jump.appended):
            return False
        del out[len(out) - len(removed) :]
        out.extend(jump.appended)
        return True

    def _replace(
        self, state: RequestGrammar, *, removed: list[int], appended: Sequence[int]
    ) -> bool:
        """Roll the matcher back over `removed` and accept `appended`; on a rejection
        restore the previous state and return False."""
        state.rollback(len(removed))
        for i, token in enumerate(appended):
            if not state.accept(token, self.token_bytes[token]):
                state.rollback(i)
                for old in removed:
                    state.accept(old, self.token_bytes[old])
                return False
        return True

    def close(self, req: Req) -> int | None:
        """Complete the output when the tokens left are about to run out, or when it has
        just been cut at its limit (`closing`); how many trailing tokens were replaced, or
        None when nothing was done."""
        state: RequestGrammar = req.grammar
        out = req.output_ids
        jump = self.closer.plan(
            state.matcher,
            output=out,
            room=req.params.max_new_tokens - len(out),
            state=state.closing,
            is_json=state.compiled.key.kind in JSON_KINDS,
            cut=req.finished is not None,
            sent=req.sent_len,
        )
        fallback = state.closing.fallback
        req.hold_from = fallback.at if fallback is not None and fallback.hold else None
        return jump.removed if jump is not None and self._apply(state, out, jump) else None

    def release(self, req: Req) -> None:
        self.waiting.pop(req, None)
        req.grammar = None


def _drop_last_token(req: Req) -> None:
    """Forget the token just sampled (and its logprobs, recorded before `accept`)."""
    req.output_ids.pop()
    rec = req.logprobs
    if req.params.return_logprob and len(rec.output) > len(req.output_ids):
        rec.output.pop()
        if rec.output_top:
            rec.output_top.pop()


def _matcher(req: Req) -> xgr.GrammarMatcher | None:
    return req.grammar.matcher if req.grammar is not None else None


def tokenizer_info(tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> xgr.TokenizerInfo:
    """xgrammar's view of the vocabulary, `vocab_size` wide (the logits width); special tokens
    get empty text so that grammars never produce them (stop tokens are set per request)."""
    hf = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    vocab = list(hf.decoded_vocab)
    for token in tokenizer.all_special_ids:
        if token < len(vocab):
            vocab[token] = b""
    return xgr.TokenizerInfo(
        vocab,
        xgr.VocabType.RAW,
        vocab_size=vocab_size,
        stop_token_ids=hf.stop_token_ids,
        add_prefix_space=hf.add_prefix_space,
    )


def make_encoder(tokenizer: PreTrainedTokenizerBase) -> Encoder:
    """`encode(text) -> ids` without special tokens, through the Rust tokenizer if any."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return lambda text: list(backend.encode(text, add_special_tokens=False).ids)
    return lambda text: list(tokenizer.encode(text, add_special_tokens=False))


def make_grammar(
    config: EngineConfig, tokenizer: PreTrainedTokenizerBase, vocab_size: int
) -> GrammarHooks | None:
    """The xgrammar backend for constrained requests, one per model."""
    info = tokenizer_info(tokenizer, vocab_size)
    token_bytes = list(info.decoded_vocab)
    retokenizer = Retokenizer(token_bytes=token_bytes, encode=make_encoder(tokenizer))
    pin = config.device != "cpu" and torch.cuda.is_available()
    if not pin:  # masks are applied on the CPU
        prepare_cpu_kernel()  # built once per machine (cached), so no request waits for it
    return XGrammarBackend(config=config, info=info, retokenizer=retokenizer, pin=pin)

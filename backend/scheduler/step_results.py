"""The per-request work of a step around its forward: the forward's inputs; after it, prompt
logprobs, sampling, and what each new token does (its logprobs, the grammar's accept and
rewrite, stop and length checks), one request at a time.

Whatever fails while handling one request (its logprobs, its sampling row, its grammar, its
stop search) ends that request alone with an error that starts with "internal error"; the
other requests of the step go on. Only a failure that belongs to no request (the KV
bookkeeping, the forward of a single request's group) reaches the scheduler.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from plait.backend.cache.kv_manager import KVManager
from plait.backend.grammar import GrammarHooks, MaskWaiter, Rewrite
from plait.backend.model.forward_batch import ForwardBatch
from plait.backend.request.messages import ReqOutput
from plait.backend.request.req import INTERNAL_ERROR, FinishReason, Req
from plait.backend.scheduler.output_builder import OutputBuilder
from plait.backend.scheduler.sampler import Sampler
from plait.backend.speculative.ngram import SpeculativeConfig
from plait.backend.speculative.step import Speculator
from plait.kernels import apply_token_bitmask

MAX_SPLIT_FORWARDS = 32  # forwards a step may spend finding the requests a failure is due to

log = logging.getLogger("plait.scheduler")


def forward_inputs(
    batch: Sequence[Req], slots: torch.Tensor, *, outputs: OutputBuilder, table: torch.Tensor
) -> ForwardBatch:
    """The ForwardBatch of `batch` (each request's `extend_len` tokens into `slots`, a
    speculative draft last), with logits for the prompt positions whose logprobs were asked
    for and the sampled ones (every position of a draft)."""
    input_ids: list[int] = []
    logit_indices: list[int] = []
    for req in batch:
        start, drafted = len(input_ids), len(req.draft)
        input_ids.extend(req.ids(req.kv_len, req.kv_len + req.extend_len - drafted))
        input_ids.extend(req.draft)
        for pos in outputs.input_logprob_positions(req):
            logit_indices.append(start + pos - req.kv_len)
        if req.will_sample():  # the last token's position, and each draft token's
            last = start + req.extend_len - 1
            logit_indices.extend(range(last - drafted, last + 1))
    return ForwardBatch.build(
        input_ids=input_ids,
        out_slots=slots,
        req_rows=[r.row for r in batch],  # type: ignore[misc]
        prefix_lens=[r.kv_len for r in batch],
        extend_lens=[r.extend_len for r in batch],
        logit_indices=logit_indices,
        req_to_token=table,
    )


class SplitBudget:
    """How many forwards a step may still spend narrowing down a failing batch (a failure
    every request shares would otherwise cost two forwards per request)."""

    def __init__(self, forwards: int = MAX_SPLIT_FORWARDS) -> None:
        self.left = forwards

    def take(self, n: int) -> bool:
        if self.left < n:
            return False
        self.left -= n
        return True


@contextmanager
def contained(req: Req, stage: str) -> Iterator[None]:
    """Run the block for `req`; an exception ends `req` (alone) with an error naming `stage`."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - one request's failure is its own
        log.exception("request %s failed in %s", req.rid, stage)
        req.fail(f"{INTERNAL_ERROR}: {stage} failed: {exc!r}")


class StepMasks:
    """The grammar masks of a step's sampling requests (`reqs`, in mask-row order), waited
    for once. If filling them fails, the constrained requests among `reqs` fail."""

    def __init__(self, waiter: MaskWaiter, reqs: Sequence[Req]) -> None:
        self._waiter: MaskWaiter | None = waiter
        self._reqs = list(reqs)
        self._mask: torch.Tensor | None = None

    def wait(self) -> None:
        if self._waiter is None:
            return
        waiter, self._waiter = self._waiter, None
        try:
            self._mask = waiter()
        except Exception as exc:  # noqa: BLE001 - the constrained requests fail, not all
            log.exception("filling the grammar masks failed")
            for req in self._reqs:
                if req.grammar is not None:
                    req.fail(f"{INTERNAL_ERROR}: grammar mask failed: {exc!r}")

    def rows(self, reqs: Sequence[Req]) -> torch.Tensor | None:
        """The mask rows of `reqs` (a subsequence of the step's sampling requests)."""
        self.wait()
        if self._mask is None:
            return None
        if list(reqs) == self._reqs:
            return self._mask
        index = {id(r): i for i, r in enumerate(self._reqs)}
        return self._mask[[index[id(r)] for r in reqs]]


class StepResults:
    """Turns one forward's logits into the batch's new tokens and finish states."""

    def __init__(
        self,
        *,
        sampler: Sampler,
        outputs: OutputBuilder,
        grammar: GrammarHooks | None,
        kv: KVManager,
        context_len: int,
        counters: dict[str, int],
        speculative: SpeculativeConfig | None = None,
    ) -> None:
        self.speculator = Speculator(
            config=speculative, kv=kv, grammar=grammar, context_len=context_len
        )
        self.emitted: list[ReqOutput] = []  # outputs sent between a draft's tokens
        self.sampler = sampler
        self.outputs = outputs
        self.grammar = grammar
        self.kv = kv
        self.context_len = context_len
        self.counters = counters

    def inputs(self, batch: Sequence[Req], slots: torch.Tensor) -> ForwardBatch:
        """The forward's inputs for `batch` (its KV slots `slots`)."""
        return forward_inputs(batch, slots, outputs=self.outputs, table=self.kv.req_pool.table)

    def process(self, batch: Sequence[Req], logits: torch.Tensor, masks: StepMasks) -> None:
        """Record prompt logprobs, advance every request's KV length, sample and apply the
        new tokens. `logits` rows follow `batch` (prompt positions, then the sampled one)."""
        row = 0
        sampling: list[Req] = []
        sample_rows: list[int] = []
        verifying: list[tuple[Req, torch.Tensor]] = []
        for req in batch:
            n = len(self.outputs.input_logprob_positions(req))
            if n:
                with contained(req, "prompt logprobs"):
                    self.outputs.record_input_logprobs(req, logits[row : row + n])
            row += n
            if req.will_sample() and req.draft:
                verifying.append((req, logits[row : row + 1 + len(req.draft)]))
                row += 1 + len(req.draft)
            elif req.will_sample():
                sampling.append(req)
                sample_rows.append(row)
                row += 1
        for req in batch:
            req.kv_len += req.extend_len
            req.extend_len = 0
            with contained(req, "prompt logprobs"):
                self.outputs.mark_input_done(req)
        self._sample(sampling, logits[sample_rows], masks)
        for req, rows in verifying:
            with contained(req, "verifying its draft"):
                self.speculator.verify(req, rows, accept=self._accept, emit=self._emit)

    def take_emitted(self) -> list[ReqOutput]:
        """The outputs sent between a draft's tokens this step (before the step's own)."""
        out, self.emitted = self.emitted, []
        return out

    def _emit(self, req: Req) -> None:
        """What a step sends for a running request, between two tokens of a draft."""
        if req.finished is None and req.sendable_len() > req.sent_len:
            with contained(req, "building its output"):
                self.emitted.append(self.outputs.emit(req))

    def _sample(self, reqs: list[Req], logits: torch.Tensor, masks: StepMasks) -> None:
        for req in reqs:
            if req.params.max_new_tokens == 0:
                req.finish(FinishReason("length"))
        active = [i for i, r in enumerate(reqs) if r.params.max_new_tokens > 0]
        masks.wait()  # may fail constrained requests
        live = [reqs[i] for i in active if reqs[i].finished is None]
        if not live:
            return
        uniforms = self._uniforms(live)
        logits = logits[[i for i in active if reqs[i].finished is None]]
        mask = masks.rows(live)
        if mask is not None:
            rows = [i for i, r in enumerate(live) if r.grammar is not None]
            apply_token_bitmask(logits, mask.to(logits.device, non_blocking=True), indices=rows)
        want = any(r.params.return_logprob for r in live)
        result = self.sampler.sample(logits, live, uniforms=uniforms, want_logprobs=want)
        for i, (req, token) in enumerate(zip(live, result.token_ids, strict=True)):
            if i in result.failed:
                req.fail(f"{INTERNAL_ERROR}: sampling failed: {result.failed[i]!r}")
                continue
            with contained(req, "processing the sampled token"):
                self._accept(
                    req, token, result.logprobs[i] if result.logprobs is not None else None
                )

    def _uniforms(self, reqs: list[Req]) -> list[float]:
        """Each request's uniform for this step (a request whose generator fails fails)."""
        out = []
        for req in reqs:
            value = 0.0
            with contained(req, "drawing a random number"):
                value = 0.0 if req.params.is_greedy else req.next_uniform()
            out.append(value)
        return out

    def _accept(self, req: Req, token: int, logprobs: torch.Tensor | None = None) -> bool:
        """Append `token`, record its logprob, advance the grammar, check for a finish and
        apply what the grammar rewrites (True when it rewrote the output)."""
        req.output_ids.append(token)
        self.counters["generated"] += 1
        if logprobs is not None and req.params.return_logprob:
            self.outputs.record_output_logprob(req, logprobs, token)
        if req.grammar is not None and self.grammar is not None:
            self.grammar.accept(req, token)
        req.check_finished(context_len=self.context_len, tail=self.outputs.tail(req))
        if req.grammar is not None and self.grammar is not None:
            rewrite = self.grammar.after_sample(req)
            if rewrite is not None:
                self._rewritten(req, rewrite)
                return True
        return False

    def _rewritten(self, req: Req, rewrite: Rewrite) -> None:
        """The grammar replaced the output tokens from `rewrite.kept` on (never emitted
        ones): forget their KV (below `cached_len` it is the tree's, keyed by the old tokens,
        and only a closed request, which ends here, goes below it), look for stops in the
        new tokens, and end a closed request."""
        kept = rewrite.kept
        assert kept >= req.sent_len, "the grammar rewrote tokens that were already emitted"
        if kept < req.kv_len - req.prompt_len:
            self.kv.truncate(req, max(req.cached_len, req.prompt_len + kept))
        forced = len(req.output_ids) - kept  # stops may lie in the forced text too
        tail = self.outputs.tail(req, new_tokens=forced) if forced > 0 else None
        req.check_finished(context_len=self.context_len, tail=tail)
        if rewrite.closed and (req.finished is None or req.finished.kind == "length"):
            req.finished = FinishReason("length", closed=True)

"""The continuous-batching loop: admit, batch, forward, sample, retire.

Each `step()` admits waiting requests in cache-aware order within the prefill token budget
(chunking long prompts), runs one forward for the mixed batch of prefills and decodes,
samples, retires finished requests into the radix cache, and retracts running requests back
to the queue when the KV pool runs out. The same class runs in-process (Engine) and in the
server's scheduler process; only the I/O around `add_request`/`step` differs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from plait.backend.cache.kv_manager import KVManager
from plait.backend.config import EngineConfig
from plait.backend.grammar import GrammarHooks
from plait.backend.model.forward_batch import decode_style
from plait.backend.model.runner import ModelRunner
from plait.backend.request.messages import ReqOutput, Stats, TokenizedRequest
from plait.backend.request.req import INTERNAL_ERROR, FinishReason, Req
from plait.backend.scheduler.output_builder import OutputBuilder, ended
from plait.backend.scheduler.policy import AdmissionPlan, SchedulePolicy, prefix_keys
from plait.backend.scheduler.sampler import Sampler
from plait.backend.scheduler.step_results import SplitBudget, StepMasks, StepResults, contained
from plait.backend.text.tokenizer import DecodeFn

FUTURE_TOKENS_CLIP = 4096
GRAMMAR_WAIT_S = 0.002

log = logging.getLogger("plait.scheduler")


class Scheduler:
    """Owns the queues and the KV bookkeeping; the ModelRunner owns the weights."""

    def __init__(
        self,
        *,
        config: EngineConfig,
        runner: ModelRunner,
        decode: DecodeFn,
        grammar: GrammarHooks | None = None,
    ) -> None:
        self.config = config
        self.runner = runner
        self.kv: KVManager = runner.kv_manager(disable_radix_cache=config.disable_radix_cache)
        self.policy = SchedulePolicy(
            policy=config.schedule_policy, kv=self.kv, fcfs_threshold=config.fcfs_queue_threshold
        )
        self.sampler = Sampler()
        self.outputs = OutputBuilder(decode=decode)
        self.grammar = grammar
        self.waiting: list[Req] = []
        self.compiling: list[Req] = []
        self.running: list[Req] = []
        self.chunked: Req | None = None
        self.new_token_ratio = config.new_token_ratio
        self._arrivals = 0
        self._counters = {"prompt": 0, "generated": 0, "cache_hit": 0, "retracted": 0, "steps": 0}
        self._busy_s = 0.0
        self.results = StepResults(
            sampler=self.sampler,
            outputs=self.outputs,
            grammar=grammar,
            kv=self.kv,
            context_len=runner.context_len,
            counters=self._counters,
            speculative=config.speculative,
        )

    # --- requests in ------------------------------------------------------------------
    def add_request(self, msg: TokenizedRequest) -> list[ReqOutput]:
        """Queue a request; one that is invalid, or that fails to be queued for any reason,
        comes straight back as an error output (its rid never stays in flight)."""
        try:
            return self._add(msg)
        except Exception as exc:  # noqa: BLE001 - answer this request, keep serving
            log.exception("queueing request %s failed", msg.rid)
            self._forget(msg.rid)
            message = f"{INTERNAL_ERROR}: the request could not be queued: {exc!r}"
            return [ended(msg.rid, FinishReason("error", message=message))]

    def _add(self, msg: TokenizedRequest) -> list[ReqOutput]:
        self._arrivals += 1
        req = Req(
            rid=msg.rid,
            input_ids=msg.input_ids,
            params=msg.params,
            eos_ids=self.runner.eos_ids,
            group=msg.group,
            arrival=self._arrivals,
        )
        error = req.validation_error(
            vocab_size=self.runner.vocab_size,
            context_len=self.runner.context_len,
            pool_size=self.kv.kv_pool.size,
        )
        if error is None and req.params.constraint is not None and self.grammar is None:
            error = "constrained decoding is not available"
        if error is not None:
            req.finish(FinishReason("error", message=error))
            return [self.outputs.emit(req)]
        if req.params.constraint is None:
            self.waiting.append(req)
        else:
            self.compiling.append(req)
            self.grammar.submit(req)  # type: ignore[union-attr]
        return []

    def _forget(self, rid: str) -> None:
        """Drop every trace of a request that failed before it ran (no KV yet)."""
        for queue in (self.waiting, self.compiling):
            for req in [r for r in queue if r.rid == rid]:
                queue.remove(req)
                if self.grammar is not None:
                    self.grammar.release(req)

    def _poll_grammars(self) -> list[ReqOutput]:
        """Move requests whose grammar compiled to the queue; report the ones that failed."""
        if self.grammar is None or not self.compiling:
            return []
        ready, failed = self.grammar.poll()
        if not (ready or failed or self.running or self.waiting):
            time.sleep(GRAMMAR_WAIT_S)  # only compiles in flight: do not spin the loop
        for req in ready + failed:
            self.compiling.remove(req)
        self.waiting.extend(ready)
        return [self._emit_final(req) for req in failed]

    def abort(self, rid: str) -> list[ReqOutput]:
        """Stop a request wherever it is; its KV goes back to the cache or the pool. An rid
        the scheduler does not know (it finished, or never arrived) is answered too, so the
        client side never waits on it (a duplicate finish is ignored there)."""
        for queue in (self.waiting, self.running, self.compiling):
            for req in queue:
                if req.rid == rid:
                    queue.remove(req)
                    if req is self.chunked:
                        self.chunked = None
                    req.finish(FinishReason("abort", message="aborted"))
                    self._release(req)
                    return [self._emit_final(req)]
        return [ended(rid, FinishReason("abort", message="aborted"))]

    def _release(self, req: Req, *, cache: bool = True) -> None:
        self.kv.release(req, cache=cache)
        if self.grammar is not None and req.params.constraint is not None:
            self.grammar.release(req)

    def flush_cache(self) -> bool:
        """Empty the radix cache; refused (False) while requests are in flight."""
        if self.running or self.waiting:
            return False
        self.kv.flush()
        return True

    def fail_all(self, message: str) -> list[ReqOutput]:
        """After an internal error no request can be blamed for: end every request with
        `message` and reset the cache."""
        out = []
        for req in self.waiting + self.running + self.compiling:
            req.fail(message)
            out.append(self._emit_final(req))
            req.row = req.last_node = None
            if self.grammar is not None and req.params.constraint is not None:
                self.grammar.release(req)
        self.waiting, self.running, self.compiling, self.chunked = [], [], [], None
        self.kv.flush()
        return out

    def close(self) -> None:
        """Stop what runs beside the scheduler (the grammar's compile workers, the other
        tensor-parallel ranks)."""
        if self.grammar is not None:
            self.grammar.close()
        self.runner.close()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.compiling)

    def stats(self) -> Stats:
        pool = self.kv.kv_pool
        return Stats(
            running=len(self.running),
            waiting=len(self.waiting),
            kv_used_tokens=pool.size - pool.available_size() - self.kv.tree.evictable_size(),
            kv_total_tokens=pool.size,
            cache_hit_tokens=self._counters["cache_hit"],
            prompt_tokens=self._counters["prompt"],
            generated_tokens=self._counters["generated"],
            extra={
                "retracted": self._counters["retracted"],
                "steps": self._counters["steps"],
                "busy_s": self._busy_s,
                "cached_tokens": self.kv.tree.total_size(),
                **self.results.speculator.stats(),
            },
        )

    # --- one step ---------------------------------------------------------------------
    def step(self) -> list[ReqOutput]:
        """Run one forward over a mixed batch; returns what each request produced."""
        outputs = self._poll_grammars()
        start = time.perf_counter()
        batch = self._schedule()
        if not batch:
            return outputs
        slots = self._allocate(batch)
        masks = self._begin_masks(batch)
        outputs += self._run(batch, slots, masks)
        self.new_token_ratio = max(
            self.config.min_new_token_ratio,
            self.new_token_ratio - self.config.new_token_ratio_decay,
        )
        if self.config.check_integrity:
            self.kv.check_integrity(self.running)
        self._busy_s += time.perf_counter() - start
        self._counters["steps"] += 1
        return outputs

    def _schedule(self) -> list[Req]:
        decodes = [r for r in self.running if r is not self.chunked]
        for req in decodes:  # 1 token, or the tokens jump-forward appended
            req.extend_len = req.seq_len - req.kv_len
        decodes = self._reserve_decodes(decodes)
        self.results.speculator.propose(decodes)
        prefills = self._admit()
        batch = prefills + decodes
        batch.sort(key=lambda r: decode_style(r.extend_len))
        return batch

    def _reserve_decodes(self, decodes: list[Req]) -> list[Req]:
        """Make room for one token per decoding request, retracting the newest if needed."""
        while decodes and not self.kv.ensure_free_pages(self.kv.pages_for(decodes)):
            victim = max(decodes, key=lambda r: r.arrival)
            decodes.remove(victim)
            self._retract(victim)
        return decodes

    def _retract(self, req: Req) -> None:
        self.running.remove(req)
        self.kv.release(req, cache=True)
        req.extend_len = 0
        self.waiting.append(req)
        self._counters["retracted"] += 1
        self.new_token_ratio = self.config.new_token_ratio

    def _future_tokens(self, reqs: Sequence[Req]) -> int:
        remaining = (
            min(r.params.max_new_tokens - len(r.output_ids), FUTURE_TOKENS_CLIP) for r in reqs
        )
        return int(sum(remaining) * self.new_token_ratio)

    def _admit(self) -> list[Req]:
        """Prefill work for this step: the chunked request's next chunk, then new requests."""
        budget = self.config.prefill_budget
        if self.chunked is not None:
            req = self.chunked
            req.extend_len = min(req.seq_len - req.kv_len, budget)
            if req.will_sample():
                self.chunked = None
            return [req]
        plan = AdmissionPlan(
            budget=budget,
            planned=self.kv.pages_for(self.running) * self.kv.kv_pool.page_size,
            future=self._future_tokens(self.running),
        )
        for req in self.policy.order(self.waiting) if self.waiting else []:
            if len(self.running) >= self.config.max_running_requests or plan.budget <= 0:
                break
            if not self.kv.req_pool.can_allocate():
                break
            admitted = self._admit_one(req, plan)
            if admitted is None:
                break
            if admitted and self.chunked is not None:
                break
        return plan.admitted

    def _admit_one(self, req: Req, plan: AdmissionPlan) -> bool | None:
        """Admit `req` if it fits: True admitted, False deferred, None stop admitting."""
        match = self.kv.match(req)
        keys = prefix_keys(req, match.length)
        if self._waits_to_share(
            req, match.length, plan.shared_run(keys, req.seq_len - match.length)
        ):
            return False  # a request admitted this step computes its next tokens
        first = not req.admitted_once
        self.kv.admit(req, match)
        extend = req.seq_len - req.kv_len
        need = plan.planned + extend + plan.future + self._future_tokens([req])
        chunk = min(extend, plan.budget) if self.config.chunked_prefill_size else extend
        if need > self.kv.available_tokens() or (
            chunk < extend and plan.budget < self.kv.kv_pool.page_size
        ):
            self.kv.release(req, cache=False)
            return None
        req.extend_len = chunk
        plan.take(req, chunk, self._future_tokens([req]), keys)
        self.waiting.remove(req)
        self.running.append(req)
        if first:
            req.cached_tokens, req.admitted_once = req.kv_len, True
            self._counters["cache_hit"] += req.cached_tokens
            self._counters["prompt"] += req.prompt_len
        if chunk < extend:
            self.chunked = req
        return True

    def _waits_to_share(self, req: Req, cached: int, shared: int) -> bool:
        """Defer `req` a step for `shared` tokens an admitted request computes, if the cache
        can then give it more (whole pages, within `match_limit`) and its last wait, at this
        same cached length, did not turn out to gain nothing."""
        if self.kv.tree.disabled or shared == 0 or req.deferred_at == cached:
            return False
        page = self.kv.kv_pool.page_size
        if min(cached + shared, req.match_limit()) // page * page <= cached:
            return False
        req.deferred_at = cached
        return True

    # --- forward -----------------------------------------------------------------------
    def _allocate(self, batch: list[Req]) -> torch.Tensor:
        ok = self.kv.ensure_free_pages(self.kv.pages_for(batch))
        assert ok, "admission must have reserved the pages"
        return self.kv.allocate(batch)

    def _begin_masks(self, batch: list[Req]) -> StepMasks:
        """Start filling grammar masks for this step's sampling requests (in batch order;
        a speculating request's masks come with its draft)."""
        sampling = [
            r for r in batch if r.will_sample() and r.params.max_new_tokens > 0 and not r.draft
        ]
        if self.grammar is None or not any(r.grammar is not None for r in sampling):
            return StepMasks(lambda: None, sampling)
        return StepMasks(self.grammar.begin_fill(sampling), sampling)

    def _run(self, batch: list[Req], slots: torch.Tensor, masks: StepMasks) -> list[ReqOutput]:
        """Forward and results of `batch`; if the forward fails, the batch is retried in
        halves, so that only the requests it fails on alone fail."""
        try:
            logits = self.runner.forward(self.results.inputs(batch, slots))
        except Exception:  # noqa: BLE001 - find the requests it fails on
            log.exception("forward of %d requests failed; retrying in halves", len(batch))
            return self._run_split(batch, masks, SplitBudget())
        return self._process(batch, logits, masks)

    def _run_split(
        self, batch: list[Req], masks: StepMasks, budget: SplitBudget
    ) -> list[ReqOutput]:
        if len(batch) == 1 or not budget.take(2):
            message = f"{INTERNAL_ERROR}: the forward pass failed on this request"
            return [self._drop(req, message) for req in batch]
        out: list[ReqOutput] = []
        half = len(batch) // 2
        for group in (batch[:half], batch[half:]):
            slots = torch.cat([self.kv.step_slots(r) for r in group])
            try:
                logits = self.runner.forward(self.results.inputs(group, slots))
            except Exception:  # noqa: BLE001 - narrow it down further
                log.exception("forward of a group of %d requests failed", len(group))
                out += self._run_split(group, masks, budget)
                continue
            out += self._process(group, logits, masks)
        return out

    def _drop(self, req: Req, message: str) -> ReqOutput:
        """End a request whose forward failed: the slots of this step's tokens were never
        written, so nothing of it is cached."""
        req.fail(message)
        if req is self.chunked:
            self.chunked = None
        self.running.remove(req)
        req.kv_len += req.extend_len  # the step's slots are the request's to free
        req.extend_len = 0
        self._release(req, cache=False)
        return self._emit_final(req)

    # --- results ----------------------------------------------------------------------
    def _process(self, batch: list[Req], logits: torch.Tensor, masks: StepMasks) -> list[ReqOutput]:
        prefilled = [r for r in batch if r.extend_len - len(r.draft) > 1]
        self.results.process(batch, logits, masks)
        for req in prefilled:
            if req.finished is None:
                self.kv.cache_prefix(req)
        return self._retire(batch)

    def _retire(self, batch: list[Req]) -> list[ReqOutput]:
        out = self.results.take_emitted()
        for req in batch:
            if req.finished is None and req.sendable_len() > req.sent_len:
                with contained(req, "building its output"):
                    out.append(self.outputs.emit(req))
            if req.finished is not None:
                self.running.remove(req)
                self._release(req)
                out.append(self._emit_final(req))
        return out

    def _emit_final(self, req: Req) -> ReqOutput:
        """A finished request's last output; if building it fails, a bare error output."""
        try:
            return self.outputs.emit(req)
        except Exception as exc:  # noqa: BLE001 - the request must be answered anyway
            log.exception("building the final output of %s failed", req.rid)
            message = f"{INTERNAL_ERROR}: building its output failed: {exc!r}"
            return ended(req.rid, FinishReason("error", message=message))

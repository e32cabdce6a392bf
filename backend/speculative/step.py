"""The scheduler's side of n-gram speculative decoding (`speculative.py` has the drafts).

Which requests draft: greedy ones whose next token is the plain (grammar-masked) argmax of
the logits (no logit_bias, penalties or logprobs, no stop ids banned by min_new_tokens) and
that decode one token (not the tokens jump-forward appended). `propose` gives each its draft
before the step's KV slots are allocated; a constrained request's draft ends at the first
token its grammar rejects, and the grammar's mask of every draft position is computed then.
The forward runs the last token and the draft as one short extend with logits at every
position. `verify` takes the masked argmax at each position and applies those tokens one at
a time exactly as decoding would (finish checks, grammar accept and rewrites, emissions,
the request's KV length), while they equal the draft, plus the token after the last one
that does; the KV of the draft positions not kept goes back to the pool before anything is
cached. Outputs are those of decoding without speculation, token for token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from plait.backend.cache.kv_manager import KVManager
from plait.backend.grammar import FIXED_LAYOUTS, GrammarHooks, resolve_layout
from plait.backend.request.req import Req
from plait.backend.speculative.ngram import (
    NgramIndex,
    SpecState,
    SpeculativeConfig,
    accepted_prefix,
)
from plait.kernels import apply_token_bitmask

log = logging.getLogger("plait.scheduler")


class Speculator:
    """Drafts for a step's decoding requests and their verification after the forward
    (`config` None: speculation is off and nothing drafts)."""

    def __init__(
        self,
        *,
        config: SpeculativeConfig | None,
        kv: KVManager,
        grammar: GrammarHooks | None,
        context_len: int,
    ) -> None:
        self.config = config
        self.kv = kv
        self.grammar = grammar
        self.context_len = context_len
        self.drafted = 0
        self.accepted = 0
        self.verified = 0

    def stats(self) -> dict[str, float]:
        """Counters since start: draft tokens verified, accepted, their ratio, steps."""
        rate = self.accepted / self.drafted if self.drafted else 0.0
        return {
            "spec_draft_tokens": self.drafted,
            "spec_accepted_tokens": self.accepted,
            "spec_acceptance_rate": rate,
            "spec_verify_steps": self.verified,
        }

    def eligible(self, req: Req) -> bool:
        """Whether decoding `req` with a draft gives the same tokens as without."""
        p = req.params
        plain = not (p.logit_bias or p.has_penalties or p.return_logprob)
        # drafts under the layouts with optional gaps changed outputs in a test: off there
        layout = resolve_layout(layout=p.json_layout, any_whitespace=p.any_whitespace)
        plain = plain and layout in FIXED_LAYOUTS
        one = req.seq_len - req.kv_len == 1 and req.finished is None
        return p.is_greedy and plain and one and not req.below_min_tokens()

    # --- before the forward -----------------------------------------------------------
    def propose(self, decodes: Sequence[Req]) -> None:
        """Give the eligible requests among `decodes` their drafts (`extend_len` grows by
        each draft); no drafts when the pool cannot hold them."""
        if self.config is None or self.kv.kv_pool.page_size != 1:
            return  # a page-aligned pool would free pages shared with kept tokens
        drafting = [r for r in decodes if self.eligible(r)]
        for req in drafting:
            req.draft = self._draft(req, self.config)
            req.extend_len += len(req.draft)
        if any(r.draft for r in drafting) and not self.kv.ensure_free_pages(
            self.kv.pages_for(decodes)
        ):
            for req in drafting:
                self._cut(req, 0)
        for req in drafting:
            if req.draft and req.grammar is not None:
                self._constrain(req)

    def _draft(self, req: Req, config: SpeculativeConfig) -> list[int]:
        if req.spec is None:
            req.spec = SpecState(NgramIndex(config))
        index = req.spec.index
        stable = min(len(index.tokens), req.prompt_len + req.sent_len)  # never rewritten
        index.sync(req.ids(stable, req.seq_len), start=stable)
        left = req.params.max_new_tokens - len(req.output_ids)
        room = min(left, self.context_len - req.seq_len) - 1  # the token after the draft
        return req.spec.index.propose(room)

    def _constrain(self, req: Req) -> None:
        """End the draft at the first token the grammar rejects; keep the draft's masks."""
        assert self.grammar is not None and req.spec is not None
        try:
            n, masks = self.grammar.draft_masks(req, req.draft)
        except Exception:  # noqa: BLE001 - decode this request without a draft
            log.exception("the grammar masks of a draft of %s failed", req.rid)
            n, masks = 0, None
        self._cut(req, n)
        req.spec.masks = masks if n else None

    def _cut(self, req: Req, n: int) -> None:
        """Keep the first `n` draft tokens."""
        req.extend_len -= len(req.draft) - n
        req.draft = req.draft[:n]
        if req.spec is not None and not req.draft:
            req.spec.masks = None

    # --- after the forward ------------------------------------------------------------
    def verify(
        self,
        req: Req,
        logits: torch.Tensor,
        *,
        accept: Callable[[Req, int], bool],
        emit: Callable[[Req], None],
    ) -> None:
        """Apply the tokens greedy decoding picks at the draft's positions (`logits`, one
        row per position: after the last token, then after each draft token) while they
        confirm the draft, plus one. `accept(req, token)` applies one token as a decode step
        would (True: the grammar rewrote the output); `emit(req)` sends what a step would
        send between tokens. `req.kv_len` counts the draft's positions on entry."""
        assert req.spec is not None
        draft, req.draft = req.draft, []
        masks, req.spec.masks = req.spec.masks, None
        base = req.kv_len - len(draft)
        i = 0
        try:
            chosen = self._choose(logits, masks)
            agreed = accepted_prefix(draft, chosen)
            while True:
                req.kv_len = base + i  # as decoding would have it before token i
                rewritten = accept(req, chosen[i])
                if rewritten or req.finished is not None or i == agreed:
                    break
                emit(req)
                if req.finished is not None:
                    break
                i += 1
            self._count(req, drafted=len(draft), accepted=min(i + 1, agreed))
        finally:
            self._free(req, base + i, base + len(draft))

    @staticmethod
    def _choose(logits: torch.Tensor, masks: torch.Tensor | None) -> list[int]:
        """The greedy token at every position, under the grammar's masks if any."""
        if masks is not None:
            apply_token_bitmask(logits, masks.to(logits.device, non_blocking=True))
        return list(logits.argmax(dim=-1).tolist())

    def _free(self, req: Req, start: int, end: int) -> None:
        """Return the slots of draft positions [start, end) to the pool."""
        assert req.row is not None
        if end > start:
            self.kv.kv_pool.free(self.kv.req_pool.read(req.row, start, end))
        req.kv_len = min(req.kv_len, start)

    def _count(self, req: Req, *, drafted: int, accepted: int) -> None:
        assert req.spec is not None
        req.spec.drafted += drafted
        req.spec.accepted += accepted
        self.drafted += drafted
        self.accepted += accepted
        self.verified += 1

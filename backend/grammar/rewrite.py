"""What the grammar writes into an output after a sampled token, and what it holds back.

Two rewrites exist. Jump-forward appends the text every continuation must start with,
re-encoding the last few tokens together with it so that the seam is tokenized the way the
model saw text in training (`jump_forward`). Closing completes a structure that is about to
reach the token limit, or takes back what the model wrote since its last look and writes the
completion found then (`closing`). Both replace only tokens that were never emitted: the
last `window - 1` tokens of an output that jump-forward may retokenize, and the tokens after
a closing fallback's look near the limit, are held back from streaming (`req.hold_from`).
"""

from __future__ import annotations

from plait.backend.grammar.closing import Closer
from plait.backend.grammar.hooks import Rewrite
from plait.backend.grammar.jump_forward import Retokenizer
from plait.backend.grammar.matcher import RequestGrammar
from plait.backend.request.req import Req


class Rewriter:
    """The rewrite policy of constrained requests; `jump_forward` is the engine's switch
    (a request turns it off with its own `jump_forward`, or by asking for logprobs)."""

    def __init__(self, *, retokenizer: Retokenizer, jump_forward: bool) -> None:
        self.retokenizer = retokenizer
        self.closer = Closer(retokenizer=retokenizer)
        self.jump_forward = jump_forward

    def after_sample(self, req: Req) -> Rewrite | None:
        """Close or jump forward after the last sampled token; set `req.hold_from`."""
        state: RequestGrammar = req.grammar
        out = req.output_ids
        before, kept, closed = len(out), len(out), False
        if req.finished is None:
            removed = self._close(req, state)
            closed = removed is not None
            if removed is None:
                removed = self._jump(req, state)
            kept -= removed or 0
        if not closed and self._cut(req):  # at the limit inside a structure: the fallback
            at = len(out)
            removed = self._close(req, state)
            closed = removed is not None
            kept = min(kept, at - (removed or 0))
        req.hold_from = self._hold_from(req, state)
        changed = closed or kept < before or len(out) != before
        return Rewrite(kept, closed=closed) if changed else None

    def _closing(self, req: Req) -> bool:
        return req.params.close_on_length and not req.params.return_logprob

    def _jumping(self, req: Req) -> bool:
        p = req.params
        return self.jump_forward and p.jump_forward and not p.return_logprob

    def _cut(self, req: Req) -> bool:
        """The output has reached its token limit without the grammar being complete."""
        reason = req.finished
        if reason is not None:
            return reason.kind == "length" and not reason.closed
        return len(req.output_ids) >= req.params.max_new_tokens

    def _close(self, req: Req, state: RequestGrammar) -> int | None:
        """Complete the output (`close_on_length`); how many trailing tokens the completion
        replaced, or None when nothing was done."""
        if not self._closing(req):
            return None
        out = req.output_ids
        jump = self.closer.plan(
            state.matcher,
            output=out,
            room=req.params.max_new_tokens - len(out),
            state=state.closing,
            is_json=state.is_json,
            cut=self._cut(req),
            sent=max(req.sent_len, state.start),
            start=state.start,
        )
        return jump.removed if jump is not None and state.apply(out, jump) else None

    def _jump(self, req: Req, state: RequestGrammar) -> int | None:
        """Append the forced text; how many trailing tokens were retokenized, or None.
        Only unsent tokens whose KV the request owns (plus the one just sampled) may go, and
        none before a closing fallback's look (the fallback needs them as they were)."""
        if not self._jumping(req):
            return None
        forced = state.forced_text()
        if not forced:
            return None
        out = req.output_ids
        floor = max(req.sent_len, state.start)  # never into the reasoning section
        if state.closing.fallback is not None:  # nor before a closing fallback's look
            floor = max(floor, state.closing.fallback.at)
        rollback = min(len(out) - floor, req.kv_len - req.cached_len + 1)
        tail = out[len(out) - rollback :] if rollback > 0 else []
        plan = self.retokenizer.plan(
            tail=tail, forced=forced, room=req.params.max_new_tokens - len(out)
        )
        return plan.removed if plan is not None and state.apply(out, plan) else None

    def _hold_from(self, req: Req, state: RequestGrammar) -> int | None:
        """The first output token that a later step may still rewrite, or None."""
        holds = []
        if self._jumping(req):
            holds.append(len(req.output_ids) - (self.retokenizer.window - 1))
        fallback = state.closing.fallback
        if fallback is not None and fallback.hold and self._closing(req):
            holds.append(fallback.at)
        return min(holds) if holds else None

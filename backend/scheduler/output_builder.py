"""What the scheduler reports per request: new ids, logprobs, finish, usage."""

from __future__ import annotations

import torch

from plait.backend.request.messages import DetokOptions, ReqOutput
from plait.backend.request.req import FinishReason, Req
from plait.backend.request.stop_conditions import (
    CONTEXT_TOKENS,
    Tail,
    hold_back_chars,
    window_chars,
)
from plait.backend.text.tokenizer import DecodeFn

STOP_TAIL_EXTRA_TOKENS = 4


class OutputBuilder:
    """Collects logprobs as they are computed and turns a request's progress into a
    `ReqOutput` holding only what was not emitted before."""

    def __init__(self, *, decode: DecodeFn) -> None:
        self.decode = decode

    # --- prompt logprobs --------------------------------------------------------------
    def input_logprob_positions(self, req: Req) -> range:
        """Positions in this step's extend whose next-token logprob was asked for."""
        p = req.params
        if not p.return_logprob or p.logprob_start_len < 0 or req.logprobs.input_done:
            return range(0)
        lo = max(req.kv_len, p.logprob_start_len - 1, 0)
        hi = min(req.kv_len + req.extend_len, req.prompt_len - 1)
        return range(lo, max(lo, hi))

    def record_input_logprobs(self, req: Req, logits: torch.Tensor) -> None:
        positions = self.input_logprob_positions(req)
        rec, ids = req.logprobs, req.origin_input_ids
        k = req.params.top_logprobs_num
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        targets = torch.tensor([ids[p + 1] for p in positions], device=logprobs.device)
        chosen = logprobs.gather(1, targets[:, None]).squeeze(1).tolist()
        rec.input.extend(zip(chosen, targets.tolist(), strict=True))
        if k:
            rec.input_top.extend(_topk(row, k) for row in logprobs)

    def mark_input_done(self, req: Req) -> None:
        """After the prompt's last chunk; the first prompt token has no logprob (None)."""
        rec = req.logprobs
        if req.kv_len < req.prompt_len or rec.input_done:
            return
        rec.input_done = True
        if req.params.return_logprob and req.params.logprob_start_len == 0:
            rec.input.insert(0, (None, req.origin_input_ids[0]))
            if req.params.top_logprobs_num:
                rec.input_top.insert(0, None)

    # --- output logprobs --------------------------------------------------------------
    def record_output_logprob(self, req: Req, logprobs: torch.Tensor, token: int) -> None:
        req.logprobs.output.append((float(logprobs[token]), token))
        if req.params.top_logprobs_num:
            req.logprobs.output_top.append(_topk(logprobs, req.params.top_logprobs_num))

    # --- stop strings -----------------------------------------------------------------
    def tail(self, req: Req, *, new_tokens: int = 1) -> Tail | None:
        """The end of the output that can hold a stop ending in its last `new_tokens` tokens,
        after a few tokens of context."""
        params = req.params
        if not (params.stop or params.stop_regex):
            return None
        ids, skip = req.output_ids, params.skip_special_tokens
        # A character can take up to 4 byte-level tokens.
        window = 4 * window_chars(params.stop, params.stop_regex) + STOP_TAIL_EXTRA_TOKENS
        window += new_tokens - 1
        if len(ids) <= window + CONTEXT_TOKENS:
            return Tail(self.decode(ids, skip))
        context = ids[-(window + CONTEXT_TOKENS) : -window]
        text = self.decode(context + ids[-window:], skip)
        return Tail(text, start=len(self.decode(context, skip)))

    # --- emission ---------------------------------------------------------------------
    def emit(self, req: Req) -> ReqOutput:
        """Everything new since the previous emission of `req`."""
        rec = req.logprobs
        send_input = rec.input_done and not rec.input_sent and req.params.logprob_start_len >= 0
        out = ReqOutput(
            rid=req.rid,
            new_ids=req.output_ids[req.sent_len : req.sendable_len()],
            finish=req.finished,
            prompt_tokens=req.prompt_len,
            completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens,
            output_logprobs=rec.output[rec.sent_output :],
            output_top_logprobs=rec.output_top[rec.sent_output :],
            input_logprobs=list(rec.input) if send_input else None,
            input_top_logprobs=list(rec.input_top) if send_input and rec.input_top else None,
            warnings=req.warnings,
            speculation=(req.spec.drafted, req.spec.accepted) if req.spec else None,
            detok_options=None
            if req.emitted
            else DetokOptions(
                skip_special_tokens=req.params.skip_special_tokens,
                hold_chars=hold_back_chars(req.params.stop, req.params.stop_regex),
            ),
        )
        req.emitted = True
        req.sent_len = req.sendable_len()
        req.warnings = ()
        rec.sent_output = len(rec.output)
        rec.input_sent = rec.input_sent or send_input
        return out


def ended(rid: str, reason: FinishReason) -> ReqOutput:
    """A bare final output for a request the scheduler has nothing else to say about (an
    error before it was queued, an abort of an unknown rid); building it cannot fail."""
    return ReqOutput(
        rid=rid,
        new_ids=[],
        finish=reason,
        prompt_tokens=0,
        completion_tokens=0,
        cached_tokens=0,
    )


def _topk(logprobs: torch.Tensor, k: int) -> list[tuple[float, int]]:
    values, ids = torch.topk(logprobs, k)
    return list(zip(values.tolist(), ids.tolist(), strict=True))

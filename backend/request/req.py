"""One sequence being generated, and why it finished."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from plait.backend.cache.radix_cache import TreeNode
from plait.backend.request.checks import RequestError, check_lengths, check_token_ids
from plait.backend.request.sampling_params import SamplingParams
from plait.backend.request.stop_conditions import StopMatch, StopRegexTimeout, Tail, first_stop
from plait.backend.speculative.ngram import SpecState

FinishKind = Literal["stop", "length", "abort", "error"]
INTERNAL_ERROR = "internal error"  # how a failure that is not the client's fault begins


@dataclass(frozen=True)
class FinishReason:
    """Why a request ended: `matched` is the stop token id, the stop string or the stop regex
    that matched, if any; `closed` marks a "length" finish whose constrained output the
    engine completed within the token limit (`close_on_length`). `trim_chars`: characters
    at the end of the output text, from the matched stop string or regex on, that the text
    leaves out (0 with `no_stop_trim`); not part of the public result."""

    kind: FinishKind
    matched: int | str | None = None
    message: str | None = None
    closed: bool = False
    trim_chars: int = 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind}
        if self.matched is not None:
            out["matched"] = self.matched
        if self.message is not None:
            out["message"] = self.message
        if self.closed:
            out["closed"] = True
        return out


@dataclass
class LogprobRecord:
    """Logprobs collected so far; `sent_*` mark what has been emitted to the client."""

    output: list[tuple[float, int]] = field(default_factory=list)
    output_top: list[list[tuple[float, int]]] = field(default_factory=list)
    input: list[tuple[float | None, int]] = field(default_factory=list)
    input_top: list[list[tuple[float, int]] | None] = field(default_factory=list)
    input_done: bool = False
    input_sent: bool = False
    sent_output: int = 0


class Req:
    """A sequence: prompt ids, output ids, sampling params and its KV-cache bookkeeping.

    Memory ownership: positions [0, cached_len) are radix-tree slots locked through
    `last_node`; positions [cached_len, kv_len) are slots this request owns. The last sampled
    token has no KV yet, so a decoding request has kv_len == seq_len - 1.
    """

    def __init__(
        self,
        *,
        rid: str,
        input_ids: list[int],
        params: SamplingParams,
        eos_ids: frozenset[int],
        group: str | None = None,
        arrival: int = 0,
    ) -> None:
        self.rid = rid
        self.origin_input_ids = list(input_ids)
        self.output_ids: list[int] = []
        self.params = params
        self.eos_ids = frozenset() if params.ignore_eos else eos_ids
        self.group = group
        self.arrival = arrival
        self.row: int | None = None
        self.kv_len = 0
        self.cached_len = 0
        self.last_node: TreeNode | None = None
        self.extend_len = 0
        self.cached_tokens = 0
        self.admitted_once = False
        self.deferred_at = -1  # cached length at its last wait for an in-batch prefix
        self.finished: FinishReason | None = None
        self.logprobs = LogprobRecord()
        self.grammar: Any = None
        self.sent_len = 0
        self.hold_from: int | None = None  # output tokens from here on may still change
        self.emitted = False
        self.warnings: tuple[str, ...] = ()
        self.generator: torch.Generator | None = None
        self.draft: list[int] = []  # speculative tokens this step verifies after the sequence
        self.spec: SpecState | None = None  # speculation state of a request that may draft
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)

    # --- lengths -----------------------------------------------------------------------
    @property
    def prompt_len(self) -> int:
        return len(self.origin_input_ids)

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def all_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    def ids(self, start: int, end: int) -> list[int]:
        """Token ids [start, end) of prompt + output without copying the whole sequence."""
        n = self.prompt_len
        if start >= n:
            return self.output_ids[start - n : end - n]
        if end <= n:
            return self.origin_input_ids[start:end]
        return self.origin_input_ids[start:] + self.output_ids[: end - n]

    def will_sample(self) -> bool:
        """Whether this step's extend reaches the end of the sequence (and its draft)."""
        return self.kv_len + self.extend_len == self.seq_len + len(self.draft)

    def match_limit(self) -> int:
        """How many leading tokens may come from the cache: at least the last token is
        recomputed, and prompt positions whose logprobs were asked for are recomputed."""
        limit = self.seq_len - 1
        start = self.params.logprob_start_len
        if self.params.return_logprob and 0 <= start < self.prompt_len and not self.admitted_once:
            limit = min(limit, max(start - 1, 0))
        return limit

    # --- admission ---------------------------------------------------------------------
    def validation_error(self, *, vocab_size: int, context_len: int, pool_size: int) -> str | None:
        """Why this request cannot run on the model and pool at all, or None."""
        try:
            if not self.origin_input_ids:
                raise RequestError("input_ids: the prompt is empty", field="input_ids")
            self.params.check_vocab(vocab_size=vocab_size)
            check_token_ids(self.origin_input_ids, vocab_size=vocab_size)
            check_lengths(
                prompt_len=self.prompt_len,
                max_new_tokens=self.params.max_new_tokens,
                context_len=context_len,
                pool_size=pool_size,
            )
        except Exception as exc:  # noqa: BLE001 - any bad input fails this request only
            return str(exc) or type(exc).__name__
        return None

    # --- sampling helpers --------------------------------------------------------------
    def next_uniform(self) -> float:
        return float(torch.rand(1, generator=self.generator).item())

    def below_min_tokens(self) -> bool:
        return len(self.output_ids) < self.params.min_new_tokens

    def stop_ids_before_min(self) -> list[int]:
        return sorted(self.eos_ids | set(self.params.stop_token_ids))

    def sendable_len(self) -> int:
        """How many output tokens may have been emitted by now: all of them, except those the
        grammar may still rewrite (`hold_from`) while the request runs."""
        if self.finished is not None or self.hold_from is None:
            return len(self.output_ids)
        return max(min(self.hold_from, len(self.output_ids)), self.sent_len)

    # --- finishing ---------------------------------------------------------------------
    def finish(self, reason: FinishReason) -> None:
        if self.finished is None:
            self.finished = reason

    def fail(self, message: str) -> None:
        """End with an error, whatever it was about to finish with (an internal failure
        while handling this request)."""
        self.finished = FinishReason("error", message=message)

    def check_finished(self, *, context_len: int, tail: Tail | None) -> None:
        """Set `finished` from the last output token (EOS, stop ids, stop strings, length)."""
        if self.finished is not None or not self.output_ids:
            return
        last = self.output_ids[-1]
        grammar_done = self.grammar is not None and self.grammar.is_terminated()
        if grammar_done or last in self.eos_ids or last in self.params.stop_token_ids:
            self.finish(FinishReason("stop", last))
        elif tail is not None and (hit := self._stop_in(tail)):
            trim = 0 if self.params.no_stop_trim else len(tail.text) - hit.start
            self.finish(FinishReason("stop", hit.matched, trim_chars=trim))
        elif len(self.output_ids) >= self.params.max_new_tokens or self.seq_len >= context_len:
            self.finish(FinishReason("length"))

    def _stop_in(self, tail: Tail) -> StopMatch | None:
        try:
            return first_stop(tail, self.params.stop, self.params.stop_regex)
        except StopRegexTimeout as exc:
            self.finish(FinishReason("error", message=str(exc)))
            return None

    def __repr__(self) -> str:
        out = len(self.output_ids)
        return f"Req({self.rid!r}, prompt={self.prompt_len}, out={out}, kv={self.kv_len})"

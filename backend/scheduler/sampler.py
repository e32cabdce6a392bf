"""Turn a batch of logits into next tokens: bias, penalties, temperature, top-k/p/min-p, seeds.

Every per-request parameter becomes one tensor row so a step samples the whole batch in a few
vectorized ops. Randomness comes from one uniform per request per step, drawn by the caller
from that request's own generator (`draw_uniforms`), so a seeded request samples the same
tokens alone or in any batch, and a retry never draws again.

A failure that belongs to one row (parameters that do not fit a tensor, a bias or penalty that
cannot be applied, a row the sampling kernel rejects) fails that row alone: `SampleResult.failed`
maps it to its exception and the other rows are sampled as if it were not there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from plait.backend.request.req import Req
from plait.kernels import top_k_top_p_sample

log = logging.getLogger(__name__)


def draw_uniforms(reqs: Sequence[Req]) -> list[float]:
    """This step's uniform of each request (0.0 for greedy ones, which draw nothing)."""
    return [0.0 if r.params.is_greedy else r.next_uniform() for r in reqs]


@dataclass(frozen=True)
class SamplingBatch:
    """Sampling parameters of one step's rows, as tensors (a failed row is sampled greedily
    and its token ignored)."""

    temperatures: torch.Tensor  # [B, 1] float32 (1.0 for greedy rows)
    top_p: torch.Tensor  # [B] float32
    top_k: torch.Tensor  # [B] int64
    min_p: torch.Tensor  # [B] float32
    greedy: torch.Tensor  # [B] bool
    uniforms: torch.Tensor  # [B] float32
    all_greedy: bool

    @classmethod
    def from_reqs(cls, reqs: Sequence[Req | None], uniforms: Sequence[float]) -> SamplingBatch:
        params = [r.params if r is not None else None for r in reqs]
        greedy = [p is None or p.is_greedy for p in params]
        return cls(
            temperatures=torch.tensor(
                [
                    [p.temperature if p is not None and not g else 1.0]
                    for p, g in zip(params, greedy, strict=True)
                ],
                dtype=torch.float32,
            ),
            top_p=torch.tensor(
                [p.top_p if p is not None else 1.0 for p in params], dtype=torch.float32
            ),
            top_k=torch.tensor(
                [p.top_k if p is not None else -1 for p in params], dtype=torch.int64
            ),
            min_p=torch.tensor(
                [p.min_p if p is not None else 0.0 for p in params], dtype=torch.float32
            ),
            greedy=torch.tensor(greedy, dtype=torch.bool),
            uniforms=torch.tensor(
                [0.0 if g else u for u, g in zip(uniforms, greedy, strict=True)],
                dtype=torch.float32,
            ),
            all_greedy=all(greedy),
        )

    def row(self, i: int) -> SamplingBatch:
        """Row i alone."""
        return SamplingBatch(
            temperatures=self.temperatures[i : i + 1],
            top_p=self.top_p[i : i + 1],
            top_k=self.top_k[i : i + 1],
            min_p=self.min_p[i : i + 1],
            greedy=self.greedy[i : i + 1],
            uniforms=self.uniforms[i : i + 1],
            all_greedy=bool(self.greedy[i]),
        )


@dataclass(frozen=True)
class SampleResult:
    """Chosen tokens (-1 for a failed row), raw-model logprobs where asked for, and the
    rows that failed with their exception."""

    token_ids: list[int]
    logprobs: torch.Tensor | None  # [B, V] log_softmax of the raw logits
    failed: dict[int, Exception] = field(default_factory=dict)


class Sampler:
    """Stateless: all state (counts, generators) lives on the requests."""

    def sample(
        self,
        logits: torch.Tensor,
        reqs: Sequence[Req],
        *,
        uniforms: Sequence[float],
        want_logprobs: bool,
    ) -> SampleResult:
        """Sample one token per row of `logits` (float32 [B, V]); masks already applied.
        `uniforms[i]` drives row i's draw (see `draw_uniforms`)."""
        failed: dict[int, Exception] = {}
        batch = self._batch(reqs, uniforms, failed)
        logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
        for row, req in enumerate(reqs):
            if row not in failed:
                _contained(failed, row, self._adjust, logits, row, req)
        tokens = self._choose(logits, batch, failed)
        return SampleResult(tokens, logprobs, failed)

    def _batch(
        self, reqs: Sequence[Req], uniforms: Sequence[float], failed: dict[int, Exception]
    ) -> SamplingBatch:
        """The rows' tensors; a request whose parameters do not fit them fails alone."""
        try:
            return SamplingBatch.from_reqs(reqs, uniforms)
        except Exception:  # noqa: BLE001 - find the rows at fault, sample the others
            log.exception("building the sampling batch failed; checking each request")
        for row, (req, u) in enumerate(zip(reqs, uniforms, strict=True)):
            _contained(failed, row, SamplingBatch.from_reqs, [req], [u])
        rows = [None if i in failed else r for i, r in enumerate(reqs)]
        return SamplingBatch.from_reqs(rows, uniforms)

    def _adjust(self, logits: torch.Tensor, row: int, req: Req) -> None:
        """logit_bias, penalties and the stop ids banned before min_new_tokens, on one row."""
        if req.params.logit_bias:
            self._apply_bias(logits, row, req)
        if req.params.has_penalties:
            self._apply_penalties(logits, row, req)
        if req.below_min_tokens():
            logits[row, req.stop_ids_before_min()] = float("-inf")

    def _choose(
        self, logits: torch.Tensor, batch: SamplingBatch, failed: dict[int, Exception]
    ) -> list[int]:
        """The token of every row; if the batch fails, each row alone (-1 where it fails)."""
        try:
            tokens = self._tokens(logits, batch)
        except Exception:  # noqa: BLE001 - retry row by row to find the ones at fault
            log.exception("sampling the batch failed; sampling each row alone")
        else:
            return [-1 if i in failed else t for i, t in enumerate(tokens)]
        out = []
        for i in range(logits.shape[0]):
            one = _contained(failed, i, self._tokens, logits[i : i + 1], batch.row(i))
            out.append(one[0] if isinstance(one, list) else -1)
        return out

    def _tokens(self, logits: torch.Tensor, batch: SamplingBatch) -> list[int]:
        if batch.all_greedy:
            return list(logits.argmax(dim=-1).tolist())
        probs = torch.softmax(logits / batch.temperatures.to(logits.device), dim=-1)
        sampled = top_k_top_p_sample(
            probs,
            top_k=batch.top_k.to(logits.device),
            top_p=batch.top_p.to(logits.device),
            min_p=batch.min_p.to(logits.device),
            uniforms=batch.uniforms.to(logits.device),
        )
        greedy = batch.greedy.to(logits.device)
        return list(torch.where(greedy, logits.argmax(dim=-1), sampled).tolist())

    def _apply_bias(self, logits: torch.Tensor, row: int, req: Req) -> None:
        """OpenAI's logit_bias: add the request's per-token bias (masked tokens stay -inf)."""
        pairs = req.params.logit_bias
        ids = torch.tensor([t for t, _ in pairs], dtype=torch.int64, device=logits.device)
        bias = torch.tensor([b for _, b in pairs], dtype=logits.dtype, device=logits.device)
        logits[row, ids] += bias

    def _apply_penalties(self, logits: torch.Tensor, row: int, req: Req) -> None:
        """Repetition (HF style, over prompt + output), frequency and presence (over output)."""
        p, vocab = req.params, logits.shape[-1]
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(req.all_ids(), dtype=torch.int64, device=logits.device).unique()
            vals = logits[row, seen]
            logits[row, seen] = torch.where(
                vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty
            )
        if (p.frequency_penalty or p.presence_penalty) and req.output_ids:
            out = torch.tensor(req.output_ids, dtype=torch.int64, device=logits.device)
            counts = torch.bincount(out, minlength=vocab)[:vocab].to(logits.dtype)
            logits[row] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)


def _contained(failed: dict[int, Exception], row: int, work: Callable[..., Any], *args: Any) -> Any:
    """`work(*args)` unless row `row` failed already; an exception becomes its failure."""
    if row in failed:
        return None
    try:
        return work(*args)
    except Exception as exc:  # noqa: BLE001 - one row's failure is that request's alone
        log.exception("sampling row %d failed", row)
        failed[row] = exc
        return None

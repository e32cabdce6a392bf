"""Turn a batch of logits into next tokens: bias, penalties, temperature, top-k/p/min-p, seeds.

Every per-request parameter becomes one tensor row so a step samples the whole batch in a few
vectorized ops. Randomness comes from one uniform per request per step, drawn from that
request's own generator, so a seeded request samples the same tokens alone or in any batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from plait.backend.req import Req
from plait.kernels import top_k_top_p_sample


@dataclass(frozen=True)
class SamplingBatch:
    """Sampling parameters of one step's requests, as tensors."""

    temperatures: torch.Tensor  # [B, 1] float32 (1.0 for greedy rows)
    top_p: torch.Tensor  # [B] float32
    top_k: torch.Tensor  # [B] int64
    min_p: torch.Tensor  # [B] float32
    greedy: torch.Tensor  # [B] bool
    uniforms: torch.Tensor  # [B] float32
    all_greedy: bool
    penalized: list[int]  # rows with repetition/frequency/presence penalties
    biased: list[int]  # rows with a logit_bias
    banned: list[tuple[int, list[int]]]  # (row, token ids) masked before min_new_tokens

    @classmethod
    def from_reqs(cls, reqs: Sequence[Req]) -> SamplingBatch:
        params = [r.params for r in reqs]
        greedy = [p.is_greedy for p in params]
        return cls(
            temperatures=torch.tensor(
                [[1.0 if g else p.temperature] for p, g in zip(params, greedy, strict=True)]
            ),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.int64),
            min_p=torch.tensor([p.min_p for p in params], dtype=torch.float32),
            greedy=torch.tensor(greedy, dtype=torch.bool),
            uniforms=torch.tensor(
                [0.0 if g else r.next_uniform() for r, g in zip(reqs, greedy, strict=True)]
            ),
            all_greedy=all(greedy),
            penalized=[i for i, p in enumerate(params) if p.has_penalties],
            biased=[i for i, p in enumerate(params) if p.logit_bias],
            banned=[
                (i, r.stop_ids_before_min()) for i, r in enumerate(reqs) if r.below_min_tokens()
            ],
        )


@dataclass(frozen=True)
class SampleResult:
    """Chosen tokens, and raw-model logprobs where asked for."""

    token_ids: list[int]
    logprobs: torch.Tensor | None  # [B, V] log_softmax of the raw logits


class Sampler:
    """Stateless: all state (counts, generators) lives on the requests."""

    def sample(
        self, logits: torch.Tensor, reqs: Sequence[Req], *, want_logprobs: bool
    ) -> SampleResult:
        """Sample one token per row of `logits` (float32 [B, V]); masks already applied."""
        batch = SamplingBatch.from_reqs(reqs)
        logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
        self._apply_bias(logits, reqs, batch.biased)
        self._apply_penalties(logits, reqs, batch.penalized)
        for row, ids in batch.banned:
            logits[row, ids] = float("-inf")
        if batch.all_greedy:
            return SampleResult(logits.argmax(dim=-1).tolist(), logprobs)
        probs = torch.softmax(logits / batch.temperatures.to(logits.device), dim=-1)
        sampled = top_k_top_p_sample(
            probs,
            top_k=batch.top_k.to(logits.device),
            top_p=batch.top_p.to(logits.device),
            min_p=batch.min_p.to(logits.device),
            uniforms=batch.uniforms.to(logits.device),
        )
        greedy = batch.greedy.to(logits.device)
        tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
        return SampleResult(tokens.tolist(), logprobs)

    def _apply_bias(self, logits: torch.Tensor, reqs: Sequence[Req], rows: list[int]) -> None:
        """OpenAI's logit_bias: add each request's per-token bias (masked tokens stay -inf)."""
        for row in rows:
            pairs = reqs[row].params.logit_bias
            ids = torch.tensor([t for t, _ in pairs], dtype=torch.int64, device=logits.device)
            bias = torch.tensor([b for _, b in pairs], dtype=logits.dtype, device=logits.device)
            logits[row, ids] += bias

    def _apply_penalties(self, logits: torch.Tensor, reqs: Sequence[Req], rows: list[int]) -> None:
        """Repetition (HF style, over prompt + output), frequency and presence (over output)."""
        if not rows:
            return
        vocab = logits.shape[-1]
        for row in rows:
            req, p = reqs[row], reqs[row].params
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

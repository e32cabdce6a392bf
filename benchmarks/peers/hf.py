"""Hugging Face transformers baseline: what a user writes by hand.

Batched `model.generate` with left padding and greedy decoding (`min_new_tokens` equal to
`max_new_tokens`, so every request produces exactly the tokens plait produces), and `select`
by scoring each choice with one forward pass over prompt + choice (mean logprob of the
choice's tokens, plait's default `token_length_normalized`). Nothing is shared between calls.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch

from plait.backend.model.builtin import resolve_model_path

OnDone = Callable[[Sequence[int]], None]
HF_BATCH = 16


class HFPeer:
    """The benchmark model in transformers, float32 on the CPU, one thread."""

    def __init__(self, model: str, *, batch_size: int = HF_BATCH) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = resolve_model_path(model)
        self.model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.tokenizer: Any = AutoTokenizer.from_pretrained(path)
        self.pad_id = int(self.tokenizer.pad_token_id or 0)
        self.batch_size = batch_size
        self.work: Counter[str] = Counter()  # tokens through the model, for the report

    def encode(self, text: str, *, special: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=special))

    def count(self, text: str) -> int:
        return len(self.encode(text, special=False))

    def generate(
        self, prompts: Sequence[str], new_tokens: Sequence[int], on_done: OnDone | None = None
    ) -> list[str]:
        """Greedy text of `new_tokens[i]` tokens after each prompt, `batch_size` at a time.
        A batch decodes as many steps as its longest request (static batching)."""
        out: list[str] = []
        for lo in range(0, len(prompts), self.batch_size):
            hi = min(lo + self.batch_size, len(prompts))
            out += self._generate_batch(list(prompts[lo:hi]), list(new_tokens[lo:hi]))
            if on_done is not None:
                on_done(range(lo, hi))
        return out

    @torch.inference_mode()
    def _generate_batch(self, prompts: list[str], new_tokens: list[int]) -> list[str]:
        ids, mask = self._left_pad([self.encode(p) for p in prompts])
        steps = max(new_tokens)
        self.work["decode_tokens"] += steps * len(prompts)
        gen = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            pad_token_id=self.pad_id,
        )[:, ids.shape[1] :]
        return [
            self.tokenizer.decode(row[:n].tolist()) for row, n in zip(gen, new_tokens, strict=True)
        ]

    def _left_pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        self.work["prefill_tokens"] += sum(len(r) for r in rows)
        self.work["padded_prefill_tokens"] += width * len(rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row) :] = torch.tensor(row)
            mask[i, width - len(row) :] = 1
        return ids, mask

    def select(
        self, items: Sequence[tuple[str, Sequence[str]]], on_done: OnDone | None = None
    ) -> list[int]:
        """Index of the best choice of each (prefix, choices), whole items per forward
        (about `batch_size` sequences each)."""
        per = max(1, self.batch_size // max(len(c) for _, c in items))
        picks: list[int] = []
        for lo in range(0, len(items), per):
            hi = min(lo + per, len(items))
            picks += self._select_batch(items[lo:hi])
            if on_done is not None:
                on_done(range(lo, hi))
        return picks

    @torch.inference_mode()
    def _select_batch(self, items: Sequence[tuple[str, Sequence[str]]]) -> list[int]:
        rows, spans = [], []
        for prefix, choices in items:
            head = self.encode(prefix)
            for choice in choices:
                tail = self.encode(choice, special=False)
                rows.append(head + tail)
                spans.append(len(tail))
        scores = self._choice_scores(rows, spans)
        picks, at = [], 0
        for _, choices in items:
            picks.append(int(torch.tensor(scores[at : at + len(choices)]).argmax()))
            at += len(choices)
        return picks

    def _choice_scores(self, rows: list[list[int]], spans: list[int]) -> list[float]:
        """Mean logprob of the last `spans[i]` tokens of each row (left-padded batch)."""
        ids, mask = self._left_pad(rows)
        keep = max(spans) + 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep
        ).logits
        logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        targets = ids[:, -keep + 1 :]
        picked = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return [float(picked[i, -n:].mean()) for i, n in enumerate(spans)]

"""Shared test helpers: small engines on plait-tiny."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from plait.backend.engine.engine import Engine
from plait.backend.model.forward_batch import ForwardBatch
from plait.backend.model.quantized import QuantLinear
from plait.backend.model.runner import ModelRunner
from plait.kernels.native_weight import NativeWeight

TEST_KV_TOKENS = 16384


def tiny_engine(**config: Any) -> Engine:
    """plait-tiny with a small KV pool and integrity checks after every step."""
    config.setdefault("kv_tokens", TEST_KV_TOKENS)
    config.setdefault("num_threads", 1)
    config.setdefault("check_integrity", True)
    return Engine("plait-tiny", **config)


def greedy(max_new_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"max_new_tokens": max_new_tokens, "temperature": 0.0, **extra}


def forward_logits(runner: ModelRunner, reqs: list[tuple[int, list[int], int]]) -> torch.Tensor:
    """One forward: (row, token ids, prefix length) per request; logits of every token."""
    kv, table = runner.kv_pool, runner.req_pool.table
    ids: list[int] = []
    slots = []
    for row, toks, prefix in reqs:
        s = kv.allocate_pages(len(toks))
        table[row, prefix : prefix + len(toks)] = s.to(torch.int32)
        ids.extend(toks)
        slots.append(s)
    fb = ForwardBatch.build(
        input_ids=ids,
        out_slots=torch.cat(slots),
        req_rows=[r for r, _, _ in reqs],
        prefix_lens=[p for _, _, p in reqs],
        extend_lens=[len(t) for _, t, _ in reqs],
        logit_indices=list(range(len(ids))),
        req_to_token=table,
    )
    return runner.forward(fb)


@torch.no_grad()
def assert_hf_greedy(model: Any, ids: list[int], generated: list[int]) -> None:
    """transformers' argmax after every prefix of `generated` is its next token: by induction
    its greedy decode of `ids` yields exactly `generated` (one forward, not one per token)."""
    logits = model(torch.tensor([ids + generated])).logits[0]
    argmax = logits[len(ids) - 1 : -1].argmax(-1).tolist()
    steps = zip(argmax, generated, strict=True)
    first = next((i for i, (a, b) in enumerate(steps) if a != b), None)
    assert first is None, f"diverged at step {first}: {argmax[first]} vs {generated[first]}"


def assert_x_bits(model: torch.nn.Module, bits: int) -> None:
    """Every linear weight of `model` is packed natively and quantizes x to `bits`."""
    weights = [m.qweight for m in model.modules() if isinstance(m, QuantLinear)]
    assert weights and all(isinstance(w, NativeWeight) and w.x_bits == bits for w in weights)


def hf_gguf_model(path: Path) -> Any:
    """transformers' float32 model from the GGUF file at `path` (the parity reference)."""
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    return model.eval()


def hf_gguf_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """transformers' tokenizer from the GGUF file at `path`."""
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def native_bound(
    x: torch.Tensor, dense: torch.Tensor, terms: torch.Tensor, *, span: int = 32
) -> torch.Tensor:
    """Per-output bound on |C quantized matmul - x @ dense^T| for x [m, k] and the weight's
    dense values [n, k]: x is held per group of 32 within dx / 256 (dx = max|x| / 127 over the
    group's `span`, 256 for a weight with K-quant parts; two int8 parts), everything after that
    is exact in integers but for fp32 rounding, bounded by 2^-18 * |x| @ terms^T with `terms`
    [n, k] the weight's |s (q - zero)| + |m|."""
    m, k = x.shape
    dx = x.double().view(m, k // span, span).abs().amax(-1) / (127 * 256)
    dx = dx.repeat_interleave(span // 32, dim=1)
    wabs = dense.double().abs().view(dense.shape[0], k // 32, 32).sum(-1)
    return dx @ wabs.T + 2.0**-18 * (x.double().abs() @ terms.double().T) + 1e-30

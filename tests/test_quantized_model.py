"""Quantized layers in the model: packed GGUF weights, `--quantization int8|int4`, memory."""

from __future__ import annotations

import pytest
import torch

from helpers import forward_logits
from plait.backend.config import EngineConfig
from plait.backend.model.builtin import resolve_model_path
from plait.backend.model.config import ModelConfig, Rope
from plait.backend.model.layers import CausalLM
from plait.backend.model.quantized import (
    LogicalQuant,
    QuantEmbedding,
    QuantLinear,
    pack_merged,
    quantize_model,
    weight_bytes,
)
from plait.backend.model.runner import ModelRunner

IDS = list(range(3, 40))


def logical(rows: int, *, four_bit: bool, group: int, mins: bool, seed: int) -> LogicalQuant:
    gen = torch.Generator().manual_seed(seed)
    if four_bit:
        codes = torch.randint(0, 16, (rows, 64), generator=gen, dtype=torch.uint8)
    else:
        codes = torch.randint(-32, 32, (rows, 64), generator=gen).to(torch.int8)
    scales = torch.rand(rows, 64 // group, generator=gen).half().float()
    low = -torch.rand(rows, 64 // group, generator=gen).half().float() if mins else None
    return LogicalQuant(codes, scales, low, group)


def dense(part: LogicalQuant) -> torch.Tensor:
    rows = part.codes.shape[0]
    values = part.codes.float().reshape(rows, -1, part.group) * part.scales.unsqueeze(-1)
    if part.mins is not None:
        values = values + part.mins.unsqueeze(-1)
    return values.reshape(rows, -1)


def test_merging_parts_of_different_kinds_is_exact() -> None:
    q4k = logical(24, four_bit=True, group=32, mins=True, seed=1)  # like Q4_K
    q6k = logical(8, four_bit=False, group=16, mins=False, seed=2)  # like Q6_K
    same = logical(8, four_bit=True, group=32, mins=True, seed=3)
    merged = pack_merged([q4k, q6k])
    assert (merged.bits, merged.group) == (8, 16)
    assert torch.equal(merged.dequantize(), torch.cat([dense(q4k), dense(q6k)]))
    kept = pack_merged([q4k, same])
    assert (kept.bits, kept.group) == (4, 32)
    assert torch.equal(kept.dequantize(), torch.cat([dense(q4k), dense(same)]))


# Measured on plait-tiny (random weights, logits of mean magnitude 1.5): int8 max error 0.10,
# argmax agreement 100%; int4 max 1.34, mean 0.34, agreement 65% (random Gaussian weights
# lose far more to 4 bits than trained ones).
@pytest.mark.parametrize(
    ("mode", "bits", "atol", "agree"), [("int8", 8, 0.3, 0.9), ("int4", 4, 3.0, 0.5)]
)
def test_quantization_flag_packs_every_linear_layer(
    mode: str, bits: int, atol: float, agree: float
) -> None:
    def runner(quantization: str) -> ModelRunner:
        config = EngineConfig(model="plait-tiny", kv_tokens=512, quantization=quantization)
        return ModelRunner(config)

    full, small = runner("none"), runner(mode)
    linears = [m for m in small.model.modules() if isinstance(m, torch.nn.Linear)]
    packed = [m for m in small.model.modules() if isinstance(m, QuantLinear)]
    assert not linears and len(packed) == 4 * full.model.cfg.num_layers + 1
    assert all(part.kind == f"int{bits}" for m in packed for part in m.qweight.parts)
    ratio = sum(m.qweight.nbytes for m in packed) / sum(
        4 * m.qweight.n * m.qweight.k for m in packed
    )
    assert ratio < (9.5 if bits == 8 else 6.5) / 32, ratio  # bits per weight, scales included
    assert weight_bytes(small.model) < weight_bytes(full.model) * (0.6 if bits == 8 else 0.5)
    ref, out = forward_logits(full, [(0, IDS, 0)]), forward_logits(small, [(0, IDS, 0)])
    assert float((out - ref).abs().max()) < atol
    assert (out.argmax(-1) == ref.argmax(-1)).float().mean() >= agree


def test_a_tied_embedding_is_quantized_once_and_shared_with_the_head() -> None:
    cfg = ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=96, hidden_size=64, intermediate_size=128,
        num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope=Rope(theta=10000.0), tie_word_embeddings=True,
    )  # fmt: skip
    model = CausalLM(cfg)
    weight = model.embed_tokens.weight.detach().clone()
    quantize_model(model, bits=8)
    embed, head = model.embed_tokens, model.lm_head
    assert isinstance(embed, QuantEmbedding) and isinstance(head, QuantLinear)
    assert embed.qweight is head.qweight
    looked_up = embed(torch.tensor([5, 7]))
    assert torch.allclose(looked_up, weight[[5, 7]], atol=float(weight.abs().max()) / 100)


@pytest.mark.real_model
def test_the_real_model_keeps_its_gguf_size_in_memory() -> None:
    path = resolve_model_path("smollm2-135m")
    runner = ModelRunner(EngineConfig(model=str(path), kv_tokens=256))
    packed = [m for m in runner.model.modules() if isinstance(m, QuantLinear)]
    assert len(packed) == 4 * 30 + 1 and isinstance(runner.model.embed_tokens, QuantEmbedding)
    ratio = weight_bytes(runner.model) / path.stat().st_size
    assert ratio < 1.3, ratio  # measured 1.00: Q4_1 and Q8_0 packed at their file size

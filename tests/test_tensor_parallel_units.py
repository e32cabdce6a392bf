"""Tensor parallelism's pieces without processes: which slice each rank holds, and that the
sharded weights are exactly those slices of the full ones."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from plait.backend.model.config import ModelConfig, Rope
from plait.backend.model.quantized import QuantLinear
from plait.backend.parallel.plan import plan_shards
from plait.backend.parallel.shard import qkv_rows, slice_linear, slice_quant
from plait.kernels.quant_weight import quantize_weight

SMOLLM2 = ModelConfig(
    architecture="LlamaForCausalLM", vocab_size=49152, hidden_size=576, intermediate_size=1536,
    num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, max_position_embeddings=8192,
    rms_norm_eps=1e-5, rope=Rope(theta=1e5), tie_word_embeddings=True,
)  # fmt: skip


def test_smollm2_splits_by_kv_groups_unevenly() -> None:
    r0, r1 = (plan_shards(SMOLLM2, rank=r, world=2, inter_align=32) for r in (0, 1))
    assert (r0.heads, r0.kv_heads, r1.heads, r1.kv_heads) == ((0, 6), (0, 2), (6, 9), (2, 3))
    assert (r0.inter, r1.inter) == ((0, 768), (768, 1536))
    assert (r0.vocab, r1.vocab, r0.vocab_sizes) == ((0, 24576), (24576, 49152), (24576, 24576))
    local = r1.local_config(SMOLLM2)
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size) == (3, 1, 768)
    assert local.vocab_size == SMOLLM2.vocab_size and local.head_dim == 64


def test_fewer_kv_heads_than_ranks_replicates_them() -> None:
    cfg = replace(SMOLLM2, num_heads=4, num_kv_heads=2)
    plans = [plan_shards(cfg, rank=r, world=4) for r in range(4)]
    assert [p.heads for p in plans] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert [p.kv_heads for p in plans] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    with pytest.raises(ValueError, match="replicated"):
        plan_shards(replace(SMOLLM2, num_heads=3, num_kv_heads=1), rank=0, world=2)


def test_intermediate_and_vocab_cuts_are_aligned() -> None:
    cfg = replace(SMOLLM2, intermediate_size=800, vocab_size=1000)
    plans = [plan_shards(cfg, rank=r, world=2, inter_align=64) for r in (0, 1)]
    assert [p.inter for p in plans] == [(0, 448), (448, 800)]
    assert [p.vocab for p in plans] == [(0, 512), (512, 1000)]
    assert plans[0].vocab_sizes == (512, 488)


def test_qkv_rows_pick_the_heads_and_their_kv_heads() -> None:
    plan = plan_shards(SMOLLM2, rank=1, world=2)
    q, kv = SMOLLM2.q_size, SMOLLM2.kv_size
    assert qkv_rows(SMOLLM2, plan) == [(384, 576), (q + 128, q + 192), (q + kv + 128, q + kv + 192)]


@pytest.mark.parametrize("bits", [4, 8])
def test_slice_quant_is_exactly_the_slice(bits: int) -> None:
    torch.manual_seed(0)
    w = quantize_weight(torch.randn(70, 256), bits=bits, group=32)
    rows, cols = [(0, 16), (37, 70)], (64, 192)
    part = slice_quant(w, rows=rows, cols=cols)
    full = w.dequantize()
    want = torch.cat([full[a:b] for a, b in rows])[:, cols[0] : cols[1]]
    assert (part.n, part.k) == (49, 128)
    assert torch.equal(part.dequantize(), want)
    with pytest.raises(ValueError, match="groups"):
        slice_quant(w, cols=(16, 64))


def test_slice_linear_keeps_rows_columns_and_bias() -> None:
    torch.manual_seed(0)
    dense = nn.Linear(64, 48, bias=True)
    cut = slice_linear(dense, rows=[(8, 16), (40, 48)])
    assert isinstance(cut, nn.Linear) and cut.bias is not None
    assert torch.equal(cut.weight, torch.cat([dense.weight[8:16], dense.weight[40:48]]))
    assert torch.equal(cut.bias, torch.cat([dense.bias[8:16], dense.bias[40:48]]))
    cols = slice_linear(dense, cols=(32, 64), bias=False)
    assert isinstance(cols, nn.Linear) and cols.bias is None
    assert torch.equal(cols.weight, dense.weight[:, 32:64])
    packed = QuantLinear(quantize_weight(dense.weight.detach(), bits=8, group=32))
    qcut = slice_linear(packed, cols=(32, 64))
    assert isinstance(qcut, QuantLinear)
    assert torch.equal(qcut.qweight.dequantize(), packed.qweight.dequantize()[:, 32:64])

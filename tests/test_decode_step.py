"""The fused CPU decode step (kernels/_step_native.py, backend/model/fused_decode.py) against the
layer-by-layer path: logits, the K/V it writes, batch and thread invariance, unwritten slots,
bounds checks, and the fallback without a C compiler."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import plait.kernels._step_native as step_native
from helpers import assert_x_bits, greedy, tiny_engine
from plait.backend.config import EngineConfig
from plait.backend.engine.engine import Engine
from plait.backend.host import MAX_DEFAULT_THREADS, default_threads
from plait.backend.model.forward_batch import ForwardBatch
from plait.backend.model.fused_decode import FusedDecode
from plait.backend.model.runner import ModelRunner

# Largest |fused - layer by layer| measured on plait-tiny over 6 ragged decode steps (fp32
# both ways; logits of mean magnitude 1.5, the top two at least 0.07 apart): logits 6.2e-4
# (int8) and 2.2e-3 (int4); K and V rows 1.8e-5 (int8) and 5.6e-5 (int4), of magnitude ~1.
# The paths round RMSNorm's sum and silu's exp differently (1 ulp); the matmuls quantize their
# input to int16 per group, where an ulp can move a value by one step (2^-15 of the group's
# largest), and 4 layers carry that on. Stated tolerances: about 5x the measurements.
LOGIT_ATOL = 1e-2
KV_ATOL = 3e-4
# With one-byte x (activation_bits 8), over 4 x 3 such steps: |fused - layer by layer| at
# most 9.0e-5 (int4), and 0.27-0.31 from two-byte x's logits (x rounded to 1/127 of its
# group's largest instead of 1/32768). Stated: the same tolerance, and 5x the gap.
X8_GAP = 1.5


@dataclasses.dataclass
class Seq:
    """One request of a hand-built batch: its table row, tokens and KV slots."""

    row: int
    ids: list[int]
    slots: list[int] = dataclasses.field(default_factory=list)


def make_runner(quantization: str, page_size: int = 1, **config: Any) -> ModelRunner:
    return ModelRunner(
        EngineConfig(
            model="plait-tiny",
            kv_tokens=2048,
            page_size=page_size,
            quantization=quantization,
            num_threads=1,
            **config,
        )
    )


def batch_for(runner: ModelRunner, seqs: list[Seq], new: list[list[int]]) -> ForwardBatch:
    """Allocate slots for each request's new tokens and build the batch (logits of all)."""
    kv, table = runner.kv_pool, runner.req_pool.table
    ids, slots = [], []
    for seq, toks in zip(seqs, new, strict=True):
        last = seq.slots[-1] if seq.slots else 0
        got = kv.allocate_extend(prefix_len=len(seq.slots), extend_len=len(toks), last_slot=last)
        table[seq.row, len(seq.slots) : len(seq.slots) + len(toks)] = got.to(torch.int32)
        ids += toks
        slots.append(got)
    fb = ForwardBatch.build(
        input_ids=ids,
        out_slots=torch.cat(slots),
        req_rows=[s.row for s in seqs],
        prefix_lens=[len(s.slots) for s in seqs],
        extend_lens=[len(t) for t in new],
        logit_indices=list(range(len(ids))),
        req_to_token=table,
    )
    for seq, toks, got in zip(seqs, new, slots, strict=True):
        seq.ids += toks
        seq.slots += got.tolist()
    return fb


def prefill(runner: ModelRunner, lens: list[int], seed: int = 0) -> list[Seq]:
    """Requests of the given prompt lengths, prefilled layer by layer."""
    gen = torch.Generator().manual_seed(seed)
    seqs = [Seq(row=2 * i + 1, ids=[]) for i in range(len(lens))]
    for seq, n in zip(seqs, lens, strict=True):  # one at a time: long extends go first
        runner.forward(
            batch_for(runner, [seq], [torch.randint(3, 250, (n,), generator=gen).tolist()])
        )
    return seqs


def both_ways(runner: ModelRunner, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Logits of `fb` layer by layer and fused, and the K/V rows each wrote."""
    fused = runner.fused
    assert fused is not None and fused.applies(fb, runner.kv_pool)
    slots = fb.out_slots
    runner.fused = None
    try:
        ref = runner.forward(fb)
        ref_kv = (runner.kv_pool.k[:, slots].clone(), runner.kv_pool.v[:, slots].clone())
    finally:
        runner.fused = fused
    runner.kv_pool.k[:, slots] = float("nan")  # the fused step must write every one
    runner.kv_pool.v[:, slots] = float("nan")
    out = runner.forward(fb)
    kv = (runner.kv_pool.k[:, slots], runner.kv_pool.v[:, slots])
    return ref, out, (ref_kv, kv)


@pytest.fixture(
    scope="module", params=[("int8", 16), ("int4", 16), ("int4", 8)], ids=["int8", "int4", "x8"]
)
def runner(request: pytest.FixtureRequest) -> Iterator[ModelRunner]:
    quantization, bits = request.param
    runner = make_runner(quantization, activation_bits=bits)
    assert runner.fused_decode == "on"
    yield runner


def assert_close(ref: torch.Tensor, out: torch.Tensor, kv: Any) -> None:
    (ref_k, ref_v), (k, v) = kv
    assert float((out - ref).abs().max()) < LOGIT_ATOL
    assert torch.equal(out.argmax(-1), ref.argmax(-1))
    assert float((k - ref_k).abs().max()) < KV_ATOL and float((v - ref_v).abs().max()) < KV_ATOL


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_fused_matches_layer_by_layer_on_ragged_batches(quantization: str, page_size: int) -> None:
    """Requests of different lengths decode one token each, one of them three (jump-forward
    tokens attend as decode queries): logits, greedy tokens and the K/V written agree."""
    runner = make_runner(quantization, page_size)
    seqs = prefill(runner, [1, 7, 30, 64, 5], seed=page_size)
    for step in range(3):
        new = [[10 + step + i] for i in range(len(seqs))]
        new[2] = [40, 41, 42]
        assert_close(*both_ways(runner, batch_for(runner, seqs, new)))


def test_batch_and_thread_invariance(runner: ModelRunner) -> None:
    """A request's logits are bit for bit the same alone, in a batch of 8 of different
    lengths, and over 1, 2 or 3 threads."""
    seqs = prefill(runner, [9, 3, 50, 17, 1, 33, 70, 12], seed=3)
    full = batch_for(runner, seqs, [[99 - i] for i in range(8)])
    alone = ForwardBatch.build(  # request 2's token by itself, at the same position and slot
        input_ids=[97],
        out_slots=full.out_slots[2:3],
        req_rows=[seqs[2].row],
        prefix_lens=[len(seqs[2].slots) - 1],
        extend_lens=[1],
        logit_indices=[0],
        req_to_token=full.req_to_token,
    )
    want = runner.forward(alone)
    assert torch.equal(runner.forward(full)[2], want[0])
    fused = runner.fused
    assert fused is not None
    h = runner.model.embed_tokens(full.input_ids)
    outs = [
        fused.step.run(
            h,
            positions=full.positions,
            out_slots=full.out_slots,
            rows=full.decode_rows,
            seq_lens=full.decode_seq_lens,
            req_to_token=full.req_to_token,
            logit_indices=full.logit_indices,
            threads=threads,
        ).clone()
        for threads in (1, 2, 3)
    ]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@pytest.mark.parametrize("page_size", [1, 4])
def test_unwritten_slots_are_never_read(page_size: int) -> None:
    """Every slot that holds no token is NaN: the fused step's logits stay finite and equal
    the layer-by-layer ones (pages are filled partly, so a page's unused slots are NaN)."""
    runner = make_runner("int8", page_size)
    runner.kv_pool.k[:, page_size:] = float("nan")
    runner.kv_pool.v[:, page_size:] = float("nan")
    seqs = prefill(runner, [3, 6, 21], seed=7)
    for step in range(2):
        ref, out, kv = both_ways(runner, batch_for(runner, seqs, [[5 + step]] * 3))
        assert torch.isfinite(out).all()
        assert_close(ref, out, kv)


def test_window_and_qkv_bias() -> None:
    """A sliding window (Mistral) and a qkv bias (Qwen2) are taken as the layers take them."""
    runner = make_runner("int4")
    model = runner.model
    cfg = dataclasses.replace(model.cfg, sliding_window=6)
    model.cfg = cfg
    gen = torch.Generator().manual_seed(1)
    for layer in model.layers:
        layer.self_attn.cfg, layer.self_attn.window = cfg, cfg.window(0)
        qkv = layer.self_attn.qkv_proj
        qkv.bias = torch.nn.Parameter(torch.randn(qkv.out_features, generator=gen) / 4)
    built = FusedDecode.build(model, runner.kv_pool)
    assert isinstance(built, FusedDecode)
    runner.fused = built
    seqs = prefill(runner, [4, 20, 9], seed=2)
    assert_close(*both_ways(runner, batch_for(runner, seqs, [[7], [8, 9], [10]])))


def rejected(runner: ModelRunner, fb: ForwardBatch, match: str) -> None:
    before = runner.kv_pool.k.clone()
    with pytest.raises(ValueError, match=match):
        runner.forward(fb)
    assert torch.equal(runner.kv_pool.k.nan_to_num(), before.nan_to_num())  # nothing written


def test_indices_are_checked_before_anything_is_written(runner: ModelRunner) -> None:
    seqs = prefill(runner, [4, 8], seed=5)
    fb = batch_for(runner, seqs, [[1], [2]])
    table = fb.req_to_token
    big = torch.tensor([0, 10**6])
    cases = {
        "positions": dataclasses.replace(fb, positions=fb.positions + runner.context_len * 2),
        "out_slots": dataclasses.replace(fb, out_slots=big),
        "decode rows": dataclasses.replace(fb, decode_rows=big),
        "decode seq_lens": dataclasses.replace(fb, decode_seq_lens=big),
        "logit_indices": dataclasses.replace(fb, logit_indices=torch.tensor([0, 2])),
    }
    for match, bad in cases.items():
        rejected(runner, bad, match)
    row, pos = seqs[1].row, len(seqs[1].slots) - 3
    saved = int(table[row, pos])
    table[row, pos] = runner.kv_pool.k.shape[1]  # one past the pool
    try:
        rejected(runner, fb, "outside the pool")
    finally:
        table[row, pos] = saved
    with pytest.raises(ValueError, match="entries"):
        runner.forward(dataclasses.replace(fb, out_slots=fb.out_slots[:1]))


def test_fallback_without_a_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the C library (no compiler) or with fused_decode=False the model runs layer by
    layer, with the same results."""
    monkeypatch.setattr(step_native, "load_native", lambda name: None)
    runner = make_runner("int8")
    assert runner.fused_decode.startswith("off (the C kernels") and runner.fused is None
    seqs = prefill(runner, [5], seed=1)
    assert runner.forward(batch_for(runner, seqs, [[3]])).isfinite().all()
    monkeypatch.undo()
    off = make_runner("int8", fused_decode=False)
    assert off.fused_decode == "off (fused_decode=False)" and off.fused is None
    assert make_runner("none").fused_decode.startswith("off (every linear layer")


def test_one_byte_activations_reach_every_matmul() -> None:
    """activation_bits 8 packs every linear layer's weight for one-byte x (the packed tensors
    shared), and the fused step and the layer-by-layer path both take it: their logits agree
    as two-byte x's do, and differ from two-byte x's by about the rounding of x."""
    runners = {bits: make_runner("int4", activation_bits=bits) for bits in (16, 8)}
    for bits, runner in runners.items():
        assert_x_bits(runner.model, bits)
    logits = {}
    for bits, runner in runners.items():
        seqs = prefill(runner, [4, 19, 33], seed=5)
        ref, out, _ = both_ways(runner, batch_for(runner, seqs, [[7], [8], [9]]))
        assert float((out - ref).abs().max()) < LOGIT_ATOL
        logits[bits] = out
    gap = float((logits[8] - logits[16]).abs().max())
    assert 0.01 < gap < X8_GAP, gap


@pytest.mark.parametrize("bits", [0, 4, 32])
def test_other_activation_bits_are_refused(bits: int) -> None:
    with pytest.raises(ValueError, match="activation_bits must be one of"):
        EngineConfig(activation_bits=bits)


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_engine_greedy_tokens_fused_or_not(quantization: str) -> None:
    """Greedy generation through the engine: the same tokens with and without the fused step,
    each prompt alone and all eight (of different lengths) in one batch."""
    prompts = [[5 + i] * (1 + 7 * i) for i in range(8)]
    outputs = []
    for fused in (True, False):
        with tiny_engine(quantization=quantization, fused_decode=fused) as engine:
            batch = engine.generate(input_ids=prompts, sampling_params=greedy(12))
            alone = engine.generate(input_ids=prompts[3], sampling_params=greedy(12))
        outputs.append([o["output_ids"] for o in batch])
        assert alone["output_ids"] == outputs[-1][3]
    assert outputs[0] == outputs[1]


# 4 prompts and 16 greedy decode steps, |fused - layer by layer| (model: logits, K/V rows):
# SmolLM2-135M (Q4_1 layers, logits of order 10-30, mean magnitude 6): at most 9.3e-3 for
# logits, 4.2e-3 for K/V rows (of magnitude up to 17); the quantized matmuls' own error
# against transformers is 1.9e-2. Gemma 3 270M (Q4_K/Q5_0/Q6_K/Q8_0, sandwich norms, GeGLU,
# q/k norms, sliding and global layers; logits of mean magnitude 6.4): 1.45e-2 for logits,
# 1.7e-2 for K/V rows (of magnitude up to 74). Stated: about 3-5x.
REAL_ATOL = {"smollm2-135m": (0.05, 0.02), "gemma3-270m": (0.05, 0.08)}
REAL_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village,",
    "1, 2, 3, 5, 8, 13,",
]


@pytest.mark.real_model
@pytest.mark.parametrize("model", sorted(REAL_ATOL))
def test_real_model_fused_matches_layer_by_layer(model: str) -> None:
    from plait.backend.model.builtin import resolve_model_path
    from plait.backend.text.tokenizer import load_tokenizer

    runner = ModelRunner(EngineConfig(model=model, kv_tokens=2048, num_threads=1))
    assert runner.fused_decode == "on"
    logit_atol, kv_atol = REAL_ATOL[model]
    tokenizer = load_tokenizer(resolve_model_path(model))
    seqs = [Seq(row=i + 1, ids=[]) for i in range(len(REAL_PROMPTS))]
    nexts = []
    for seq, prompt in zip(seqs, REAL_PROMPTS, strict=True):
        logits = runner.forward(batch_for(runner, [seq], [list(tokenizer.encode(prompt))]))
        nexts.append(int(logits[-1].argmax()))
    for _ in range(16):
        ref, out, ((ref_k, ref_v), (k, v)) = both_ways(
            runner, batch_for(runner, seqs, [[n] for n in nexts])
        )
        assert float((out - ref).abs().max()) < logit_atol
        assert float((k - ref_k).abs().max()) < kv_atol
        assert float((v - ref_v).abs().max()) < kv_atol
        assert torch.equal(out.argmax(-1), ref.argmax(-1))
        nexts = ref.argmax(-1).tolist()


@pytest.mark.real_model
def test_real_model_engine_greedy_tokens_fused_or_not() -> None:
    params = {"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True}
    outputs = []
    for fused in (True, False):
        config = {"kv_tokens": 4096, "num_threads": 1, "fused_decode": fused}
        with Engine("smollm2-135m", **config) as engine:
            outs = engine.generate(REAL_PROMPTS, params)
            alone = engine.generate(REAL_PROMPTS[1], params)
        outputs.append([o["output_ids"] for o in outs])
        assert alone["output_ids"] == outputs[-1][1]
    assert outputs[0] == outputs[1]


def test_thread_count_default() -> None:
    """num_threads=0 (the default) resolves to the physical cores this process may use, at
    most MAX_DEFAULT_THREADS; an explicit count stays; a negative one is an error."""
    assert EngineConfig().num_threads == default_threads()
    assert 1 <= default_threads() <= min(MAX_DEFAULT_THREADS, len(os.sched_getaffinity(0)))
    assert EngineConfig(num_threads=3).num_threads == 3
    with pytest.raises(ValueError, match="num_threads"):
        EngineConfig(num_threads=-1)

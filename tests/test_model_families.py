"""Every model family against transformers on the same tiny random weights (fp32), from a
Hugging Face directory and from the same weights written as GGUF: logits through prefill and
paged decode, greedy tokens alone and batched, and the fused C decode step against the layers
(or the reason it does not run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from family_checkpoints import FAMILIES, build_hf, write_family_gguf

from helpers import assert_hf_greedy
from helpers import forward_logits as run
from plait.backend.config import EngineConfig
from plait.backend.engine.engine import Engine
from plait.backend.model.fused_decode import uncovered
from plait.backend.model.runner import ModelRunner

SOURCES = [(name, source) for name in sorted(FAMILIES) for source in ("hf", "gguf")]
SOURCES = [(n, s) for n, s in SOURCES if s == "hf" or FAMILIES[n].gguf_arch is not None]
MOE = ("mixtral", "qwen3_moe")  # mixture-of-experts: the fused step leaves them to the layers
DENSE = sorted(set(FAMILIES) - set(MOE))
# fp32 logits of order 1-10: measured differences up to about 2e-5
ATOL = 1e-4
PROMPTS = [list(range(5, 30)), [7, 9, 11] * 6, list(range(200, 250, 3))]
GREEDY = {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True}


class Checkpoints:
    """Each family's (Hugging Face directory, GGUF file or None, transformers model), made on
    first use and kept for the module."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.made: dict[str, tuple[Path, Path | None, Any]] = {}

    def __getitem__(self, name: str) -> tuple[Path, Path | None, Any]:
        if name not in self.made:
            directory = self.factory.mktemp(name)
            hf = build_hf(directory, name)
            gguf = None
            if FAMILIES[name].gguf_arch:
                gguf = write_family_gguf(directory / "model.gguf", name, hf)
            self.made[name] = (directory, gguf, hf)
        return self.made[name]

    def path(self, name: str, source: str) -> Path:
        directory, gguf, _ = self[name]
        return Path(directory if source == "hf" else gguf)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Checkpoints:
    return Checkpoints(tmp_path_factory)


@pytest.mark.parametrize(("name", "source"), SOURCES)
def test_logits_match_transformers(checkpoints: Checkpoints, name: str, source: str) -> None:
    hf = checkpoints[name][2]
    path = checkpoints.path(name, source)
    runner = ModelRunner(EngineConfig(model=str(path), kv_tokens=512, max_running_requests=4))
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 260, (n,), generator=gen).tolist() for n in (40, 23)]
    with torch.no_grad():
        ref = [hf(torch.tensor([s])).logits[0] for s in seqs]
    split = [30, 6]  # a prefill of 30 tokens beside one of 6, in one batch
    out = run(runner, [(0, seqs[0][: split[0]], 0), (1, seqs[1][: split[1]], 0)])
    torch.testing.assert_close(out[: split[0]], ref[0][: split[0]], atol=ATOL, rtol=0)
    torch.testing.assert_close(out[split[0] :], ref[1][: split[1]], atol=ATOL, rtol=0)
    for step in range(8):  # paged decode, both requests in each batch
        pos = [split[0] + step, split[1] + step]
        out = run(runner, [(0, [seqs[0][pos[0]]], pos[0]), (1, [seqs[1][pos[1]]], pos[1])])
        torch.testing.assert_close(out[0], ref[0][pos[0]], atol=ATOL, rtol=0)
        torch.testing.assert_close(out[1], ref[1][pos[1]], atol=ATOL, rtol=0)


@pytest.mark.parametrize(("name", "source"), SOURCES)
def test_greedy_tokens_match_transformers_alone_and_batched(
    checkpoints: Checkpoints, name: str, source: str
) -> None:
    hf = checkpoints[name][2]
    path = checkpoints.path(name, source)
    with Engine(str(path), dtype="float32", kv_tokens=2048, num_threads=1) as engine:
        alone = [
            engine.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] for p in PROMPTS
        ]
        batched = [
            o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        ]
    assert batched == alone
    for ids, out in zip(PROMPTS, alone, strict=True):
        assert len(out) == GREEDY["max_new_tokens"]
        assert_hf_greedy(hf, ids, out)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_fused_decode_equals_the_layers_or_says_why_not(
    checkpoints: Checkpoints, name: str
) -> None:
    """int8 weights: the fused C step covers every dense family and gives the layers' greedy
    tokens, each prompt alone as in the batch; for experts the runner names what it lacks."""
    directory = checkpoints[name][0]
    outs = {}
    for fused in (True, False):
        config = dict(dtype="float32", kv_tokens=2048, num_threads=1, quantization="int8")
        with Engine(str(directory), fused_decode=fused, **config) as engine:
            runner = engine.runtime.runner  # type: ignore[attr-defined]
            status = runner.fused_decode
            outs[fused] = [
                o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
            ]
            alone = [
                engine.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] for p in PROMPTS
            ]
            missing = uncovered(runner.model.cfg)
        assert alone == outs[fused]
        assert missing == (["mixture-of-experts layers"] if name in MOE else [])
        if fused:
            assert status == (f"off (the C step does not cover {missing[0]})" if missing else "on")
    assert outs[True] == outs[False]


# int8 weights, fp32 activations both ways: |fused - layers| measured at most 5.4e-5 (Gemma 3;
# 1.5e-6 to 3.7e-5 for the others) over 12 decode steps of three requests, logits of mean
# magnitude 0.13. The paths round RMSNorm's sum, exp and tanh (SiLU, GELU, the soft cap) and
# the softmax differently by an ulp, which the matmuls' int16 activations can carry one
# quantization step. Stated: about 10x the largest.
FUSED_LOGIT_ATOL = 5e-4


@pytest.mark.parametrize("name", DENSE)
def test_fused_decode_logits_match_the_layers(checkpoints: Checkpoints, name: str) -> None:
    """Runners with and without the fused step (int8) read the same tokens: three prompts
    prefilled layer by layer, then 12 decode steps of the three, each fed the layer path's
    greedy token; logits agree within FUSED_LOGIT_ATOL, greedy picks wherever the layer
    path's top two are further apart than twice that."""
    directory = checkpoints[name][0]
    runners = [
        ModelRunner(
            EngineConfig(
                model=str(directory),
                dtype="float32",
                kv_tokens=1024,
                num_threads=1,
                quantization="int8",
                fused_decode=fused,
            )
        )  # fmt: skip
        for fused in (True, False)
    ]
    assert runners[0].fused_decode == "on"
    outs = [run(r, [(i + 1, p, 0) for i, p in enumerate(PROMPTS)]) for r in runners]
    ends = torch.tensor([len(p) for p in PROMPTS]).cumsum(0) - 1
    tokens, pos = outs[1][ends].argmax(-1).tolist(), [len(p) for p in PROMPTS]
    for _ in range(12):
        got, want = (
            run(r, [(i + 1, [t], p) for i, (t, p) in enumerate(zip(tokens, pos, strict=True))])
            for r in runners
        )
        torch.testing.assert_close(got, want, atol=FUSED_LOGIT_ATOL, rtol=0)
        top2 = want.topk(2, dim=-1).values
        clear = top2[:, 0] - top2[:, 1] > 2 * FUSED_LOGIT_ATOL
        assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])
        tokens, pos = want.argmax(-1).tolist(), [p + 1 for p in pos]


@pytest.mark.parametrize("quantization", ["none", "int8"])
@pytest.mark.parametrize("name", ["gemma2", "gemma3", "granite", "phi4-mini", "qwen3"])
def test_tensor_parallel_greedy_tokens_equal_one_rank(
    checkpoints: Checkpoints, name: str, quantization: str
) -> None:
    """Two ranks (gloo, each a slice of every layer) give one rank's greedy tokens: q/k norms
    per head, soft caps, per-layer windows and RoPE, partial rotation, the multipliers; with
    int8 weights the decode steps run in the fused C step, its all-reduce callback summing
    the ranks' attention and MLP outputs."""
    directory = checkpoints[name][0]
    outs = []
    for tp in (1, 2):
        config = dict(dtype="float32", kv_tokens=2048, num_threads=1, tp=tp)
        with Engine(str(directory), quantization=quantization, **config) as engine:
            runner = engine.runtime.runner  # type: ignore[attr-defined]
            assert (runner.fused_decode == "on") == (quantization == "int8")
            outs.append(
                [
                    o["output_ids"]
                    for o in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
                ]
            )
    assert outs[0] == outs[1]


def test_tensor_parallel_refuses_olmo2_and_says_why(checkpoints: Checkpoints) -> None:
    directory = checkpoints["olmo2"][0]
    with pytest.raises(Exception, match="q/k norms span every head"):
        Engine(str(directory), dtype="float32", kv_tokens=2048, num_threads=1, tp=2)

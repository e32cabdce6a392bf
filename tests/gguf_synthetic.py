"""Tiny random GGUF checkpoints written with gguf.GGUFWriter, covering every tensor type.

Types gguf-py can quantize in Python (F32, F16, BF16, Q8_0, Q4_0, Q4_1) go through
`gguf.quants.quantize`; the K-quants (Q2_K .. Q6_K) and IQ4_NL, IQ4_XS are random valid
blocks with finite fp16 scales sized so the values look like initialized weights. The untied
model stores its token embedding as Q5_0 and its output layer as Q5_1; the tied one's
embedding is Q8_0. `LOW_BIT_LAYERS` (with `LOW_BIT_EDGES` for the embedding and output) mixes
Q2_K, Q3_K, IQ4_NL and IQ4_XS, merged with each other and alone.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, quants

sys.path.append(str(Path(__file__).resolve().parents[1]))  # `benchmarks` lives at the root
from benchmarks.synthetic_gguf import random_blocks  # noqa: E402

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS = 256, 512, 2, 4, 2
HEAD_DIM = HIDDEN // HEADS
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# two layers, so that with the embedding and output every type appears at least once
LAYER_TYPES = [
    {
        "attn_q": "Q4_0",
        "attn_k": "Q4_1",
        "attn_v": "Q5_K",
        "attn_output": "Q6_K",
        "ffn_gate": "Q4_K",
        "ffn_up": "F16",
        "ffn_down": "BF16",
    },
    {
        "attn_q": "Q4_K",
        "attn_k": "Q6_K",
        "attn_v": "Q8_0",
        "attn_output": "Q4_1",
        "ffn_gate": "Q5_K",
        "ffn_up": "Q4_0",
        "ffn_down": "F32",
    },
]
LOW_BIT_LAYERS = [
    {
        "attn_q": "Q2_K",
        "attn_k": "Q3_K",
        "attn_v": "IQ4_NL",
        "attn_output": "IQ4_XS",
        "ffn_gate": "Q2_K",
        "ffn_up": "Q2_K",
        "ffn_down": "Q3_K",
    },
    {
        "attn_q": "IQ4_XS",
        "attn_k": "IQ4_XS",
        "attn_v": "IQ4_XS",
        "attn_output": "IQ4_NL",
        "ffn_gate": "Q3_K",
        "ffn_up": "Q4_K",
        "ffn_down": "Q2_K",
    },
]
LOW_BIT_EDGES = ("IQ4_NL", "Q3_K")  # token_embd, output
ALL_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")


def byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes (a byte-level vocabulary's first tokens)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    spelled = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in spelled:
            spelled[b] = chr(256 + extra)
            extra += 1
    return [spelled[b] for b in range(256)]


def tiny_vocab() -> tuple[list[str], list[str], list[int]]:
    """Tokens, merges and token types: bytes, a few merges, then the ChatML specials."""
    tokens = byte_alphabet()
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "r e", "a t"]
    tokens += ["".join(m.split(" ")) for m in merges]
    types = [1] * len(tokens) + [3] * len(SPECIALS)
    return tokens + list(SPECIALS), merges, types


def encode(kind: str, weights: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    """The array to hand GGUFWriter for `weights` stored as `kind`."""
    if kind in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"):
        return random_blocks(kind, *weights.shape, rng), kind
    if kind == "F32":
        return weights.astype(np.float32), kind
    if kind == "F16":
        return weights.astype(np.float16), kind
    return quants.quantize(weights.astype(np.float32), GGMLQuantizationType[kind]), kind


def write_tiny_gguf(
    path: Path,
    *,
    arch: str = "llama",
    qkv_bias: bool = False,
    tied: bool = False,
    pre: str = "gpt-2",
    seed: int = 0,
    layer_types: Sequence[Mapping[str, str]] = LAYER_TYPES,
    edge_types: tuple[str, str] | None = None,
) -> Path:
    """A 2-layer random model with the tiny byte-level vocabulary; returns `path`.
    `layer_types`: each layer's matrices' types; `edge_types`: the embedding's and output
    layer's (default: as the module docstring says)."""
    rng = np.random.default_rng(seed)
    tokens, merges, types = tiny_vocab()
    writer = GGUFWriter(str(path), arch)
    _metadata(writer, arch, tokens, merges, types, pre)
    edges = edge_types or ("Q8_0" if tied else "Q5_0", "Q5_1")
    tensors = _tensors(len(tokens), rng, qkv_bias=qkv_bias, tied=tied, types=(layer_types, edges))
    for name, kind, weights in tensors:
        data, kind = encode(kind, weights, rng)
        if kind in ("F32", "F16"):
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _metadata(
    writer: GGUFWriter, arch: str, tokens: list[str], merges: list[str], types: list[int], pre: str
) -> None:
    writer.add_name(f"tiny-{arch}")
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_block_count(LAYERS)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0 if arch == "llama" else 1000000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(len(tokens))
    add_tiny_tokenizer(writer, tokens, merges, types, pre=pre)


def add_tiny_tokenizer(
    writer: GGUFWriter, tokens: list[str], merges: list[str], types: list[int], *, pre: str
) -> None:
    """The tiny byte-level vocabulary's tokenizer fields (special ids last, ChatML)."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types(types)
    writer.add_bos_token_id(len(tokens) - 2)
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_pad_token_id(len(tokens) - 3)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)


def _tensors(
    vocab: int,
    rng: np.random.Generator,
    *,
    qkv_bias: bool,
    tied: bool,
    types: tuple[Sequence[Mapping[str, str]], tuple[str, str]],
) -> Iterator[tuple[str, str, np.ndarray]]:
    """(name, type, float weights [rows, cols]) in GGUF naming and llama.cpp's row order."""

    def normal(rows: int, cols: int) -> np.ndarray:
        return rng.normal(0.0, cols**-0.5, size=(rows, cols)).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.normal(size=HIDDEN)).astype(np.float32)

    kv = KV_HEADS * HEAD_DIM
    layer_types, (embed_type, output_type) = types
    yield "token_embd.weight", embed_type, normal(vocab, HIDDEN)
    for i, kinds in enumerate(layer_types):
        shapes = {
            "attn_q": (HIDDEN, HIDDEN),
            "attn_k": (kv, HIDDEN),
            "attn_v": (kv, HIDDEN),
            "attn_output": (HIDDEN, HIDDEN),
            "ffn_gate": (INTER, HIDDEN),
            "ffn_up": (INTER, HIDDEN),
            "ffn_down": (HIDDEN, INTER),
        }
        yield f"blk.{i}.attn_norm.weight", "F32", norm()
        yield f"blk.{i}.ffn_norm.weight", "F32", norm()
        for part, (rows, cols) in shapes.items():
            yield f"blk.{i}.{part}.weight", kinds[part], normal(rows, cols)
        if qkv_bias:
            for part, rows in (("attn_q", HIDDEN), ("attn_k", kv), ("attn_v", kv)):
                yield f"blk.{i}.{part}.bias", "F32", 0.1 * rng.normal(size=rows).astype(np.float32)
    yield "output_norm.weight", "F32", norm()
    if not tied:
        yield "output.weight", output_type, normal(vocab, HIDDEN)

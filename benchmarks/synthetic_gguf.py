"""GGUF files of random valid blocks, for measuring speed at real sizes.

Speed does not depend on the weights' values, so a model of a real shape can be written from
random blocks of each quantization kind (`random_blocks`: finite fp16 scales sized so the
values look like initialized weights) and a real tokenizer copied from another GGUF file.

    python -m benchmarks.synthetic_gguf [--out PATH] [--shape llama-1b]

`llama-1b` is a 1B-class Llama (hidden 2048, 16 layers, 32 / 8 heads, FFN 8192, SmolLM2's
49,152-token vocabulary and chat template) in llama.cpp's Q4_K_M mix: Q4_K, with Q6_K for
attn_v, ffn_down and the output layer (about 726 MiB). The file is written once and reused
(the name carries the shape; `--force` rewrites it).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

from plait.backend.gguf.reader import GGUFFile
from plait.backend.model.builtin import cache_root, resolve_model_path

K_KINDS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")


@dataclass(frozen=True)
class LlamaShape:
    """A Llama-shaped model and the kind of each of its matrices."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    kinds: dict[str, str]  # GGUF tensor stem (attn_q, ..., token_embd, output) -> kind


Q4_K_M = {
    "attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K",
    "ffn_gate": "Q4_K", "ffn_up": "Q4_K", "ffn_down": "Q6_K",
    "token_embd": "Q4_K", "output": "Q6_K",
}  # fmt: skip
SHAPES = {"llama-1b": LlamaShape(2048, 16, 32, 8, 8192, Q4_K_M)}


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random raw blocks [rows, bytes] of a K-quant or IQ4 kind with finite, weight-sized
    scales."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    n = rows * cols // block
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    spread = 2.0 / np.sqrt(cols)
    # kind -> (byte offset of fp16 d, its size: values reach about d * top, [dmin offset])
    layouts = {
        "Q2_K": (80, 15 * 3, 82),
        "Q3_K": (108, 32 * 4, None),
        "IQ4_NL": (0, 127, None),
        "IQ4_XS": (0, 32 * 127, None),
    }

    def f16(scale: float) -> np.ndarray:
        vals = (rng.uniform(0.5, 1.0, size=n) * scale).astype(np.float16)
        return vals.view(np.uint8).reshape(n, 2)

    if kind in ("Q4_K", "Q5_K"):
        top = 15 if kind == "Q4_K" else 31
        raw[:, 0:2] = f16(spread / (63 * top))
        raw[:, 2:4] = f16(spread / 63 / 2)
    elif kind == "Q6_K":
        raw[:, 208:210] = f16(spread / (128 * 32))
    elif kind in layouts:
        offset, top, dmin = layouts[kind]
        raw[:, offset : offset + 2] = f16(spread / top)
        if dmin is not None:
            raw[:, dmin : dmin + 2] = f16(spread / 15 / 2)
    else:
        raise ValueError(f"random_blocks writes {K_KINDS}, not {kind}")
    return raw.reshape(rows, -1)


def write_llama(path: Path, shape: LlamaShape, *, tokenizer_from: Path, seed: int = 0) -> Path:
    """Write `shape` as a GGUF file at `path` with the tokenizer and chat template of the
    GGUF file `tokenizer_from` (its vocabulary size becomes the model's)."""
    source = GGUFFile(tokenizer_from)
    tokens = source.fields["tokenizer.ggml.tokens"]
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(path), "llama")
    _write_config(writer, shape, vocab=len(tokens))
    _copy_tokenizer(writer, source.fields)
    head_dim = shape.hidden // shape.heads
    sizes = {
        "attn_q": (shape.hidden, shape.hidden),
        "attn_k": (shape.kv_heads * head_dim, shape.hidden),
        "attn_v": (shape.kv_heads * head_dim, shape.hidden),
        "attn_output": (shape.hidden, shape.hidden),
        "ffn_gate": (shape.ffn, shape.hidden),
        "ffn_up": (shape.ffn, shape.hidden),
        "ffn_down": (shape.hidden, shape.ffn),
    }

    def matrix(name: str, stem: str, rows: int, cols: int) -> None:
        kind = shape.kinds[stem]
        blocks = random_blocks(kind, rows, cols, rng)
        writer.add_tensor(name, blocks, raw_dtype=GGMLQuantizationType[kind])

    matrix("token_embd.weight", "token_embd", len(tokens), shape.hidden)
    for i in range(shape.layers):
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", np.ones(shape.hidden, np.float32))
        for stem, (rows, cols) in sizes.items():
            matrix(f"blk.{i}.{stem}.weight", stem, rows, cols)
    writer.add_tensor("output_norm.weight", np.ones(shape.hidden, np.float32))
    matrix("output.weight", "output", len(tokens), shape.hidden)
    _finish(writer)
    return path


def _write_config(writer: GGUFWriter, shape: LlamaShape, *, vocab: int) -> None:
    writer.add_context_length(8192)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.hidden // shape.heads)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)


def _copy_tokenizer(writer: GGUFWriter, fields: dict[str, object]) -> None:
    """The source's tokenizer: model, pre-tokenizer, tokens, types, merges, special ids and
    the chat template."""
    writer.add_tokenizer_model(str(fields["tokenizer.ggml.model"]))
    if "tokenizer.ggml.pre" in fields:
        writer.add_tokenizer_pre(str(fields["tokenizer.ggml.pre"]))
    writer.add_token_list(list(fields["tokenizer.ggml.tokens"]))  # type: ignore[call-overload]
    writer.add_token_types(list(fields["tokenizer.ggml.token_type"]))  # type: ignore[call-overload]
    if "tokenizer.ggml.merges" in fields:
        writer.add_token_merges(list(fields["tokenizer.ggml.merges"]))  # type: ignore[call-overload]
    for key, add in (
        ("bos_token_id", writer.add_bos_token_id),
        ("eos_token_id", writer.add_eos_token_id),
        ("padding_token_id", writer.add_pad_token_id),
        ("unknown_token_id", writer.add_unk_token_id),
    ):
        value = fields.get(f"tokenizer.ggml.{key}")
        if isinstance(value, int):
            add(value)
    template = fields.get("tokenizer.chat_template")
    if isinstance(template, str):
        writer.add_chat_template(template)


def _finish(writer: GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def synthetic_model(name: str = "llama-1b", *, force: bool = False) -> Path:
    """The file of shape `name` in plait's cache, written on first use."""
    path = cache_root() / "synthetic" / f"{name}-q4_k_m-random.gguf"
    if force or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        write_llama(partial, SHAPES[name], tokenizer_from=resolve_model_path("smollm2-135m"))
        partial.replace(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-1b")
    parser.add_argument("--force", action="store_true", help="rewrite an existing file")
    args = parser.parse_args()
    print(synthetic_model(args.shape, force=args.force))


if __name__ == "__main__":
    main()

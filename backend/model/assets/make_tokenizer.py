"""Train the byte-level BPE tokenizer shipped with plait's embedded models.

Run once by a developer (the results, tokenizer.json and token_counts.json, the unigram counts
of every token over the same corpus, are committed beside this script):

    python backend/assets/make_tokenizer.py [--vocab-size 16384]

The corpus is text every CPython install has: the standard library's Python sources (code,
docstrings and comments: English prose, identifiers, numbers, punctuation and JSON-like
literals). Files are read in sorted order so the result depends only on the Python version.
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MAX_CORPUS_BYTES = 24_000_000


def corpus(limit: int = MAX_CORPUS_BYTES) -> Iterator[str]:
    """Yield standard-library source files, in sorted order, up to `limit` bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        total += len(text)
        if total > limit:
            return
        yield text


def train(vocab_size: int) -> Tokenizer:
    """Train a GPT-2 style byte-level BPE with plait's special tokens at ids 0-2."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def count_tokens(tok: Tokenizer) -> list[int]:
    """How often each token id occurs when the corpus is encoded."""
    counts = [0] * tok.get_vocab_size()
    for text in corpus():
        for token_id in tok.encode(text).ids:
            counts[token_id] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocab-size", type=int, default=16384)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("tokenizer.json"))
    args = parser.parse_args()
    tok = train(args.vocab_size)
    tok.save(str(args.out))
    counts_path = args.out.with_name("token_counts.json")
    counts_path.write_text(json.dumps(count_tokens(tok), separators=(",", ":")))
    print(f"wrote {args.out} with {tok.get_vocab_size()} tokens and {counts_path}")


if __name__ == "__main__":
    main()

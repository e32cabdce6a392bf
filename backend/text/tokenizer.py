"""A checkpoint's tokenizer, and the small helpers the scheduler, detokenizer and server share.

Loading a tokenizer imports nothing of the model, so the processes that only tokenize or
detokenize stay light."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from plait.backend.gguf import is_gguf, load_gguf_tokenizer

DecodeFn = Callable[[list[int], bool], str]


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The checkpoint's own tokenizer (fast tokenizer.json when present; a GGUF file's from
    its metadata)."""
    if is_gguf(path):
        return load_gguf_tokenizer(path)
    path = Path(path)
    if (path / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    from transformers import AutoTokenizer  # its model registry costs 0.2 s to import

    return AutoTokenizer.from_pretrained(str(path))


def make_decoder(tokenizer: PreTrainedTokenizerBase) -> DecodeFn:
    """`decode(ids, skip_special_tokens)`, through the fast Rust tokenizer when there is one
    (a plain call, without the Python wrapper's per-call overhead)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)

    def decode(ids: list[int], skip: bool) -> str:
        if backend is not None:
            return str(backend.decode(ids, skip_special_tokens=skip))
        return str(tokenizer.decode(ids, skip_special_tokens=skip))

    return decode


def max_token_chars(tokenizer: PreTrainedTokenizerBase) -> int:
    """The most characters of text one token can stand for: the longest token in the
    vocabulary, spelled as the tokenizer stores it (a byte-level token has a character per
    byte, a byte-fallback token `<0x41>` six, and a text character takes at least one byte),
    so that `len(text) > context * max_token_chars` cannot fit the context."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1) or 1

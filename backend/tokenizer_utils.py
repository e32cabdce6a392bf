"""Small tokenizer helpers shared by the scheduler, detokenizer and server."""

from __future__ import annotations

from collections.abc import Callable

from transformers import PreTrainedTokenizerBase

DecodeFn = Callable[[list[int], bool], str]


def make_decoder(tokenizer: PreTrainedTokenizerBase) -> DecodeFn:
    """`decode(ids, skip_special_tokens)`, through the fast Rust tokenizer when there is one
    (a plain call, without the Python wrapper's per-call overhead)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)

    def decode(ids: list[int], skip: bool) -> str:
        if backend is not None:
            return str(backend.decode(ids, skip_special_tokens=skip))
        return str(tokenizer.decode(ids, skip_special_tokens=skip))

    return decode

"""Grammar backend for constrained decoding (xgrammar): not wired in yet."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from plait.backend.config import EngineConfig
from plait.backend.grammar_api import GrammarHooks


def make_grammar(
    config: EngineConfig, tokenizer: PreTrainedTokenizerBase, vocab_size: int
) -> GrammarHooks | None:
    """The grammar backend for constrained requests (None: constraints are rejected)."""
    return None

"""A model's vocabulary as the grammar backends see it.

`Vocab` holds, once per model, the bytes of every token (`vocab_size` entries: the logits'
width), the encoder jump-forward and closing retokenize with, xgrammar's `TokenizerInfo`
and llguidance's compiler over an `LLTokenizer` (built on first use, from the same token
list). Special
tokens and the padding past the tokenizer's end are never produced by a grammar: xgrammar
sees them as empty tokens, llguidance as special tokens; stop tokens are set per request.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import llguidance as llg
import xgrammar as xgr
from transformers import PreTrainedTokenizerBase

from plait.backend.grammar.jump_forward import Encoder
from plait.backend.grammar.llg_matcher import LlgCompiler


def tokenizer_info(
    tokenizer: PreTrainedTokenizerBase, vocab_size: int
) -> tuple[xgr.TokenizerInfo, list[bytes]]:
    """xgrammar's view of the vocabulary, `vocab_size` wide (the logits width), and its token
    bytes (read out of xgrammar once: about half a second for 50k tokens); special tokens get
    empty text so that grammars never produce them (stop tokens are set per request)."""
    hf = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    vocab = list(hf.decoded_vocab)
    for token in tokenizer.all_special_ids:
        if token < len(vocab):
            vocab[token] = b""
    info = xgr.TokenizerInfo(
        vocab,
        xgr.VocabType.RAW,
        vocab_size=vocab_size,
        stop_token_ids=hf.stop_token_ids,
        add_prefix_space=hf.add_prefix_space,
    )
    return info, vocab


def make_encoder(tokenizer: PreTrainedTokenizerBase) -> Encoder:
    """`encode(text) -> ids` without special tokens, through the Rust tokenizer if any."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return lambda text: list(backend.encode(text, add_special_tokens=False).ids)
    return lambda text: list(tokenizer.encode(text, add_special_tokens=False))


class _TokenList:
    """What `llguidance.TokenizerWrapper` reads: the token bytes, the special ids, EOS, and
    an encoder of bytes or text."""

    def __init__(
        self, *, tokens: list[bytes], special: list[int], eos: int, encode: Encoder
    ) -> None:
        self.tokens = tokens
        self.special_token_ids = special
        self.eos_token_id = eos
        self.bos_token_id = None
        self.encode = encode

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self.encode(text)


class Vocab:
    """The vocabulary of one model for both grammar backends (see the module docstring)."""

    def __init__(self, *, tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> None:
        self.info, token_bytes = tokenizer_info(tokenizer, vocab_size)
        self.vocab_size = vocab_size
        self.token_bytes: Sequence[bytes] = token_bytes
        self.stop_ids = tuple(int(t) for t in self.info.stop_token_ids)
        self.encode = make_encoder(tokenizer)
        self.special = sorted(
            {t for t in tokenizer.all_special_ids if t < vocab_size}
            | set(range(len(tokenizer), vocab_size))
        )
        self._names = {t: str(tokenizer.convert_ids_to_tokens(t)) for t in self.special}
        self._llg: LlgCompiler | None = None
        self._lock = threading.Lock()

    @property
    def llg_compiler(self) -> LlgCompiler:
        """llguidance's compiler over the same tokens (its tokenizer built once, on first
        use: about a second for a 150k-token vocabulary)."""
        with self._lock:
            if self._llg is None:
                self._llg = LlgCompiler(self._build_llg(), stops=self.stop_ids)
            return self._llg

    def _build_llg(self) -> llg.LLTokenizer:
        tokens = list(self.token_bytes)
        for token in self.special:  # llguidance keeps special tokens out of every grammar
            tokens[token] = f"<[{token}:{self._names[token]}]>".encode()
        eos = self.stop_ids[0] if self.stop_ids else self.special[0] if self.special else 0
        wrapper = _TokenList(tokens=tokens, special=self.special, eos=eos, encode=self.encode)
        return llg.LLTokenizer(llg.TokenizerWrapper(wrapper), n_vocab=self.vocab_size)

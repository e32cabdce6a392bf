"""SentencePiece vocabularies in GGUF (`tokenizer.ggml.model == "llama"`: Llama 1/2, Gemma,
Mistral v1 and others) as a `tokenizers` BPE with byte fallback.

The file lists the pieces (with scores) and no merges. Tokenizing repeatedly joins the
adjacent pair whose joined piece is in the vocabulary and ranks best; the same result comes
from BPE merges ranked by the joined piece. The rank is the piece's place in the file, which
is the order SentencePiece learned the pieces: Llama's scores follow it, Gemma's do not
(transformers ranks Gemma's pieces the same way, and is the reference here). Spaces are
written as U+2581; a piece of only spaces is stored with real spaces in Gemma files and is
respelled. Characters outside the vocabulary fall back to the `<0xNN>` byte pieces.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

SPACE = "\u2581"


def respelled(tokens: Sequence[str]) -> list[str]:
    """The pieces with a run of real spaces written as U+2581s (how the text side sees it)."""
    return [SPACE * len(t) if t and not t.strip(" ") else t for t in tokens]


def spm_merges(tokens: Sequence[str]) -> list[tuple[str, str]]:
    """Every split of a piece into two pieces of the vocabulary: pieces in file order (the
    order SentencePiece learned them), a piece's longer left part first."""
    ids: dict[str, int] = {}
    for i, token in enumerate(tokens):
        ids.setdefault(token, i)
    ranked: list[tuple[int, int, str, str]] = []
    for token, i in ids.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                ranked.append((i, -cut, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def build_spm(tokens: Sequence[str], *, add_space_prefix: bool) -> Tokenizer:
    """The backend tokenizer for a SentencePiece vocabulary (special tokens added by the
    caller)."""
    pieces = respelled(tokens)
    vocab: dict[str, int] = {}
    for i, token in enumerate(pieces):
        vocab.setdefault(token, i)
    unk = next((t for t in ("<unk>",) if t in vocab), None)
    bpe = models.BPE(
        vocab=vocab, merges=spm_merges(pieces), unk_token=unk,
        byte_fallback=True, fuse_unk=True,
    )  # fmt: skip
    backend = Tokenizer(bpe)
    if add_space_prefix:  # one U+2581 before the text, not after every special token
        backend.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=SPACE, prepend_scheme="first", split=False
        )
    else:
        backend.normalizer = normalizers.Replace(" ", SPACE)
    # No Strip of the prefix's space when decoding: a request's output is decoded on its own
    # (the detokenizer's window starts at the first new token), so its first word would
    # lose its space; a decoded whole prompt keeps the space the prefix added instead.
    backend.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return backend

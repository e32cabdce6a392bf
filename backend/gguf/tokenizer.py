"""The tokenizer a GGUF file describes, built with `tokenizers` and wrapped for transformers.

GGUF stores the vocabulary (`tokenizer.ggml.tokens`, already in the byte-level alphabet for
`gpt2` vocabularies), the merges, a type per token (normal, control, user-defined, ...), the
special ids, whether to add BOS/EOS, the chat template, and the name of the pre-tokenizer
(`tokenizer.ggml.pre`). The pre-tokenizer name selects the split regexes llama.cpp applies
before BPE (llama.cpp's `llama-vocab.cpp` is the reference for each); a name plait does not
know is refused rather than guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from plait.backend.gguf.metadata import CONTROL_TOKEN, USER_DEFINED_TOKEN, GGUFMetadata
from plait.backend.gguf.reader import GGUFFile
from plait.backend.gguf.spm import build_spm

GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SINGLE_DIGITS = r"\p{N}"


@dataclass(frozen=True)
class PreTokenizerSpec:
    """How llama.cpp splits text for one `tokenizer.ggml.pre` before BPE."""

    splits: tuple[str, ...]  # regexes applied in turn, each match isolated
    ignore_merges: bool = False  # a word that is a whole vocabulary entry is one token
    add_bos: bool = False  # llama.cpp's default when the file has no add_bos_token


_LLAMA3 = PreTokenizerSpec((LLAMA3_SPLIT,), ignore_merges=True, add_bos=True)
_QWEN2 = PreTokenizerSpec((QWEN2_SPLIT,))
_GPT2 = PreTokenizerSpec((GPT2_SPLIT,))
PRE_TOKENIZERS: dict[str, PreTokenizerSpec] = {
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "smaug-bpe": PreTokenizerSpec((LLAMA3_SPLIT,)),
    "qwen2": _QWEN2,
    "deepseek-r1-qwen": _QWEN2,
    "smollm": PreTokenizerSpec((SINGLE_DIGITS, GPT2_SPLIT)),
    "starcoder": PreTokenizerSpec((SINGLE_DIGITS, GPT2_SPLIT)),
    "gpt-2": _GPT2,
    "tekken": PreTokenizerSpec((TEKKEN_SPLIT,), ignore_merges=True, add_bos=True),
}
TOKENIZER_MODELS = ("gpt2", "llama")


def load_gguf_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """The tokenizer of the GGUF file at `path`; a chat template beside the file
    (`template_beside`) replaces the file's own."""
    beside = template_beside(Path(path))
    template = beside.read_text() if beside.is_file() else None
    return build_tokenizer(GGUFMetadata.from_file(GGUFFile(path)), chat_template=template)


def template_beside(path: Path) -> Path:
    """Where a chat template for the GGUF file `path` may lie: `<name>.jinja` next to it."""
    return path.with_suffix(".jinja")


def build_tokenizer(
    meta: GGUFMetadata, *, chat_template: str | None = None
) -> PreTrainedTokenizerFast:
    """A transformers fast tokenizer from the file's tokenizer metadata (`chat_template`:
    instead of the file's)."""
    fields = meta.fields
    model = fields.get("tokenizer.ggml.model")
    if model not in TOKENIZER_MODELS:
        raise NotImplementedError(
            f"GGUF file {meta.path.name} has tokenizer model {model!r}; "
            f"plait builds {TOKENIZER_MODELS} (byte-level BPE, SentencePiece)"
        )
    tokens: list[str] = list(fields["tokenizer.ggml.tokens"])
    if model == "llama":
        spec = PreTokenizerSpec((), add_bos=True)  # llama.cpp's SentencePiece default
        prefix = bool(fields.get("tokenizer.ggml.add_space_prefix", True))
        backend = build_spm(tokens, add_space_prefix=prefix)
    else:
        spec = pre_tokenizer_spec(meta)
        backend = Tokenizer(_bpe(tokens, list(fields.get("tokenizer.ggml.merges", [])), spec))
        backend.pre_tokenizer = _pre_tokenizer(spec)
        backend.decoder = decoders.ByteLevel()
    types = list(fields.get("tokenizer.ggml.token_type", []))
    backend.add_special_tokens(_added(tokens, types, CONTROL_TOKEN, special=True))
    user = _added(tokens, types, USER_DEFINED_TOKEN, special=False)
    vocab = backend.get_vocab()  # a SentencePiece piece respelled (runs of spaces) is no token
    backend.add_tokens([t for t in user if t.content in vocab])
    special = _special_tokens(fields, tokens)
    add_bos = bool(fields.get("tokenizer.ggml.add_bos_token", spec.add_bos))
    add_eos = bool(fields.get("tokenizer.ggml.add_eos_token", False))
    post = _post_processor(fields, tokens, add_bos=add_bos, add_eos=add_eos)
    if post is not None:
        backend.post_processor = post
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        chat_template=chat_template or fields.get("tokenizer.chat_template"),
        model_max_length=int(meta.arch_field("context_length", 4096)),
        clean_up_tokenization_spaces=False,
        **special,
    )


def pre_tokenizer_spec(meta: GGUFMetadata) -> PreTokenizerSpec:
    """The split rules named by `tokenizer.ggml.pre`; NotImplementedError for others."""
    name = str(meta.fields.get("tokenizer.ggml.pre", "default"))
    if name not in PRE_TOKENIZERS:
        raise NotImplementedError(
            f"GGUF file {meta.path.name} has pre-tokenizer {name!r}; "
            f"plait knows {sorted(PRE_TOKENIZERS)}"
        )
    return PRE_TOKENIZERS[name]


def _bpe(tokens: list[str], merges: list[str], spec: PreTokenizerSpec) -> models.BPE:
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)  # a duplicate spelling keeps its first id
    pairs: list[tuple[str, str]] = []
    for merge in merges:
        left, _, right = merge.partition(" ")
        pairs.append((left, right))
    return models.BPE(vocab=vocab, merges=pairs, ignore_merges=spec.ignore_merges)


def _pre_tokenizer(spec: PreTokenizerSpec) -> pre_tokenizers.PreTokenizer:
    steps: list[pre_tokenizers.PreTokenizer] = [
        pre_tokenizers.Split(Regex(split), behavior="isolated") for split in spec.splits
    ]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)


def _added(tokens: list[str], types: list[int], kind: int, *, special: bool) -> list[AddedToken]:
    return [
        AddedToken(tok, special=special, normalized=False)
        for tok, t in zip(tokens, types, strict=False)
        if t == kind
    ]


def _special_tokens(fields: dict[str, Any], tokens: list[str]) -> dict[str, str]:
    names = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding"}
    out = {}
    for arg, key in names.items():
        token_id = fields.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None and 0 <= int(token_id) < len(tokens):
            out[arg] = tokens[int(token_id)]
    return out


def _post_processor(
    fields: dict[str, Any], tokens: list[str], *, add_bos: bool, add_eos: bool
) -> processors.TemplateProcessing | None:
    """BOS/EOS around every encoded text, as the file asks."""
    ends = {}
    for name, wanted in (("bos", add_bos), ("eos", add_eos)):
        token_id = fields.get(f"tokenizer.ggml.{name}_token_id")
        if wanted and token_id is not None:
            ends[name] = (tokens[int(token_id)], int(token_id))
    if not ends:
        return None
    bos = f"{ends['bos'][0]} " if "bos" in ends else ""
    eos = f" {ends['eos'][0]}" if "eos" in ends else ""
    return processors.TemplateProcessing(
        single=f"{bos}$A{eos}",
        pair=f"{bos}$A{eos} {bos}$B:1{eos}".replace("  ", " "),
        special_tokens=list(ends.values()),
    )

"""GGUF files (llama.cpp's format): the header, metadata and tensor directory (`reader`), the
key-value fields (`metadata`), every quantized tensor kind, as stored or unpacked (`quants`:
`QuantizedBlocks`, `QuantizedTensor`) and the tokenizer with its chat template (`tokenizer`).
The file format only: the model built from a GGUF file is `plait.backend.model.gguf_loader`'s.
"""

from plait.backend.gguf.metadata import GGUFMetadata, eos_token_ids
from plait.backend.gguf.quants import (
    SUPPORTED_TENSOR_TYPES,
    QuantizedBlocks,
    QuantizedTensor,
    read_blocks,
    read_tensor,
)
from plait.backend.gguf.tokenizer import PRE_TOKENIZERS, build_tokenizer, load_gguf_tokenizer

__all__ = [
    "PRE_TOKENIZERS",
    "SUPPORTED_TENSOR_TYPES",
    "GGUFMetadata",
    "QuantizedBlocks",
    "QuantizedTensor",
    "build_tokenizer",
    "eos_token_ids",
    "is_gguf",
    "load_gguf_tokenizer",
    "read_blocks",
    "read_tensor",
]


def is_gguf(path: object) -> bool:
    """Whether `path` names a GGUF file (by its suffix)."""
    return str(path).lower().endswith(".gguf")

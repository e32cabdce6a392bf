"""GGUF checkpoints (llama.cpp's format): metadata, tensors, tokenizer, weight names.

`load_gguf_model` builds plait's model from a `.gguf` file (weights de-quantized at load),
`load_gguf_tokenizer` its tokenizer and chat template; `QuantizedTensor` is the unpacked
form of every quantized tensor kind.
"""

from plait.backend.gguf.metadata import ARCHITECTURES, GGUFMetadata, gguf_model_config
from plait.backend.gguf.quants import SUPPORTED_TENSOR_TYPES, QuantizedTensor, read_tensor
from plait.backend.gguf.tokenizer import PRE_TOKENIZERS, build_tokenizer, load_gguf_tokenizer
from plait.backend.gguf.weights import load_gguf_model

__all__ = [
    "ARCHITECTURES",
    "PRE_TOKENIZERS",
    "SUPPORTED_TENSOR_TYPES",
    "GGUFMetadata",
    "QuantizedTensor",
    "build_tokenizer",
    "gguf_model_config",
    "is_gguf",
    "load_gguf_model",
    "load_gguf_tokenizer",
    "read_tensor",
]


def is_gguf(path: object) -> bool:
    """Whether `path` names a GGUF file (by its suffix)."""
    return str(path).lower().endswith(".gguf")

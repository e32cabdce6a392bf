"""What makes a model family: how its files describe it and what it needs of the shared layers.

A family module (families/) defines one `Family` per architecture it reads: how a Hugging Face
config.json and GGUF metadata become a `ModelConfig`, how its tensor names differ from plait's
(weights.py), and what its weights need at load. The registry (registry.py) finds the family of
a checkpoint by `architectures` or `general.architecture`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from plait.backend.gguf.reader import GGUFFile
from plait.backend.model.config import ModelConfig


@dataclass(frozen=True)
class Family:
    """One architecture: `name` (what `ModelConfig.family` says), the names its files use, the
    two config readers, and its weight conventions.

    `hf_renames` maps the family's module names in checkpoint tensor names onto plait's;
    `gguf_layer_names` adds to or overrides the per-layer GGUF tensor names of gguf_loader.py
    (norms differ per family); `gguf_permuted_qk` says llama.cpp's converter permuted the rows
    of attn_q/attn_k; `norm_offset` is added to every RMSNorm weight read from a Hugging Face
    checkpoint (Gemma stores w - 1, its GGUF files the weight itself); `tensor_parallel` is
    why the family cannot be sharded (None: it can)."""

    name: str
    hf_architectures: tuple[str, ...]
    gguf_architectures: tuple[str, ...]
    from_hf: Callable[[Mapping[str, Any]], ModelConfig]
    from_gguf: Callable[[GGUFFile], ModelConfig]
    hf_renames: Mapping[str, str] = field(default_factory=dict)
    gguf_layer_names: Mapping[str, str] = field(default_factory=dict)
    gguf_permuted_qk: bool = False
    norm_offset: float = 0.0
    tensor_parallel: str | None = None

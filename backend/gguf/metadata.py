"""A GGUF file's key-value metadata and the names of its tensors.

GGUF names hyperparameters per architecture (`llama.block_count`, `qwen2.rope.freq_base`):
`arch_field` reads `{general.architecture}.{key}`. Which `ModelConfig` a file describes is its
model family's to say (plait.backend.model.families).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plait.backend.gguf.reader import GGUFFile

CONTROL_TOKEN, USER_DEFINED_TOKEN = 3, 4  # llama.cpp's token types
END_OF_TURN = frozenset({"<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|end|>"})


@dataclass(frozen=True)
class GGUFMetadata:
    """The scalar and array fields of one GGUF file, and the names of its tensors."""

    path: Path
    fields: dict[str, Any]
    tensor_names: frozenset[str]

    @classmethod
    def from_file(cls, file: GGUFFile) -> GGUFMetadata:
        return cls(file.path, file.fields, frozenset(t.name for t in file.tensors))

    @property
    def architecture(self) -> str:
        """The GGUF architecture name (`general.architecture`; "" when absent)."""
        return str(self.fields.get("general.architecture", ""))

    def arch_field(self, key: str, default: Any = None) -> Any:
        """`{architecture}.{key}`, or `default` when absent."""
        return self.fields.get(f"{self.architecture}.{key}", default)

    def required(self, key: str) -> Any:
        value = self.arch_field(key)
        if value is None:
            raise ValueError(f"GGUF file {self.path.name} lacks {self.architecture}.{key}")
        return value


def eos_token_ids(meta: GGUFMetadata) -> tuple[int, ...]:
    """End-of-sequence ids: eos, and end-of-turn / end-of-message where the file names them;
    a file naming no end of turn ends turns at its control token spelled as one
    (`END_OF_TURN`, as llama.cpp does: Gemma's files name none)."""
    keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
    ids = [int(meta.fields[k]) for k in (*keys, "tokenizer.ggml.eom_token_id") if k in meta.fields]
    if "tokenizer.ggml.eot_token_id" not in meta.fields:
        ids.extend(_spelled_end_of_turn(meta))
    return tuple(dict.fromkeys(ids))


def _spelled_end_of_turn(meta: GGUFMetadata) -> list[int]:
    tokens = meta.fields.get("tokenizer.ggml.tokens") or []
    types = meta.fields.get("tokenizer.ggml.token_type") or []
    return [
        i for i, (token, kind) in enumerate(zip(tokens, types, strict=False))
        if kind == CONTROL_TOKEN and token in END_OF_TURN
    ]  # fmt: skip

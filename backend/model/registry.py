"""Every model family plait runs, found by the names checkpoints give them: a Hugging Face
config's `architectures[0]` or a GGUF file's `general.architecture`. Adding a family is one
module in families/ and one entry here."""

from __future__ import annotations

from plait.backend.model.families.gemma import GEMMA2, GEMMA3
from plait.backend.model.families.granite import GRANITE
from plait.backend.model.families.llama import LLAMA, MISTRAL
from plait.backend.model.families.moe import MIXTRAL, QWEN3_MOE
from plait.backend.model.families.olmo2 import OLMO2
from plait.backend.model.families.phi3 import PHI3
from plait.backend.model.families.qwen import QWEN2, QWEN3
from plait.backend.model.family import Family

FAMILIES: tuple[Family, ...] = (
    LLAMA, MISTRAL, QWEN2, QWEN3, GEMMA2, GEMMA3, PHI3, OLMO2, GRANITE, QWEN3_MOE, MIXTRAL,
)  # fmt: skip
BY_NAME = {f.name: f for f in FAMILIES}
BY_HF = {arch: f for f in FAMILIES for arch in f.hf_architectures}
BY_GGUF = {arch: f for f in FAMILIES for arch in f.gguf_architectures}


def family_named(name: str) -> Family:
    """The family a `ModelConfig.family` names."""
    return BY_NAME[name]


def hf_family(architecture: str) -> Family:
    """The family of a Hugging Face `architectures[0]`; ValueError listing those plait reads."""
    if architecture not in BY_HF:
        raise ValueError(f"unsupported architecture {architecture!r}; plait reads {sorted(BY_HF)}")
    return BY_HF[architecture]


def gguf_family(architecture: str, *, file: str) -> Family:
    """The family of a GGUF `general.architecture`; ValueError listing those plait loads."""
    if architecture not in BY_GGUF:
        raise ValueError(
            f"GGUF file {file} has architecture {architecture!r}; plait loads {sorted(BY_GGUF)}"
        )
    return BY_GGUF[architecture]

"""Engine configuration: one frozen dataclass, validated once."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from plait.backend.host import default_threads
from plait.backend.request.sampling_params import GRAMMAR_BACKENDS
from plait.backend.speculative.ngram import SpeculativeConfig
from plait.backend.text.reasoning import REASONING_FORMATS

SCHEDULE_POLICIES = ("lpm", "dfs-weight", "fcfs")
QUANTIZATIONS = ("auto", "none", "int8", "int4")
ACTIVATION_BITS = (16, 8)  # x in the CPU's quantized matmuls: two bytes a value, or one
# The share of a device's memory the KV pool may take when neither `kv_tokens` nor
# `kv_memory_mib` is given: of the GPU's free memory, or of the CPU's available RAM (a CPU
# machine runs other programs; the pool is allocated lazily, so its pages become resident as
# the cache fills).
DEFAULT_MEM_FRACTION = {"cuda": 0.8, "cpu": 0.25}
MAX_DRAFT_TOKENS = 32  # a small model's decode step stops scaling well before this


@dataclass(frozen=True)
class EngineConfig:
    """Everything that shapes one engine: model, memory, batching, scheduling.

    `quantization`: "auto" keeps a GGUF file's quantized weights packed (weight-only
    quantized matmuls), "none" de-quantizes them to `dtype`, "int8"/"int4" quantize a float
    checkpoint's linear layers at load. `activation_bits`: what the CPU kernels quantize x
    to in those matmuls, 16 (two bytes a value, as close as int16: the default) or 8 (one
    byte, llama.cpp's Q8 activations: about 1.3x faster, less exact; docs/quantization.md).
    The KV pool holds `kv_tokens` tokens, else as many as
    `kv_memory_mib` MiB hold, else `mem_fraction` (default `DEFAULT_MEM_FRACTION`) of the
    GPU's free memory or the CPU's available RAM, capped at `max_kv_tokens_cpu` on CPU; the
    startup log states the size and where it came from.
    `chunked_prefill_size=0` disables chunked prefill. `profile_dir`: the only directory
    profiles are written under (None: $PLAIT_PROFILE_DIR, or profiling is off).
    `num_threads`: CPU threads for torch and the C kernels (0: `default_threads()`, the
    physical cores this process may use, at most 8; resolved at construction).
    `fused_decode`: a decode-only batch on the CPU runs every layer in one C call when the
    model allows it (quantized linear layers, fp32); False always takes the layer-by-layer
    path (tests, debugging).
    `grammar_backend`: the grammar backend of constrained requests that do not choose one
    (`SamplingParams.grammar_backend`): `xgrammar`, `llguidance`, or `auto`, which per
    constraint takes xgrammar unless xgrammar would warn about a keyword and llguidance
    enforces every keyword (docs/structured.md, "Grammar backends").
    `strict_schemas`: a constraint whose schema uses keywords the grammar cannot enforce
    (the warnings of docs/structured.md) fails its request instead of running with warnings.
    `reasoning_parser`: the reasoning format of the model (`plait.backend.text.reasoning`:
    deepseek-r1, qwen3, think); constrained requests are then masked only after the end of
    the reasoning section.
    `speculative_draft_tokens`: n-gram speculative decoding (prompt lookup) for greedy
    requests, at most this many draft tokens per step (0: off; up to 7 keeps a verify step
    on the fused decode path); drafts match the last `speculative_ngram` .. 1 tokens
    (docs/performance.md, "Speculative decoding").
    `tp`: tensor parallelism, ranks that each hold a slice of every layer (docs/scale.md);
    `nnodes`, `node_rank`, `dist_init_addr` ("host:port" of rank 0's TCP rendezvous, needed
    across machines) spread them over machines, `tp // nnodes` ranks on each.
    """

    model: str = "plait-tiny"
    dtype: str = "auto"
    device: str = "auto"
    kv_tokens: int | None = None
    kv_memory_mib: int | None = None
    mem_fraction: float | None = None
    max_kv_tokens_cpu: int = 131072
    page_size: int = 1
    max_running_requests: int = 256
    max_prefill_tokens: int = 8192
    chunked_prefill_size: int = 2048
    context_length: int | None = None
    schedule_policy: str = "lpm"
    fcfs_queue_threshold: int = 256
    disable_radix_cache: bool = False
    enable_jump_forward: bool = True
    grammar_cache_size: int = 256
    grammar_timeout_s: float = 60.0
    grammar_workers: int = 2
    grammar_backend: str = "auto"
    new_token_ratio: float = 0.5
    min_new_token_ratio: float = 0.1
    new_token_ratio_decay: float = 0.002
    check_integrity: bool = False
    num_threads: int = 0
    quantization: str = "auto"
    activation_bits: int = 16
    profile_dir: str | None = None
    fused_decode: bool = True
    strict_schemas: bool = False
    reasoning_parser: str | None = None
    speculative_draft_tokens: int = 0
    speculative_ngram: int = 3
    tp: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None

    def __post_init__(self) -> None:
        self._check_parallel()
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}")
        if type(self.activation_bits) is not int or self.activation_bits not in ACTIVATION_BITS:
            raise ValueError(f"activation_bits must be one of {ACTIVATION_BITS}")
        if self.grammar_backend not in GRAMMAR_BACKENDS:
            raise ValueError(f"grammar_backend must be one of {GRAMMAR_BACKENDS}")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {SCHEDULE_POLICIES}")
        if self.page_size < 1:
            raise ValueError("page_size must be >= 1")
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be >= 1")
        if self.chunked_prefill_size < 0 or self.max_prefill_tokens < 1:
            raise ValueError("chunked_prefill_size must be >= 0, max_prefill_tokens >= 1")
        if self.kv_tokens is not None and self.kv_tokens < self.page_size:
            raise ValueError("kv_tokens must hold at least one page")
        if self.kv_memory_mib is not None and self.kv_memory_mib < 1:
            raise ValueError("kv_memory_mib must be >= 1")
        if self.mem_fraction is not None and not 0 < self.mem_fraction <= 1:
            raise ValueError("mem_fraction must be in (0, 1]")
        if self.num_threads < 0:
            raise ValueError("num_threads must be >= 0 (0: one per available core)")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_FORMATS:
            raise ValueError(f"reasoning_parser must be one of {sorted(REASONING_FORMATS)}")
        if self.speculative_draft_tokens < 0 or self.speculative_draft_tokens > MAX_DRAFT_TOKENS:
            raise ValueError(f"speculative_draft_tokens must be in [0, {MAX_DRAFT_TOKENS}]")
        if self.speculative_ngram < 1:
            raise ValueError("speculative_ngram must be >= 1")
        if self.num_threads == 0:
            object.__setattr__(self, "num_threads", default_threads())

    def memory_fraction(self, device_type: str) -> float:
        """The share of the device's memory the KV pool may take (`mem_fraction`, else the
        device's default)."""
        if self.mem_fraction is not None:
            return self.mem_fraction
        return DEFAULT_MEM_FRACTION["cuda" if device_type == "cuda" else "cpu"]

    def _check_parallel(self) -> None:
        if self.tp < 1 or self.nnodes < 1 or self.tp % self.nnodes:
            raise ValueError("tp must be >= 1 and a multiple of nnodes (>= 1)")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError("node_rank must lie in [0, nnodes)")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError("dist_init_addr (host:port of node 0) is needed when nnodes > 1")

    @property
    def prefill_budget(self) -> int:
        """Prompt tokens one step may prefill."""
        if self.chunked_prefill_size:
            return min(self.chunked_prefill_size, self.max_prefill_tokens)
        return self.max_prefill_tokens

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """How requests draft tokens, or None when speculative decoding is off."""
        if not self.speculative_draft_tokens:
            return None
        return SpeculativeConfig(
            draft_tokens=self.speculative_draft_tokens, max_ngram=self.speculative_ngram
        )

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine option(s) {unknown}; known: {sorted(known)}")
        return cls(**kwargs)

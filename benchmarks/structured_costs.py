"""Grammar costs per backend for `benchmarks.structured`: compile time and mask-fill time per
token over the 421-schema test set, and the fill times an engine logged while it ran.

Each schema is compiled as the engine compiles it (`compile_key`: the key's backend, the
compact layout, strict mode, as in earlier runs), then a matcher of it fills the mask before
each token of a valid instance (compact JSON, tokenized by the model's tokenizer) until the
grammar rejects a token: once on a fresh compile (xgrammar builds token masks at first use;
llguidance builds its lexer states as they are met) and again warm.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import torch

from plait.backend.engine.engine import Engine
from plait.backend.engine.inprocess import InProcessRuntime
from plait.backend.grammar import OnDemandGrammar
from plait.backend.grammar.backend import GrammarBackend
from plait.backend.grammar.compiler import CompiledConstraint, Compilers, compile_key
from plait.backend.grammar.errors import GrammarError
from plait.backend.grammar.keys import GrammarKey
from plait.backend.grammar.matcher import new_matcher
from plait.backend.grammar.vocab import Vocab

BACKENDS = ("xgrammar", "llguidance")


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(values: Sequence[float]) -> dict[str, float]:
    return {"p50": pct(values, 0.5), "p99": pct(values, 0.99), "max": max(values)}


def hooks_of(engine: Engine) -> GrammarBackend:
    assert isinstance(engine.runtime, InProcessRuntime), "the benchmark runs in-process"
    hooks = engine.runtime.scheduler.grammar
    assert isinstance(hooks, OnDemandGrammar)
    backend = hooks.backend()
    assert isinstance(backend, GrammarBackend)
    return backend


def engine_fill_us(engine: Engine) -> dict[str, dict[str, float]]:
    """Per backend, the per-row mask-fill time of every step the engine has run (µs)."""
    times: dict[str, list[float]] = {}
    for seconds, rows, backend in hooks_of(engine).filler.log:
        times.setdefault(backend, []).append(1e6 * seconds / rows)
    return {backend: summary(values) for backend, values in times.items()}


def grammar_costs(schemas: list[tuple[str, Any]], engine: Engine) -> dict[str, Any]:
    """Per backend: compile ms and mask-fill µs per token (first use, warm) over the set."""
    vocab = hooks_of(engine).vocab
    return {backend: backend_costs(schemas, vocab, engine, backend) for backend in BACKENDS}


def backend_costs(
    schemas: list[tuple[str, Any]], vocab: Vocab, engine: Engine, backend: str
) -> dict[str, Any]:
    times: dict[str, list[float]] = {"compile_ms": [], "first_use_us": [], "warm_us": []}
    failed = []
    for name, data in schemas:
        text = json.dumps(data["schema"])
        key = GrammarKey("json_schema", text, backend=backend)
        try:
            compiled = compile_key(Compilers(vocab), key)
        except GrammarError as exc:
            failed.append((name, str(exc)))
            continue
        times["compile_ms"].append(1e3 * compiled.compile_s)
        ids = instance_ids(data, engine.tokenizer)
        times["first_use_us"] += walk_masks(compiled, ids, vocab)
        times["warm_us"] += walk_masks(compiled, ids, vocab)
    return {"schemas": len(schemas), "failed": failed, "tokens": len(times["warm_us"]),
            **{k: summary(v) for k, v in times.items()}}  # fmt: skip


def instance_ids(data: dict[str, Any], tokenizer: Any) -> list[int]:
    """A valid instance of the schema in compact JSON, as tokens."""
    valid = [t["data"] for t in data["tests"] if t["valid"]]
    text = json.dumps(valid[0], separators=(",", ":"), ensure_ascii=False) if valid else "{"
    return list(tokenizer.encode(text, add_special_tokens=False))


def walk_masks(compiled: CompiledConstraint, ids: list[int], vocab: Vocab) -> list[float]:
    """Fill the mask before each token of `ids` (until the grammar rejects one); µs each."""
    matcher = new_matcher(compiled, stops=None, vocab=vocab)
    mask = torch.empty((1, (vocab.vocab_size + 31) // 32), dtype=torch.int32)
    times = []
    for token in ids:
        start = time.perf_counter()
        matcher.fill_next_token_bitmask(mask, 0)
        times.append(1e6 * (time.perf_counter() - start))
        if not matcher.accept_token(token):
            break
    return times

"""Outlines (with transformers) baseline for the constrained workloads.

The same transformers model object as the HF peer, wrapped by `outlines.from_transformers`;
JSON Schema, regex and choice outputs through `outlines.Generator(...).batch(...)` (greedy,
left padding inside Outlines). A generator is built once per output type and warmed up
before timing, as plait's compiled grammars are cached before its timed run.
"""

from __future__ import annotations

import importlib.metadata
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.peers.hf import HFPeer

OnDone = Callable[[Sequence[int]], None]


def unavailable_reason() -> str | None:
    """Why Outlines cannot run here, or None when it can."""
    try:
        import outlines  # noqa: F401
    except ImportError as exc:
        return f"outlines is not installed (pip install -e '.[bench]'): {exc}"
    version = importlib.metadata.version("outlines")
    if int(version.split(".")[0]) < 1:
        return f"outlines {version} is older than the 1.x API this benchmark uses"
    return None


class OutlinesPeer:
    """Constrained generation through Outlines on the HF peer's model."""

    def __init__(self, hf: HFPeer) -> None:
        import outlines

        self.hf = hf
        self.model = outlines.from_transformers(hf.model, hf.tokenizer)
        self._generators: dict[tuple[str, str], Any] = {}
        self.compile_s: dict[str, float] = {}

    def _generator(self, kind: str, spec: str) -> Any:
        key = (kind, spec)
        if key not in self._generators:
            from typing import Literal

            from outlines import Generator
            from outlines.types import JsonSchema, Regex

            output: Any
            if kind == "json":
                output = JsonSchema(spec, whitespace_pattern="")  # compact, as plait's
            elif kind == "regex":
                output = Regex(spec)
            else:
                output = Literal[tuple(json.loads(spec))]
            start = time.perf_counter()
            generator = Generator(self.model, output)
            generator.batch(["warm up:"], max_new_tokens=8, do_sample=False)  # builds the index
            self.compile_s[f"{kind}:{spec[:40]}"] = time.perf_counter() - start
            self._generators[key] = generator
        return self._generators[key]

    def json(
        self,
        prompts: Sequence[str],
        schema: dict[str, Any],
        max_tokens: int,
        on_done: OnDone | None = None,
    ) -> list[str]:
        generator = self._generator("json", json.dumps(schema))
        return self._batched(generator, prompts, max_tokens, on_done)

    def regex(self, prompts: Sequence[str], pattern: str, max_tokens: int) -> list[str]:
        return self._batched(self._generator("regex", pattern), prompts, max_tokens)

    def choice(self, prompts: Sequence[str], choices: Sequence[str]) -> list[str]:
        generator = self._generator("choice", json.dumps(list(choices)))
        longest = max(len(c) for c in choices) + 1  # the model may spell a choice per char
        return self._batched(generator, prompts, longest)

    def warm(self, kind: str, spec: Any) -> None:
        """Build (and time) a generator before a timed run."""
        text = spec if isinstance(spec, str) else json.dumps(spec)
        self._generator(kind, text)

    def _batched(
        self, generator: Any, prompts: Sequence[str], max_tokens: int, on_done: OnDone | None = None
    ) -> list[str]:
        out: list[str] = []
        size = self.hf.batch_size
        for lo in range(0, len(prompts), size):
            batch = list(prompts[lo : lo + size])
            lengths = [len(self.hf.encode(p)) for p in batch]
            self.hf.work["prefill_tokens"] += sum(lengths)
            self.hf.work["padded_prefill_tokens"] += max(lengths) * len(lengths)
            out += generator.batch(batch, max_new_tokens=max_tokens, do_sample=False)
            if on_done is not None:
                on_done(range(lo, lo + len(batch)))
        return out

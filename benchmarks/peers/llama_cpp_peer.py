"""llama.cpp (llama-cpp-python, the bench extra) on the same GGUF file as plait.

Each workload is run the way a llama.cpp user runs it: one request at a time through
`Llama.create_completion` / `create_chat_completion` (whose prefix reuse matches only the
previous request's tokens), and several sequences at once through the low-level API (one
context with `n_seq_max` sequences, one `llama_decode` per step over all of them), which is what
`llama-server -np N` does. Greedy decoding everywhere; end-of-text is banned where a fixed
number of tokens is measured.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

BATCH_CTX_PER_SEQ = 1536


def unavailable_reason() -> str | None:
    try:
        import llama_cpp  # noqa: F401
    except ImportError as exc:  # the bench extra builds it from source (about 10 minutes)
        return f"llama-cpp-python is not installed ({exc}); `make bench` installs it"
    return None


class LlamaCppPeer:
    """One GGUF model loaded in llama.cpp with `threads` threads."""

    def __init__(self, path: str, *, threads: int, n_ctx: int = 4096) -> None:
        from llama_cpp import Llama

        self.threads = threads
        self.llm = Llama(
            model_path=path, n_ctx=n_ctx, n_batch=512, n_threads=threads,
            n_threads_batch=threads, verbose=False, logits_all=False,
        )  # fmt: skip
        self.vocab = int(self.llm.n_vocab())
        self.no_eos = {int(self.llm.token_eos()): -1e9}

    # --- one request at a time -----------------------------------------------------------
    def complete(self, ids: Sequence[int], *, max_tokens: int, fixed: bool = True) -> int:
        """Greedy completion of `ids`; how many tokens it wrote (`fixed`: exactly
        `max_tokens`, end-of-text banned)."""
        out = self.llm.create_completion(
            prompt=list(ids), max_tokens=max_tokens, temperature=0.0, top_k=1,
            logit_bias=self.no_eos if fixed else None,
        )  # fmt: skip
        return int(out["usage"]["completion_tokens"])

    def reset(self) -> None:
        """Forget the cached prefix, so the next prompt is prefilled in full."""
        self.llm.reset()

    def chat_json(self, messages: list[dict[str, str]], schema: dict[str, Any]) -> str:
        """One chat completion constrained by llama.cpp's JSON-schema grammar."""
        out = self.llm.create_chat_completion(
            messages=messages, temperature=0.0, top_k=1, max_tokens=256,
            response_format={"type": "json_object", "schema": schema},
        )  # fmt: skip
        return str(out["choices"][0]["message"]["content"])

    # --- many sequences in one context -------------------------------------------------------
    def batch_greedy(self, prompts: Sequence[Sequence[int]], *, max_tokens: int) -> list[list[int]]:
        """Every prompt as its own sequence of one context, decoded together: one prefill
        `llama_decode` per prompt, then one per step over all sequences."""
        import llama_cpp as lc

        n = len(prompts)
        ctx = self._batch_context(n)
        batch = lc.llama_batch_init(max(512, n, max(len(p) for p in prompts)), 0, n)
        try:
            nxt = [self._prefill(lc, ctx, batch, seq, p) for seq, p in enumerate(prompts)]
            outs: list[list[int]] = [[] for _ in prompts]
            positions = [len(p) for p in prompts]
            for _ in range(max_tokens):
                _clear(batch)
                for seq in range(n):
                    outs[seq].append(nxt[seq])
                    _add(batch, nxt[seq], positions[seq], seq, logits=True)
                    positions[seq] += 1
                if lc.llama_decode(ctx, batch) != 0:
                    raise RuntimeError("llama_decode failed")
                nxt = [self._argmax(lc, ctx, row) for row in range(n)]
            return outs
        finally:
            lc.llama_batch_free(batch)
            lc.llama_free(ctx)

    def _batch_context(self, n: int) -> Any:
        import llama_cpp as lc

        params = lc.llama_context_default_params()
        params.n_ctx = BATCH_CTX_PER_SEQ * n
        params.n_batch = params.n_ubatch = 512
        params.n_seq_max = n
        params.n_threads = params.n_threads_batch = self.threads
        params.no_perf = True
        ctx = lc.llama_init_from_model(self.llm.model, params)
        if not ctx:
            raise RuntimeError("llama.cpp could not create a batch context")
        return ctx

    def _prefill(self, lc: Any, ctx: Any, batch: Any, seq: int, ids: Sequence[int]) -> int:
        """Prefill one sequence; its first greedy token."""
        _clear(batch)
        for pos, token in enumerate(ids):
            _add(batch, token, pos, seq, logits=pos == len(ids) - 1)
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed on a prompt")
        return self._argmax(lc, ctx, len(ids) - 1)

    def _argmax(self, lc: Any, ctx: Any, row: int) -> int:
        """Greedy token of batch row `row`, end-of-text banned."""
        values = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, row), shape=(self.vocab,))
        values = values.copy()
        values[int(self.llm.token_eos())] = -np.inf
        return int(values.argmax())


def _clear(batch: Any) -> None:
    batch.n_tokens = 0


def _add(batch: Any, token: int, pos: int, seq: int, *, logits: bool) -> None:
    i = batch.n_tokens
    batch.token[i] = token
    batch.pos[i] = pos
    batch.n_seq_id[i] = 1
    batch.seq_id[i][0] = seq
    batch.logits[i] = ctypes.c_int8(1 if logits else 0).value
    batch.n_tokens = i + 1

"""Shared test helpers: small engines on plait-tiny."""

from __future__ import annotations

from typing import Any

from plait.backend.engine import Engine

TEST_KV_TOKENS = 16384


def tiny_engine(**config: Any) -> Engine:
    """plait-tiny with a small KV pool and integrity checks after every step."""
    config.setdefault("kv_tokens", TEST_KV_TOKENS)
    config.setdefault("check_integrity", True)
    return Engine("plait-tiny", **config)


def greedy(max_new_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"max_new_tokens": max_new_tokens, "temperature": 0.0, **extra}

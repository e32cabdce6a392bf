"""plait's runtime: the `Engine` facade (generate, stream, async, stats), the scheduler and
its caches, the model, constrained decoding (`grammar`) and the HTTP server (`server`)."""

from plait.backend.engine import Engine, GenerationError

__all__ = ["Engine", "GenerationError"]

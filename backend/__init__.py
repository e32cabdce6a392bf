"""plait's runtime. `Engine` (engine/) is the facade; beneath it the scheduler (scheduler/) runs
requests (request/) over the KV cache (cache/) and the model (model/), with constrained decoding
(grammar/), speculative decoding (speculative/) and text handling (text/); server/ is the HTTP
server around an Engine, router/ the data-parallel router in front of several, parallel/ tensor
parallelism, gguf/ the GGUF file format. docs/structure.md maps every module.

`from plait.backend import Engine` loads the runtime (torch, the model, the grammar backend) on
first use of the name, so that the router and the HTTP clients, which import subpackages of
this one, stay light."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plait.backend.engine.engine import Engine, GenerationError

__all__ = ["Engine", "GenerationError"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("plait.backend.engine.engine"), name)
    raise AttributeError(f"module 'plait.backend' has no attribute {name!r}")

"""Backends programs run on: in-process, a plait or SGLang server, any OpenAI-compatible API."""

from plait.clients.base import Backend, ChoiceLogprobs, GenOutput

__all__ = ["Backend", "ChoiceLogprobs", "GenOutput"]

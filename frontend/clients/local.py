"""`LocalBackend`: programs run on an in-process Engine (default model plait-tiny).

The runtime (torch, the model, the grammar backend) is loaded when the first LocalBackend
makes its Engine: `plait.backend` resolves `Engine` on first use, so `import plait` stays
light for programs on an HTTP or OpenAI backend."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import plait.backend as runtime
from plait.chat_template import SPECIAL_TOKENS, ChatTemplate
from plait.clients.base import Backend, ChoiceLogprobs, GenOutput, OnText

if TYPE_CHECKING:
    from plait.backend.engine.engine import Engine


class LocalBackend(Backend):
    """An `Engine` in this process; `engine_config` are `EngineConfig` fields;
    `chat_template_kwargs` are extra values for the chat template (e.g. Qwen3's
    `enable_thinking`)."""

    def __init__(
        self,
        model: str | None = None,
        *,
        engine: Engine | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        **engine_config: Any,
    ):
        self.engine = engine or runtime.Engine(model, **engine_config)
        self._owns_engine = engine is None
        tok = self.engine.tokenizer
        tokens = {name: getattr(tok, name, None) for name in SPECIAL_TOKENS}
        self._template = ChatTemplate.from_jinja(
            getattr(tok, "chat_template", None), **tokens, **(chat_template_kwargs or {})
        )
        self._bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id

    @property
    def chat_template(self) -> ChatTemplate:
        return self._template

    @property
    def reasoning_parser(self) -> str | None:
        return self.engine.config.reasoning_parser

    async def generate(
        self, text: str, params: dict[str, Any], *, on_text: OnText | None = None
    ) -> GenOutput:
        if on_text is None:
            out = await self.engine.async_generate(text, params)
            return GenOutput(out["text"], _meta(out))
        stream = await self.engine.async_generate(text, params, stream=True)
        pieces: list[str] = []
        last: dict[str, Any] = {}
        async for delta in stream:
            if delta["text"]:
                pieces.append(delta["text"])
                on_text(delta["text"])
            last = delta
        return GenOutput("".join(pieces), _meta(last))

    async def score(
        self, prefix: str, choices: Sequence[str], *, unconditional: bool = False
    ) -> list[ChoiceLogprobs]:
        tok = self.engine.tokenizer
        prefix_ids = self.engine.tokenizer_manager.encode(prefix)
        choice_ids = [list(tok.encode(c, add_special_tokens=False)) for c in choices]
        cond = await self._logprobs([prefix_ids + c for c in choice_ids], len(prefix_ids))
        uncond: list[list[float] | None] = [None] * len(choices)
        if unconditional:
            uncond = [
                lp for lp, _ in await self._logprobs([[self._bos, *c] for c in choice_ids], 1)
            ]
        return [
            ChoiceLogprobs(lp, un, cached) for (lp, cached), un in zip(cond, uncond, strict=True)
        ]

    async def _logprobs(self, batch: list[list[int]], start: int) -> list[tuple[list[float], int]]:
        """Prompt-token logprobs from position `start` on, and the cached-token count."""
        params = {"max_new_tokens": 0, "return_logprob": True, "logprob_start_len": start}
        outs = await self.engine.async_generate(input_ids=batch, sampling_params=params)
        return [
            ([lp for lp, _ in o["logprobs"]["input"]], o["usage"]["cached_tokens"]) for o in outs
        ]

    async def cache_prefix(self, text: str) -> dict[str, Any]:
        out = await self.engine.async_generate(text, {"max_new_tokens": 0})
        return dict(out["usage"])

    def close(self) -> None:
        if self._owns_engine:
            self.engine.shutdown()


def _meta(out: dict[str, Any]) -> dict[str, Any]:
    return {
        "finish_reason": out.get("finish_reason"),
        "usage": out.get("usage"),
        "logprobs": out.get("logprobs"),
        "warnings": out.get("warnings", []),
    }

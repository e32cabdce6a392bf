"""`HttpBackend`: programs run on a plait server, or an SGLang server (same native API)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from plait.chat_template import SPECIAL_TOKENS, ChatTemplate
from plait.clients.base import Backend, ChoiceLogprobs, GenOutput, OnText
from plait.clients.transport import HttpError, LoopClients, check

__all__ = ["HttpBackend", "HttpError", "meta_of", "request_body"]

TOP_LEVEL = ("return_logprob", "logprob_start_len", "top_logprobs_num")


class HttpBackend(Backend):
    """Speaks the native `/generate` protocol (SGLang's request/response format); roles are
    rendered with the server's chat template (from `/get_model_info`)."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout: float = 600.0,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout
        info = httpx.get(f"{self.url}/get_model_info", headers=self.headers, timeout=timeout)
        check(info)
        self.model_info: dict[str, Any] = info.json()
        tokens = {name: self.model_info.get(name) for name in SPECIAL_TOKENS}
        self._template = ChatTemplate.from_jinja(
            self.model_info.get("chat_template"), **tokens, **(chat_template_kwargs or {})
        )
        self._http = LoopClients(headers=self.headers, timeout=timeout)

    @property
    def chat_template(self) -> ChatTemplate:
        return self._template

    @property
    def reasoning_parser(self) -> str | None:
        return self.model_info.get("reasoning_parser")

    async def _post(self, body: dict[str, Any]) -> Any:
        return await self._http.post(f"{self.url}/generate", body)

    async def generate(
        self, text: str, params: dict[str, Any], *, on_text: OnText | None = None
    ) -> GenOutput:
        body = request_body(text, params)
        if on_text is None:
            out = await self._post(body)
            return GenOutput(out["text"], meta_of(out["meta_info"]))
        body["stream"] = True
        shown, meta = "", {}
        async for chunk in self._http.events(f"{self.url}/generate", body):
            if len(chunk["text"]) > len(shown):
                on_text(chunk["text"][len(shown) :])
            shown, meta = chunk["text"], chunk["meta_info"]
        return GenOutput(shown, meta_of(meta))

    async def score(
        self, prefix: str, choices: Sequence[str], *, unconditional: bool = False
    ) -> list[ChoiceLogprobs]:
        """Tokens are counted by the server: cache the prefix, then score prefix + choice from
        its last token on, dropping the boundary token when tokenization left it unchanged."""
        first = await self._post({"text": prefix, "sampling_params": {"max_new_tokens": 0}})
        start = max(first["meta_info"]["prompt_tokens"] - 1, 0)
        body = {
            "text": [prefix + c for c in choices],
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": start,
            "return_text_in_logprobs": True,
        }
        outs = await self._post(body)
        scored = [_choice_logprobs(o["meta_info"], prefix) for o in outs]
        if unconditional:
            scored = await self._add_unconditional(scored, outs, prefix)
        return scored

    async def _add_unconditional(
        self, scored: list[ChoiceLogprobs], outs: list[Any], prefix: str
    ) -> list[ChoiceLogprobs]:
        ids = [[t[1] for t in _choice_tokens(o["meta_info"], prefix)] for o in outs]
        body = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": 0,
        }
        uncond = await self._post(body)
        return [
            ChoiceLogprobs(
                s.token_logprobs,
                [lp or 0.0 for lp, *_ in u["meta_info"]["input_token_logprobs"]],
                s.cached_tokens,
            )
            for s, u in zip(scored, uncond, strict=True)
        ]

    async def cache_prefix(self, text: str) -> dict[str, Any]:
        out = await self._post({"text": text, "sampling_params": {"max_new_tokens": 0}})
        return dict(meta_of(out["meta_info"])["usage"])


def request_body(text: str, params: dict[str, Any]) -> dict[str, Any]:
    """SGLang keeps logprob options beside `sampling_params`, not inside."""
    sampling = {k: v for k, v in params.items() if k not in TOP_LEVEL}
    body: dict[str, Any] = {"text": text, "sampling_params": sampling}
    body.update({k: params[k] for k in TOP_LEVEL if k in params})
    return body


def meta_of(info: dict[str, Any]) -> dict[str, Any]:
    usage = {k: info.get(k, 0) for k in ("prompt_tokens", "completion_tokens", "cached_tokens")}
    logprobs = {
        "output": info.get("output_token_logprobs"),
        "input": info.get("input_token_logprobs"),
    }
    return {
        "finish_reason": info.get("finish_reason"),
        "usage": usage,
        "logprobs": logprobs,
        "warnings": info.get("warnings", []),
    }


def _choice_tokens(info: dict[str, Any], prefix: str) -> list[Any]:
    """The choice's tokens: the scored tokens minus the prefix's last one if it survived."""
    tokens = info["input_token_logprobs"]
    if tokens and len(tokens[0]) > 2 and prefix.endswith(tokens[0][2] or "\0"):
        return tokens[1:]
    return tokens


def _choice_logprobs(info: dict[str, Any], prefix: str) -> ChoiceLogprobs:
    tokens = _choice_tokens(info, prefix)
    return ChoiceLogprobs(
        [t[0] for t in tokens if t[0] is not None], None, info.get("cached_tokens", 0)
    )

"""The interface every backend implements (all I/O is async: one event loop drives a run)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from plait.backend.text.reasoning import Split, request_format, split_output
from plait.chat_template import ChatTemplate
from plait.select_methods import ChoiceLogprobs, choose

OnText = Callable[[str], None]


@dataclass(frozen=True)
class GenOutput:
    """A finished generation: its text and meta (finish_reason, usage, logprobs, warnings)."""

    text: str
    meta: dict[str, Any] = field(default_factory=dict)


class Backend(ABC):
    """A model endpoint as the interpreter uses it."""

    @property
    @abstractmethod
    def chat_template(self) -> ChatTemplate:
        """The model's chat template, which renders the program's role messages."""

    @abstractmethod
    async def generate(
        self, text: str, params: dict[str, Any], *, on_text: OnText | None = None
    ) -> GenOutput:
        """Continue `text`; with `on_text`, stream each new piece of text to it."""

    @abstractmethod
    async def score(
        self, prefix: str, choices: Sequence[str], *, unconditional: bool = False
    ) -> list[ChoiceLogprobs]:
        """Logprobs of each choice's tokens as a continuation of `prefix`, in one batch."""

    async def select(
        self, prefix: str, choices: Sequence[str], *, method: str
    ) -> tuple[int, dict[str, Any]]:
        """(index of the chosen continuation, meta with the scores) — by scoring each."""
        unconditional = method == "unconditional_likelihood_normalized"
        return choose(
            method, choices, await self.score(prefix, choices, unconditional=unconditional)
        )

    @property
    def reasoning_parser(self) -> str | None:
        """The model's reasoning format (`plait.backend.text.reasoning`), or None."""
        return None

    def split_reasoning(self, prompt: str, params: dict[str, Any], out: GenOutput) -> Split | None:
        """A gen's reasoning and content (None: no reasoning format applies to it): by the
        backend's reasoning parser, or `<think>` when the gen asks for `reasoning=True`."""
        fmt = request_format(self.reasoning_parser, reasoning=params.get("reasoning"))
        return None if fmt is None else split_output(fmt, out.text, prompt=prompt)

    @abstractmethod
    async def cache_prefix(self, text: str) -> dict[str, Any]:
        """Prefill `text` into the backend's prefix cache; returns its usage."""

    def close(self) -> None:  # noqa: B027 - optional hook; most backends hold nothing
        """Release what the backend holds (processes, connections)."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class UnsupportedError(NotImplementedError):
    """The backend's API cannot do what the program asked (the message says what)."""

"""Reasoning models: the one table of reasoning formats, and how an output splits into its
reasoning and its answer.

A reasoning model writes a reasoning section before its answer, between a start and an end
marker (`<think>` ... `</think>`). Where the start marker is written differs: DeepSeek-R1's
chat template opens `<think>` in the prompt (the output starts inside the reasoning), Qwen3's
model writes it itself, and Qwen3's template with `enable_thinking=False` renders an empty,
closed block (`<think>\\n\\n</think>\\n\\n`) into the prompt, so the output has no reasoning
at all. One rule covers them: the output starts inside the reasoning unless the prompt ends
with the end marker (`starts_in_reasoning`).

Used by the engine (a constrained request's grammar applies only after the end marker), the
server (`reasoning_content` in chat responses) and the DSL (`gen(..., reasoning=True)`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

DEFAULT_FORMAT = "think"
PROMPT_TAIL_TOKENS = 32  # enough of a prompt to see how it ends (an open or a closed block)


@dataclass(frozen=True)
class ReasoningFormat:
    """The markers around a model's reasoning section."""

    name: str
    start: str
    end: str


REASONING_FORMATS: Mapping[str, ReasoningFormat] = MappingProxyType(
    {
        "deepseek-r1": ReasoningFormat("deepseek-r1", "<think>", "</think>"),
        "qwen3": ReasoningFormat("qwen3", "<think>", "</think>"),
        "think": ReasoningFormat("think", "<think>", "</think>"),
        "kimi": ReasoningFormat("kimi", "\u25c1think\u25b7", "\u25c1/think\u25b7"),
    }
)


def request_format(parser: str | None, *, reasoning: bool | None) -> ReasoningFormat | None:
    """The reasoning format a request's output is read with: the engine's `parser` unless
    the request turned reasoning off (`reasoning=False`); a request that asks for it
    (`reasoning=True`) on an engine without a parser gets the `<think>` format."""
    if reasoning is False or (reasoning is None and parser is None):
        return None
    return REASONING_FORMATS[parser or DEFAULT_FORMAT]


def starts_in_reasoning(fmt: ReasoningFormat, prompt: str) -> bool:
    """Whether the output of `prompt` begins inside the reasoning section: always, unless
    the prompt ends with the end marker (thinking switched off by the template)."""
    return not prompt.rstrip().endswith(fmt.end)


@dataclass(frozen=True)
class Split:
    """An output (or a piece of one) as its reasoning and its content."""

    reasoning: str
    content: str


class ReasoningSplitter:
    """Splits an output into reasoning and content, whole or piece by piece: the pieces of
    a stream concatenate to what the whole text gives. The start marker (and whitespace
    before it) is dropped from the reasoning, the end marker from both, and whitespace at
    the start of the content. Text that may begin a marker is held back until it is known
    (`finish` releases it)."""

    def __init__(self, fmt: ReasoningFormat, *, in_reasoning: bool) -> None:
        self.fmt = fmt
        self.in_reasoning = in_reasoning
        self.opened = False  # the start of the reasoning has been looked at
        self.content_started = False
        self.pending = ""

    def split(self, text: str) -> Split:
        """The whole output at once."""
        first = self.feed(text)
        last = self.finish()
        return Split(first.reasoning + last.reasoning, first.content + last.content)

    def finish(self) -> Split:
        """What was held back, at the end of the output."""
        return self.feed("", final=True)

    def feed(self, text: str, *, final: bool = False) -> Split:
        """The reasoning and content of the next piece of the output."""
        buf, self.pending = self.pending + text, ""
        reasoning = ""
        if self.in_reasoning:
            taken = self._reasoning(buf, final=final)
            if taken is None:
                return Split("", "")
            reasoning, buf = taken
            if self.in_reasoning:
                return Split(reasoning, "")
        return Split(reasoning, self._content(buf))

    def _reasoning(self, buf: str, *, final: bool) -> tuple[str, str] | None:
        """(reasoning, text after the end marker), or None when all is held back."""
        start, end = self.fmt.start, self.fmt.end
        if not self.opened:
            stripped = buf.lstrip()
            if start.startswith(stripped) and not final:
                self.pending = buf
                return None
            self.opened = True
            buf = stripped[len(start) :] if stripped.startswith(start) else buf
        at = buf.find(end)
        if at >= 0:
            self.in_reasoning = False
            return buf[:at], buf[at + len(end) :]
        hold = 0 if final else _marker_prefix(buf, end)
        self.pending = buf[len(buf) - hold :]
        return buf[: len(buf) - hold], ""

    def _content(self, buf: str) -> str:
        if not self.content_started:
            buf = buf.lstrip()
            self.content_started = bool(buf)
        return buf


def _marker_prefix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[len(text) - n :]):
            return n
    return 0


def split_output(fmt: ReasoningFormat, text: str, *, prompt: str = "") -> Split:
    """An output's reasoning and content, given the prompt's text (or its end)."""
    splitter = ReasoningSplitter(fmt, in_reasoning=starts_in_reasoning(fmt, prompt))
    return splitter.split(text)

"""The program IR: what `s += ...` appends. Frozen dataclasses, built by the DSL functions.

A program's text is a sequence of nodes: literal `Text`, a `Gen` (sampled, maybe
constrained), a `Select` (scored choices), role markers, and `Concat` of several. Every node
that can fail records where the user wrote it, so errors point at the program's line.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "user", "assistant")
SELECT_METHODS = ("token_length_normalized", "greedy_token", "unconditional_likelihood_normalized")


@dataclass(frozen=True)
class Where:
    """A source location in the user's program."""

    filename: str
    lineno: int
    function: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno} in {self.function}"


def caller_location(skip: int = 2) -> Where:
    """The first frame outside plait's frontend, at least `skip` frames up."""
    frame = sys._getframe(skip)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("plait."):
        frame = frame.f_back
    code = frame.f_code
    return Where(code.co_filename, frame.f_lineno, code.co_name)


class Node:
    """Base of all IR nodes: `a + b` concatenates."""

    def __add__(self, other: NodeLike) -> Concat:
        return Concat((*_parts(self), *_parts(other)))

    def __radd__(self, other: NodeLike) -> Concat:
        return Concat((*_parts(other), *_parts(self)))


@dataclass(frozen=True)
class Text(Node):
    value: str


@dataclass(frozen=True)
class Gen(Node):
    """Sample text into variable `name`; `params` uses the backend's sampling-param names."""

    name: str | None
    params: dict[str, Any]
    dtype: Any = None  # int | float | bool | str | a pydantic model class
    where: Where | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Select(Node):
    """Choose one of `choices` by scoring each continuation of the current text."""

    name: str | None
    choices: tuple[str, ...]
    method: str = "token_length_normalized"
    where: Where | None = field(default=None, compare=False)


@dataclass(frozen=True)
class RoleBegin(Node):
    """Opens a `role` message: the chat template renders the conversation so far."""

    role: str
    where: Where | None = field(default=None, compare=False)


@dataclass(frozen=True)
class RoleEnd(Node):
    role: str
    where: Where | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Concat(Node):
    parts: tuple[Node, ...]


NodeLike = Node | str


def as_node(value: NodeLike) -> Node:
    if isinstance(value, Node):
        return value
    if isinstance(value, str):
        return Text(value)
    raise TypeError(f"cannot add {type(value).__name__} to a program state; use str or plait nodes")


def flatten(value: NodeLike) -> list[Node]:
    """Concat trees as a flat list of leaf nodes, adjacent texts merged."""
    out: list[Node] = []
    for node in _parts(value):
        if isinstance(node, Text) and out and isinstance(out[-1], Text):
            out[-1] = Text(out[-1].value + node.value)
        elif not (isinstance(node, Text) and not node.value):
            out.append(node)
    return out


def _parts(value: NodeLike) -> tuple[Node, ...]:
    node = as_node(value)
    if isinstance(node, Concat):
        return tuple(p for part in node.parts for p in _parts(part))
    return (node,)

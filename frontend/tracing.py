"""`Program.trace`: record a program's IR without running a model, and find the text prefix
a batch of programs shares (so `run_batch` can cache it once up front)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from plait.chat_template import ChatTemplate
from plait.ir import Gen, Node, NodeLike, RoleBegin, RoleEnd, Select, Text, flatten
from plait.transcript import Transcript

MIN_SHARED_PREFIX_CHARS = 32


class TraceStop(Exception):
    """The program read something only a real run can produce."""


class Fork(Node):
    """Marks where a traced program forked (what follows belongs to branches)."""


class TraceState:
    """Stands in for a ProgramState while tracing: records nodes, cannot read results."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []

    def __iadd__(self, other: NodeLike) -> TraceState:
        self.nodes.extend(flatten(other))
        return self

    def __getitem__(self, name: str) -> Any:
        raise TraceStop(f"read of variable {name!r}")

    def text(self) -> str:
        raise TraceStop("read of the text")

    def messages(self) -> list[dict[str, str]]:
        raise TraceStop("read of the messages")

    def fork(self, n: int) -> Any:
        self.nodes.append(Fork())
        raise TraceStop("fork")

    @contextmanager
    def _role(self, role: str) -> Iterator[None]:
        self.nodes.append(RoleBegin(role))
        yield
        self.nodes.append(RoleEnd(role))

    def system(self) -> Any:
        return self._role("system")

    def user(self) -> Any:
        return self._role("user")

    def assistant(self) -> Any:
        return self._role("assistant")


def trace(func: Callable[..., Any], kwargs: dict[str, Any]) -> list[Node]:
    """The nodes `func(state, **kwargs)` adds before it first needs a model result."""
    state = TraceState()
    with contextlib.suppress(TraceStop):
        func(state, **kwargs)
    return state.nodes


def leading_text(nodes: list[Node], template: ChatTemplate) -> str:
    """The text a program writes before its first gen, select or fork (its roles rendered
    by `template` as a run renders them)."""
    transcript = Transcript()
    for node in nodes:
        if isinstance(node, Text):
            transcript.append(node.value)
        elif isinstance(node, RoleBegin):
            transcript.open_role(node.role, template)
        elif isinstance(node, RoleEnd):
            transcript.close_role(node.role, template)
        elif isinstance(node, (Gen, Select, Fork)):
            break
    return transcript.text


def shared_prefix(texts: list[str]) -> str:
    """The common leading text of a batch, if it is long enough to be worth caching."""
    if len(texts) < 2:
        return ""
    common = os.path.commonprefix(texts)
    return common if len(common) >= MIN_SHARED_PREFIX_CHARS else ""

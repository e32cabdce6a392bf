"""Executes a program state's IR nodes in order, as one asyncio task per state.

`s += node` only queues the node; the state's task sends it to the backend. Variables become
readable as soon as their node has run; a failed node fails the state with an error that
names the program line that added it, and every later read raises that error.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plait.clients.base import Backend
from plait.clients.session import current_session, new_session_key
from plait.ir import Gen, Node, RoleBegin, RoleEnd, Select, Text, Where
from plait.transcript import Change, Transcript

REASONING_SUFFIX = "_reasoning"  # a gen's reasoning section goes into s[name + this]

TextEvent = tuple[str | None, str | None]  # (variable or None, text); (None, None) = finished
Listener = Callable[[TextEvent], None]


class ProgramError(RuntimeError):
    """A node of the program failed; the message starts with the program's line."""


@dataclass(frozen=True)
class Snapshot:
    """A state's contents at a fork point."""

    transcript: Transcript
    variables: dict[str, Any]
    meta: dict[str, Any]


@dataclass(frozen=True)
class ForkPoint(Node):
    """Internal node: snapshot the state for its branches (after caching the prefix)."""

    snapshot: asyncio.Future[Snapshot]


@dataclass(frozen=True)
class JoinPoint(Node):
    """Internal node: wait for branches and gather their new variables as lists."""

    branches: tuple[StateExecutor, ...]


class StateExecutor:
    """The running half of a ProgramState: text, variables and the node queue."""

    def __init__(
        self,
        *,
        backend: Backend,
        defaults: dict[str, Any],
        stream: bool,
        parent: asyncio.Future[Snapshot] | None = None,
        session: str | None = None,
    ) -> None:
        self.backend, self.defaults, self.stream = backend, defaults, stream
        self.session = session or new_session_key()  # a fork passes its parent's
        self.transcript = Transcript()
        self.variables: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}
        self.error: BaseException | None = None
        self.listeners: list[Listener] = []
        self.events: list[TextEvent] = []  # every text event so far, for late listeners
        self._queue: asyncio.Queue[Node | None] = asyncio.Queue()
        self._waiters: dict[str, list[asyncio.Future[Any]]] = {}
        self._closed = False
        self.finished = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._run(parent))

    @property
    def text(self) -> str:
        return self.transcript.text

    @property
    def messages(self) -> list[dict[str, str]]:
        return self.transcript.messages

    # --- called from program bodies (on the loop thread) ------------------------------
    def submit(self, node: Node) -> None:
        if self._closed:
            raise RuntimeError("this program state is finished; it takes no more text")
        self._queue.put_nowait(node)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(None)

    async def wait_var(self, name: str) -> Any:
        if name in self.variables:
            return self.variables[name]
        self._raise_if_failed()
        if self.finished.is_set():
            raise KeyError(f"the program set no variable {name!r}")
        fut = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(name, []).append(fut)
        return await fut

    async def wait_idle(self) -> None:
        """Until every node submitted so far has run."""
        await self._queue.join()
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    # --- the task ---------------------------------------------------------------------
    async def _run(self, parent: asyncio.Future[Snapshot] | None) -> None:
        current_session.set(self.session)  # this task's context: its backend requests
        try:
            if parent is not None:
                self._restore(await parent)
        except BaseException as exc:  # noqa: BLE001 - the branch fails with its parent
            self._fail(exc, None)
        try:
            while True:
                node = await self._queue.get()
                try:
                    if node is None:
                        return
                    await self._step(node)
                finally:
                    self._queue.task_done()
        finally:
            self._finish()

    async def _step(self, node: Node) -> None:
        if self.error is not None:
            if isinstance(node, ForkPoint):
                node.snapshot.set_exception(self.error)
            return
        try:
            await self._execute(node)
        except Exception as exc:  # noqa: BLE001 - reported with the program's line
            self._fail(exc, getattr(node, "where", None))
            if isinstance(node, ForkPoint) and not node.snapshot.done():
                node.snapshot.set_exception(self.error or exc)

    async def _execute(self, node: Node) -> None:
        if isinstance(node, Text):
            self._append(node.value, None)
        elif isinstance(node, Gen):
            await self._gen(node)
        elif isinstance(node, Select):
            await self._select(node)
        elif isinstance(node, RoleBegin):
            self._changed(self.transcript.open_role(node.role, self.backend.chat_template))
        elif isinstance(node, RoleEnd):
            self._changed(self.transcript.close_role(node.role, self.backend.chat_template))
        elif isinstance(node, ForkPoint):
            if self.text:
                await self.backend.cache_prefix(self.text)
            node.snapshot.set_result(self._snapshot())
        elif isinstance(node, JoinPoint):
            await self._join(node.branches)
        else:
            raise TypeError(f"unknown node {type(node).__name__}")

    async def _gen(self, node: Gen) -> None:
        params = {**self.defaults, **node.params}
        on_text = (lambda t: self._emit(node.name, t)) if self.stream else None
        out = await self.backend.generate(self.text, params, on_text=on_text)
        reason = out.meta.get("finish_reason") or {}
        if reason.get("type") == "error":
            raise ProgramError(reason.get("message", "generation failed"))
        split = self.backend.split_reasoning(self.text, params, out)
        self._append(out.text, node.name, emit=not self.stream)
        if node.name is None:
            return
        content, meta = out.text, out.meta
        if split is not None:  # the reasoning goes into its own variable
            content, meta = split.content, {**out.meta, "reasoning": split.reasoning}
            self._set(f"{node.name}{REASONING_SUFFIX}", split.reasoning, meta)
        self._set(node.name, parse_value(content, node.dtype, reason), meta)

    async def _select(self, node: Select) -> None:
        index, meta = await self.backend.select(self.text, node.choices, method=node.method)
        self._append(node.choices[index], node.name)
        if node.name is not None:
            self._set(node.name, node.choices[index], meta)

    async def _join(self, branches: tuple[StateExecutor, ...]) -> None:
        for branch in branches:
            branch.close()
        await asyncio.gather(*(b.finished.wait() for b in branches))
        gathered: dict[str, tuple[list[Any], list[Any]]] = {}
        for i, branch in enumerate(branches):
            branch._raise_if_failed()
            for name, value in branch.variables.items():
                if name in self.variables and not isinstance(self.variables[name], list):
                    continue  # the parent's own variable wins
                values, metas = gathered.setdefault(
                    name, ([None] * len(branches), [None] * len(branches))
                )
                values[i], metas[i] = value, branch.meta[name]
        for name, (values, metas) in gathered.items():
            self._set(name, values, metas)

    # --- state changes ----------------------------------------------------------------
    def _append(self, text: str, var: str | None, *, emit: bool = True) -> None:
        self.transcript.append(text)
        if emit:
            self._emit(var, text)

    def _changed(self, change: Change) -> None:
        """Role text from the chat template: appended, or (a template that renders earlier
        turns anew) a rewrite of the text's end, of which listeners see the new part."""
        if change.added:
            self._emit(None, change.added)

    def _emit(self, var: str | None, text: str) -> None:
        self.events.append((var, text))
        for listener in self.listeners:
            listener((var, text))

    def _set(self, name: str, value: Any, meta: Any) -> None:
        self.variables[name] = value
        self.meta[name] = meta
        for fut in self._waiters.pop(name, []):
            if not fut.done():
                fut.set_result(value)

    def _fail(self, exc: BaseException, where: Where | None) -> None:
        if self.error is not None:
            return
        if where is not None and not isinstance(exc, ProgramError | KeyError):
            exc = ProgramError(f"{where}: {type(exc).__name__}: {exc}")
        elif where is not None:
            exc = ProgramError(f"{where}: {exc}")
        self.error = exc
        for futs in self._waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(exc)
        self._waiters.clear()

    def _finish(self) -> None:
        for name, futs in self._waiters.items():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(KeyError(f"the program set no variable {name!r}"))
        self._waiters.clear()
        self.finished.set()
        for listener in self.listeners:
            listener((None, None))

    def _snapshot(self) -> Snapshot:
        return Snapshot(self.transcript.copy(), dict(self.variables), dict(self.meta))

    def _restore(self, snap: Snapshot) -> None:
        self.transcript = snap.transcript.copy()
        self.variables, self.meta = dict(snap.variables), dict(snap.meta)


def parse_value(text: str, dtype: Any, reason: dict[str, Any]) -> Any:
    """The Python value of a gen: its text, or parsed into `dtype`. An output cut at
    max_tokens is an error, unless the engine closed it (`closed`: it is complete)."""
    if dtype is None or dtype is str:
        return text
    if reason.get("type") == "length" and not reason.get("closed"):
        raise ProgramError(f"output stopped at max_tokens before it was a complete {dtype}")
    if dtype is bool:
        return text.strip() == "True"
    if dtype in (int, float):
        return dtype(text.strip())
    return dtype.model_validate(json.loads(text, strict=False))

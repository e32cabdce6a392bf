"""`ProgramState` (the `s` of a program) and `ForkGroup` (what `s.fork(n)` returns)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from plait.greenlets import await_in_program, in_program
from plait.interpreter import ForkPoint, JoinPoint, ProgramError, StateExecutor, TextEvent
from plait.ir import NodeLike, RoleBegin, RoleEnd, caller_location, flatten


class ProgramState:
    """Text, variables and messages of one program run.

    `s += "text"` / `s += plait.gen("x")` queue work and return at once; `s["x"]` waits for
    `x` only if it is not ready yet. After the run, `text()`, `messages()`, `meta(name)` and
    `s[name]` read the results.
    """

    def __init__(self, executor: StateExecutor, *, loop: asyncio.AbstractEventLoop) -> None:
        self._exec = executor
        self._loop = loop
        self._family: list[StateExecutor] = [executor]
        self._body_error: BaseException | None = None

    # --- building ---------------------------------------------------------------------
    def __iadd__(self, other: NodeLike) -> ProgramState:
        for node in flatten(other):
            self._exec.submit(node)
        return self

    @contextmanager
    def _role(self, role: str) -> Iterator[None]:
        where = caller_location(3)
        self._exec.submit(RoleBegin(role, where))
        yield
        self._exec.submit(RoleEnd(role, where))

    def system(self) -> Any:
        """`with s.system(): s += ...` — a system message."""
        return self._role("system")

    def user(self) -> Any:
        """`with s.user(): s += ...` — a user message."""
        return self._role("user")

    def assistant(self) -> Any:
        """`with s.assistant(): s += plait.gen(...)` — an assistant message."""
        return self._role("assistant")

    def fork(self, n: int) -> ForkGroup:
        """`n` branches that continue from here; the shared prefix is cached once first."""
        if n < 1:
            raise ValueError("fork needs n >= 1")
        snapshot = self._loop.create_future()
        self._exec.submit(ForkPoint(snapshot))
        branches = []
        for _ in range(n):
            ex = StateExecutor(
                backend=self._exec.backend,
                defaults=self._exec.defaults,
                stream=self._exec.stream,
                parent=snapshot,
                session=self._exec.session,
            )
            self._family.append(ex)
            branch = ProgramState(ex, loop=self._loop)
            branch._family = self._family
            branches.append(branch)
        return ForkGroup(self, branches)

    # --- reading ----------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        return self._wait(lambda: self._exec.wait_var(name))

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def __contains__(self, name: str) -> bool:
        self._wait(self._exec.wait_idle)
        return name in self._exec.variables

    def text(self) -> str:
        """All text so far (waits for queued work)."""
        self._wait(self._exec.wait_idle)
        return self._exec.text

    def messages(self) -> list[dict[str, str]]:
        """The role messages so far, OpenAI style."""
        self._wait(self._exec.wait_idle)
        return [dict(m) for m in self._exec.messages]

    def meta(self, name: str) -> Any:
        """Usage, cached tokens, finish reason, logprobs (or select scores) of variable `name`
        (a list with one entry per branch for variables gathered by `forks.join()`)."""
        self[name]
        return copy.copy(self._exec.meta[name])

    def variables(self) -> dict[str, Any]:
        self._wait(self._exec.wait_idle)
        return dict(self._exec.variables)

    def error(self) -> BaseException | None:
        """The first error of this run: the program body's, or a failed node's."""
        if self._body_error is not None:
            return self._body_error
        return next((ex.error for ex in self._family if ex.error is not None), None)

    # --- streaming --------------------------------------------------------------------
    def text_iter(self, var: str | None = None) -> Iterator[str]:
        """Yield text as it is produced (only variable `var`'s text if given)."""
        events: queue.Queue[TextEvent] = queue.Queue()
        self._listen(events.put)
        while True:
            name, text = events.get()
            if text is None:
                break
            if var is None or name == var:
                yield text
        if self._exec.error is not None:
            raise self._exec.error

    async def text_async_iter(self, var: str | None = None) -> AsyncIterator[str]:
        """`async for` over text as it is produced, from any event loop."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[TextEvent] = asyncio.Queue()

        def forward(event: TextEvent) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        self._listen(forward)
        while True:
            name, text = await events.get()
            if text is None:
                break
            if var is None or name == var:
                yield text
        if self._exec.error is not None:
            raise self._exec.error

    def _listen(self, listener: Callable[[TextEvent], None]) -> None:
        """Replay what was produced so far, then follow live events. Attaching runs on the
        run's loop; once the state is finished (no more events), from any thread."""
        lock, attached = threading.Lock(), threading.Event()

        def attach() -> None:
            with lock:
                if attached.is_set():
                    return
                for event in list(self._exec.events):
                    listener(event)
                if self._exec.finished.is_set():
                    listener((None, None))
                else:
                    self._exec.listeners.append(listener)
                attached.set()

        if self._exec.finished.is_set() or _on_loop_thread(self._loop):
            attach()
            return
        try:
            self._loop.call_soon_threadsafe(attach)
        except RuntimeError:  # the loop already closed: the state is final
            attach()
        while not attached.wait(0.05):
            if self._exec.finished.is_set():
                attach()

    # --- waiting ----------------------------------------------------------------------
    def _wait(self, make: Callable[[], Awaitable[Any]]) -> Any:
        """Block the caller until the awaitable is done, whichever thread it is on."""
        if in_program():
            return await_in_program(make())
        if self._exec.finished.is_set():
            return _finished_value(make)
        if _on_loop_thread(self._loop):
            raise RuntimeError("use `await state.aget(name)` inside async code on the run's loop")
        try:
            return asyncio.run_coroutine_threadsafe(_as_coro(make), self._loop).result()
        except (RuntimeError, concurrent.futures.CancelledError):
            if not self._exec.finished.is_set():  # the run's loop ended before the state
                raise
            return _finished_value(make)

    async def aget(self, name: str) -> Any:
        """`await s.aget("x")` from async code running on the run's own loop."""
        return await self._exec.wait_var(name)


class ForkGroup:
    """Branches of a fork: `forks[i] += ...`, `forks += lambda i: ...`, `forks.join()`."""

    def __init__(self, parent: ProgramState, branches: list[ProgramState]) -> None:
        self.parent = parent
        self.branches = branches

    def __len__(self) -> int:
        return len(self.branches)

    def __getitem__(self, i: int) -> ProgramState:
        return self.branches[i]

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.branches)

    def __setitem__(self, i: int, value: ProgramState) -> None:
        """Completes `forks[i] += ...` (which adds to the branch in place)."""
        if value is not self.branches[i]:
            raise TypeError("fork branches are extended with +=, not replaced")

    def __iadd__(self, other: NodeLike | Callable[[int], NodeLike]) -> ForkGroup:
        for i, branch in enumerate(self.branches):
            branch += other(i) if callable(other) else other
        return self

    def join(self) -> None:
        """Finish the branches; their new variables appear in the parent as lists."""
        self.parent._exec.submit(JoinPoint(tuple(b._exec for b in self.branches)))


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


async def _as_coro(make: Callable[[], Awaitable[Any]]) -> Any:
    return await make()


def _finished_value(make: Callable[[], Awaitable[Any]]) -> Any:
    """After the run, every awaitable is resolved: drive it once without a loop."""
    coro = _as_coro(make)
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise ProgramError("the program state is not finished (was its run interrupted?)")

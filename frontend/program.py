"""`@plait.program`: a Python function over a state, run on a backend.

    @plait.program
    def qa(s, question):
        s += plait.user(question)
        s += plait.assistant(plait.gen("answer", max_tokens=64))

    state = qa.run(question="Why is the sky blue?", temperature=0)
    print(state["answer"])

Each run (or run_batch) uses one asyncio event loop: program bodies are greenlets on it and
each state's work is one task on it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from tqdm.auto import tqdm

from plait.backend.request.sampling_params import RUN_OPTIONS
from plait.clients.base import Backend
from plait.context import resolve_backend
from plait.greenlets import drive
from plait.interpreter import StateExecutor
from plait.ir import Node
from plait.state import ProgramState
from plait.tracing import leading_text, shared_prefix, trace


class Program:
    """A decorated program function; see the module docstring."""

    def __init__(self, func: Callable[..., Any], bound: dict[str, Any] | None = None) -> None:
        self.func = func
        self.bound = dict(bound or {})
        functools.update_wrapper(self, func)
        self._params = set(list(inspect.signature(func).parameters)[1:])

    def __call__(self, s: Any, *args: Any, **kwargs: Any) -> Any:
        """Inline call from another program: runs this body on the caller's state."""
        return self.func(s, *args, **{**self.bound, **kwargs})

    def bind(self, **kwargs: Any) -> Program:
        """A copy with some arguments fixed."""
        return Program(self.func, {**self.bound, **kwargs})

    # --- running ----------------------------------------------------------------------
    def run(
        self, *, backend: Backend | None = None, stream: bool = False, **kwargs: Any
    ) -> ProgramState:
        """Run once. Keyword arguments are the program's own, or default sampling parameters
        (temperature, max_tokens, ...). With `stream=True`, returns at once; read the state
        with `text_iter()`; otherwise returns when the program is done (errors raised)."""
        args, defaults = self._split(kwargs)
        backend = resolve_backend(backend)

        async def main(ready: Callable[[ProgramState], None]) -> ProgramState:
            return await self._execute(backend, defaults, args, stream=stream, on_state=ready)

        if stream:
            return _start_in_thread(main)
        state = _run_sync(lambda: main(lambda _: None))
        _raise_error(state)
        return state

    async def run_async(self, *, backend: Backend | None = None, **kwargs: Any) -> ProgramState:
        """Run on the caller's event loop (for async applications)."""
        args, defaults = self._split(kwargs)
        state = await self._execute(resolve_backend(backend), defaults, args, stream=False)
        _raise_error(state)
        return state

    def run_batch(
        self,
        batch: Sequence[dict[str, Any]],
        *,
        backend: Backend | None = None,
        max_concurrency: int | None = None,
        progress_bar: bool = False,
        raise_errors: bool = True,
        **sampling: Any,
    ) -> list[ProgramState]:
        """Run once per kwargs dict, concurrently on one event loop. The text all programs
        start with is cached on the backend once before they start."""
        backend = resolve_backend(backend)
        items = [self._split({**item, **sampling}) for item in batch]
        states = _run_sync(lambda: self._batch(backend, items, max_concurrency, progress_bar))
        if raise_errors:
            for state in states:
                _raise_error(state)
        return states

    def trace(self, *, backend: Backend | None = None, **kwargs: Any) -> list[Node]:
        """The IR the program builds before it first needs a model result."""
        args, _ = self._split(kwargs)
        return trace(self.func, {**self.bound, **args})

    # --- internals --------------------------------------------------------------------
    def _split(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        args, defaults = {}, {}
        for key, value in kwargs.items():
            if key in self._params:
                args[key] = value
            elif key in RUN_OPTIONS:
                defaults[RUN_OPTIONS[key]] = value
            else:
                raise TypeError(
                    f"{self.func.__name__}() got an unexpected keyword argument {key!r}"
                )
        return args, defaults

    async def _execute(
        self,
        backend: Backend,
        defaults: dict[str, Any],
        args: dict[str, Any],
        *,
        stream: bool,
        on_state: Callable[[ProgramState], None] | None = None,
    ) -> ProgramState:
        loop = asyncio.get_running_loop()
        executor = StateExecutor(backend=backend, defaults=defaults, stream=stream)
        state = ProgramState(executor, loop=loop)
        if on_state is not None:
            on_state(state)
        try:
            await drive(self.func, state, **{**self.bound, **args})
        except Exception as exc:  # noqa: BLE001 - kept on the state, raised by run()
            state._body_error = exc
        finally:
            for ex in state._family:
                ex.close()
            await asyncio.gather(*(ex.finished.wait() for ex in state._family))
        return state

    async def _batch(
        self,
        backend: Backend,
        items: list[tuple[dict[str, Any], dict[str, Any]]],
        max_concurrency: int | None,
        progress_bar: bool,
    ) -> list[ProgramState]:
        prefix = self._shared_prefix(backend, [args for args, _ in items])
        if prefix:
            await backend.cache_prefix(prefix)
        limit = asyncio.Semaphore(max_concurrency or len(items) or 1)
        bar = tqdm(total=len(items), disable=not progress_bar, desc=self.func.__name__)

        async def one(args: dict[str, Any], defaults: dict[str, Any]) -> ProgramState:
            async with limit:
                state = await self._execute(backend, defaults, args, stream=False)
            bar.update(1)
            return state

        try:
            return list(await asyncio.gather(*(one(a, d) for a, d in items)))
        finally:
            bar.close()

    def _shared_prefix(self, backend: Backend, batch: list[dict[str, Any]]) -> str:
        try:
            texts = [
                leading_text(trace(self.func, {**self.bound, **args}), backend.chat_template)
                for args in batch
            ]
        except Exception:  # noqa: BLE001 - a program that cannot be traced just skips this
            return ""
        return shared_prefix(texts)


def program(func: Callable[..., Any] | None = None) -> Any:
    """Decorator: `@plait.program` or `@plait.program()`."""
    if func is None:
        return program
    return Program(func)


def _raise_error(state: ProgramState) -> None:
    error = state.error()
    if error is not None:
        raise error


def _run_sync(make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run a coroutine on a fresh event loop: here, or on a helper thread if this thread
    already runs a loop (e.g. inside Jupyter)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, make()).result()


def _start_in_thread(main: Callable[[Callable[[ProgramState], None]], Any]) -> ProgramState:
    """Start a run on its own thread and loop; return its state as soon as it exists."""
    ready: concurrent.futures.Future[ProgramState] = concurrent.futures.Future()

    def runner() -> None:
        try:
            asyncio.run(main(ready.set_result))
        except BaseException as exc:  # noqa: BLE001 - surfaced to the caller
            if not ready.done():
                ready.set_exception(exc)

    threading.Thread(target=runner, name="plait-run", daemon=True).start()
    return ready.result()

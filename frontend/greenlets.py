"""Synchronous program bodies on one asyncio loop, without a thread per program.

Each program body runs in its own greenlet on the loop's thread. When it needs a value that
is not ready (`s["answer"]`), it switches back to the driver coroutine with an awaitable; the
driver awaits it (other programs and executors run meanwhile) and switches back in with the
result. To the user the read simply blocks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import greenlet


class ProgramGreenlet(greenlet.greenlet):  # type: ignore[misc]
    """Marks greenlets that run program bodies."""


def in_program() -> bool:
    return isinstance(greenlet.getcurrent(), ProgramGreenlet)


def await_in_program(awaitable: Awaitable[Any]) -> Any:
    """Suspend the current program body until `awaitable` is done; returns its result."""
    current = greenlet.getcurrent()
    if not isinstance(current, ProgramGreenlet):
        raise RuntimeError("await_in_program called outside a program body")
    return current.parent.switch(awaitable)


async def drive(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run `fn(*args, **kwargs)` in a ProgramGreenlet, awaiting whatever it waits on."""
    glet = ProgramGreenlet(fn)
    request = glet.switch(*args, **kwargs)
    while not glet.dead:
        try:
            value = await request
        except BaseException as exc:  # noqa: BLE001 - re-raised inside the program body
            request = glet.throw(exc)
        else:
            request = glet.switch(value)
    return request

"""The session key of a program run, sent by the HTTP backends as `X-Plait-Session`.

A router in front of several servers (`plait serve --dp N`, `plait router`) keeps every
request of one session on one server, so a program's forks and turns find their shared
prefix in one cache. Each program run's root state starts a session; its forks inherit it.
The key lives in a ContextVar that each state's task sets for the requests it makes.
"""

from __future__ import annotations

import uuid
from contextvars import ContextVar

SESSION_HEADER = "X-Plait-Session"

current_session: ContextVar[str | None] = ContextVar("plait_session", default=None)


def new_session_key() -> str:
    return uuid.uuid4().hex


def session_headers() -> dict[str, str]:
    """`{"X-Plait-Session": key}` inside a program run, else `{}`."""
    key = current_session.get()
    return {SESSION_HEADER: key} if key else {}

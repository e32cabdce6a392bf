"""The default backend, held in a ContextVar (no global singleton)."""

from __future__ import annotations

from contextvars import ContextVar

from plait.clients.base import Backend
from plait.clients.local import LocalBackend

_default: ContextVar[Backend | None] = ContextVar("plait_default_backend", default=None)


def set_default_backend(backend: Backend | None) -> None:
    """Programs run without `backend=` use this one (in this context)."""
    _default.set(backend)


def get_default_backend() -> Backend:
    """The context's default backend; a LocalBackend on plait-tiny is created on first use."""
    backend = _default.get()
    if backend is None:
        backend = LocalBackend()
        _default.set(backend)
    return backend


def resolve_backend(backend: Backend | None) -> Backend:
    return backend if backend is not None else get_default_backend()

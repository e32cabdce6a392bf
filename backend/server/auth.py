"""Who is calling: API keys, admin keys, and the identity each request runs under.

- API keys (`--api-key`, `$PLAIT_API_KEY`, `--api-key-file` with one key per line: all of them
  are accepted): every endpoint but /health needs `Authorization: Bearer <key>` (401 without).
- Admin keys (`--admin-api-key`, `$PLAIT_ADMIN_API_KEY`, `--admin-api-key-file`): accepted
  everywhere too, and only they may abort other callers' requests or use `abort_all`.
- A caller's identity: with keys, a digest of the key it presented (clients that share a key
  share an identity); without keys, its IP address. /abort_request stops only requests of the
  caller's identity unless the caller holds an admin key.

Keys are kept only as SHA-256 digests and compared as digests.
"""

from __future__ import annotations

import argparse
import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from plait.backend.server.protocol import error_body

OPEN_PATHS = frozenset({"/health"})
API_KEY_ENV = "PLAIT_API_KEY"
ADMIN_KEY_ENV = "PLAIT_ADMIN_API_KEY"
STATE_KEY = "plait_caller"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def read_keys(path: str | Path) -> list[str]:
    """The keys in a key file: one per line; blank lines and `#` comments are skipped."""
    lines = Path(path).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def gather_keys(*, key: str | None, key_file: str | None, env: str) -> tuple[str, ...]:
    """Every key given by flag, file or environment variable."""
    keys = [key] if key else []
    if key_file:
        keys += read_keys(key_file)
    if os.environ.get(env):
        keys.append(os.environ[env])
    return tuple(dict.fromkeys(keys))


def add_key_arguments(parser: argparse._ActionsContainer, *, admin: bool) -> None:
    """The key flags (`--api-key`, `--api-key-file`, and with `admin` the admin pair) of every
    command that serves HTTP; `keys_from_namespace` reads them back."""
    parser.add_argument(
        "--api-key", default=None,
        help=f"require Authorization: Bearer KEY (also ${API_KEY_ENV}, --api-key-file)",
    )  # fmt: skip
    parser.add_argument("--api-key-file", default=None, help="accepted API keys, one per line")
    if not admin:
        return
    parser.add_argument(
        "--admin-api-key", default=None,
        help=f"a key that may also abort any request (also ${ADMIN_KEY_ENV})",
    )  # fmt: skip
    parser.add_argument("--admin-api-key-file", default=None, help="admin keys, one per line")


def keys_from_namespace(ns: argparse.Namespace) -> AccessKeys:
    """The keys of `add_key_arguments`' flags, their files and the environment (admin keys
    only where the command has the admin flags)."""
    api = gather_keys(key=ns.api_key, key_file=ns.api_key_file, env=API_KEY_ENV)
    if not hasattr(ns, "admin_api_key"):
        return AccessKeys(api=api)
    admin = gather_keys(key=ns.admin_api_key, key_file=ns.admin_api_key_file, env=ADMIN_KEY_ENV)
    return AccessKeys(api=api, admin=admin)


@dataclass(frozen=True)
class AccessKeys:
    """The keys as given (flags, files, environment), for a launcher that passes them on to
    the processes it starts (`plait serve --dp`); servers keep only `auth()`'s digests."""

    api: tuple[str, ...] = field(default=(), repr=False)
    admin: tuple[str, ...] = field(default=(), repr=False)

    def auth(self) -> AuthConfig:
        return AuthConfig.from_keys(self.api, self.admin)


@dataclass(frozen=True)
class Caller:
    """Who sent a request: `identity` owns the requests it starts; `admin` may abort any."""

    identity: str
    admin: bool = False


@dataclass(frozen=True)
class AuthConfig:
    """The accepted keys, as digests."""

    api_keys: frozenset[str] = frozenset()
    admin_keys: frozenset[str] = frozenset()

    @classmethod
    def from_keys(cls, api_keys: Iterable[str], admin_keys: Iterable[str] = ()) -> AuthConfig:
        return cls(frozenset(map(digest, api_keys)), frozenset(map(digest, admin_keys)))

    @property
    def required(self) -> bool:
        return bool(self.api_keys or self.admin_keys)

    def caller(self, authorization: str, address: str) -> Caller | None:
        """The caller of a request with this Authorization header from `address`; None when
        keys are required and it presents none that is valid."""
        if not self.required:
            return Caller(f"addr:{address}")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        key = digest(token.strip())
        if key in self.admin_keys:
            return Caller(f"key:{key[:16]}", admin=True)
        if key in self.api_keys:
            return Caller(f"key:{key[:16]}")
        return None


class AuthMiddleware:
    """Rejects requests without a valid key (HTTP 401, except OPEN_PATHS) and records each
    request's `Caller` for the handlers (`caller_of`)."""

    def __init__(self, app: ASGIApp, *, auth: AuthConfig) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        client = scope.get("client")
        caller = self.auth.caller(authorization, client[0] if client else "unknown")
        if caller is None and scope["path"] not in OPEN_PATHS:
            body = error_body(401, "missing or invalid API key (Authorization: Bearer <key>)")
            response = JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})[STATE_KEY] = caller
        await self.app(scope, receive, send)


def caller_of(request: Request) -> Caller:
    """The request's caller, as AuthMiddleware recorded it."""
    caller = request.scope.get("state", {}).get(STATE_KEY)
    assert isinstance(caller, Caller), "AuthMiddleware must wrap the app"
    return caller

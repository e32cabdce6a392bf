"""/openapi.json as the server answers, so generated clients, gateways and fuzzers can rely
on it.

Each route declares its own answers where it is added (`errors`, `json_or_sse`, `text`,
`empty`; request bodies through their pydantic models, or `optional_json_body`). `install`
then corrects what FastAPI generates on its own: its 422 (validation errors are answered 400
with an `ErrorBody`, `app._add_error_handlers`) is dropped with its schemas, and the answers
every route can give are added: 401 without a valid API key (all paths but `auth.OPEN_PATHS`),
413 for a body over the limit, 500 for an internal error.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from plait.backend.server.auth import OPEN_PATHS
from plait.backend.server.protocol import ErrorBody

Responses = dict[int | str, dict[str, Any]]
ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}
STATUS_TEXT = {
    400: "bad input: the message starts with the field's name, `param` names it",
    401: "missing or invalid API key (`Authorization: Bearer KEY`)",
    403: "needs the admin API key",
    413: "the request body is larger than the server's limit",
    500: "internal error",
    501: "not implemented by plait",
    503: "the runtime is gone, stalled or shutting down",
}
FASTAPI_ONLY = ("HTTPValidationError", "ValidationError")


def errors(*statuses: int) -> Responses:
    """Error answers of a route (each with the `ErrorBody` schema)."""
    return {status: _error_response(status) for status in statuses}


def json_or_sse(description: str) -> Responses:
    """A 200 that is JSON, or Server-Sent Events with `"stream": true`."""
    sse = {"schema": {"description": "events `data: <JSON>`, the last one `data: [DONE]`"}}
    content = {"application/json": {}, "text/event-stream": sse}
    return {200: {"description": description, "content": content}}


def text(status: int, description: str, media_type: str = "text/plain") -> Responses:
    """A plain-text answer."""
    return {status: {"description": description, "content": {media_type: {"schema": {}}}}}


def empty(description: str) -> Responses:
    """A 200 without a body."""
    return {200: {"description": description, "content": {}}}


def optional_json_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` of a route that reads an optional JSON body itself."""
    content = {"application/json": {"schema": model.model_json_schema()}}
    return {"requestBody": {"required": False, "content": content}}


def install(app: FastAPI) -> None:
    """Serve the corrected schema at /openapi.json (built once, on first use)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            app.openapi_schema = corrected(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def corrected(schema: dict[str, Any]) -> dict[str, Any]:
    """FastAPI's 422s and their schemas out; 401 / 413 / 500 and `ErrorBody` in."""
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            common = (413, 500) if path in OPEN_PATHS else (401, 413, 500)
            for status in common:
                responses.setdefault(str(status), _error_response(status))
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in FASTAPI_ONLY:
        components.pop(name, None)
    _, defs = models_json_schema(
        [(ErrorBody, "serialization")], ref_template="#/components/schemas/{model}"
    )
    components.update(defs.get("$defs", {}))
    return schema


def _error_response(status: int) -> dict[str, Any]:
    return {
        "description": STATUS_TEXT[status],
        "content": {"application/json": {"schema": ERROR_REF}},
    }

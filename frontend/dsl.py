"""The words of the language: `gen`, `select` and the chat roles."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from plait.ir import (
    SELECT_METHODS,
    Concat,
    Gen,
    NodeLike,
    RoleBegin,
    RoleEnd,
    Select,
    as_node,
    caller_location,
)

# Bounded so that even a model that never wants to stop yields a finished value.
DTYPE_REGEX: dict[type, str] = {
    int: r"-?[0-9]{1,12}",
    float: r"-?[0-9]{1,12}(\.[0-9]{1,8})?",
    bool: r"(True|False)",
    str: r"[^\n]{1,256}",
}
_RENAMES = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}


def gen(
    name: str | None = None,
    *,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    stop: str | Sequence[str] | None = None,
    stop_token_ids: Sequence[int] | None = None,
    stop_regex: str | Sequence[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    repetition_penalty: float | None = None,
    logit_bias: dict[int, float] | None = None,
    ignore_eos: bool | None = None,
    seed: int | None = None,
    regex: str | None = None,
    json_schema: Any = None,
    ebnf: str | None = None,
    choices: Sequence[str] | None = None,
    structural_tag: dict[str, Any] | str | None = None,
    dtype: Any = None,
    return_logprobs: bool = False,
    top_logprobs: int | None = None,
) -> Gen:
    """Generate text into variable `name` (None: append without naming it).

    At most one constraint: `regex`, `json_schema` (dict, JSON string or pydantic model
    class), `ebnf`, `choices`, `structural_tag` (tagged sections, e.g. tool calls), or `dtype`
    (int, float, bool, str: parsed into that type).
    """
    args = dict(locals())
    params = {_RENAMES.get(k, k): v for k, v in args.items() if _is_sampling(k) and v is not None}
    for key, value in (("stop", stop), ("stop_regex", stop_regex)):
        if value is not None:
            params[key] = [value] if isinstance(value, str) else list(value)
    if choices is not None:
        params["choices"] = list(choices)
    if return_logprobs:
        params["return_logprob"] = True
        params["top_logprobs_num"] = top_logprobs or 0
    schema_type = None
    if json_schema is not None:
        params["json_schema"], schema_type = schema_text(json_schema)
    if dtype is not None:
        if dtype not in DTYPE_REGEX:
            raise TypeError(f"gen(dtype=...) takes int, float, bool or str, not {dtype!r}")
        if regex is not None:
            raise ValueError("gen: give dtype or regex, not both")
        params["regex"] = DTYPE_REGEX[dtype]
    return Gen(name, params, dtype=dtype or schema_type, where=caller_location())


def _is_sampling(key: str) -> bool:
    return key not in (
        "name",
        "json_schema",
        "dtype",
        "return_logprobs",
        "top_logprobs",
        "stop",
        "stop_regex",
    )


def schema_text(schema: Any) -> tuple[str, Any]:
    """(JSON text of the schema, the pydantic class to parse results into, or None)."""
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return json.dumps(schema.model_json_schema()), schema
    if isinstance(schema, dict):
        return json.dumps(schema), None
    if isinstance(schema, str):
        json.loads(schema)  # raises a clear JSONDecodeError on bad input
        return schema, None
    raise TypeError("json_schema must be a dict, a JSON string or a pydantic model class")


def select(
    name: str | None = None,
    choices: Sequence[str] = (),
    *,
    method: str = "token_length_normalized",
) -> Select:
    """Pick one of `choices` by the model's likelihood of each as a continuation.

    `method`: "token_length_normalized" (mean token logprob, the default), "greedy_token"
    (compare token by token as greedy decoding would), "unconditional_likelihood_normalized"
    (mean logprob minus the choice's mean logprob without the prompt).
    """
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError("select needs a non-empty list of non-empty strings")
    if method not in SELECT_METHODS:
        raise ValueError(f"select: method must be one of {SELECT_METHODS}")
    return Select(name, tuple(choices), method, where=caller_location())


def _role(role: str, expr: NodeLike) -> Concat:
    return Concat((RoleBegin(role), as_node(expr), RoleEnd(role)))


def system(expr: NodeLike = "") -> Concat:
    """A system message through the model's chat template."""
    return _role("system", expr)


def user(expr: NodeLike = "") -> Concat:
    """A user message through the model's chat template."""
    return _role("user", expr)


def assistant(expr: NodeLike = "") -> Concat:
    """An assistant message; a `gen` inside it stops at the end-of-turn token."""
    return _role("assistant", expr)

"""The words of the language: `gen`, `select` and the chat roles."""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from plait.backend.request.sampling_params import GEN_OPTIONS, SamplingParams
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
GEN_NAMES = {name: key for key, name in GEN_OPTIONS.items()}  # for error messages


def gen(name: str | None = None, *, dtype: Any = None, **options: Any) -> Gen:
    """Generate text into variable `name` (None: append without naming it).

    `options` are the engine's per-request options by their gen() names (`GEN_OPTIONS`,
    derived from `SamplingParams`): max_tokens, min_tokens, stop (str or list),
    stop_token_ids, stop_regex, temperature, top_p, top_k, min_p, frequency_penalty,
    presence_penalty, repetition_penalty, logit_bias, ignore_eos, skip_special_tokens,
    no_stop_trim, seed, return_logprobs, top_logprobs, logprob_start_len, any_whitespace,
    json_layout (dumps (default), compact, spaced, flexible), grammar_backend (xgrammar,
    llguidance, auto), strict_mode, jump_forward, close_on_length; and at most one
    constraint: `regex`, `json_schema` (dict, JSON string or pydantic model class), `ebnf`,
    `lark` (llguidance), `choices`, `json_object`, `structural_tag` (tagged sections, e.g.
    tool calls), or `dtype` (int, float, bool, str: parsed into that type). A value out of
    range raises ValueError here.
    """
    params = gen_params(options)
    schema_type = None
    if "json_schema" in params:
        params["json_schema"], schema_type = schema_text(params["json_schema"])
    if dtype is not None:
        if dtype not in DTYPE_REGEX:
            raise TypeError(f"gen(dtype=...) takes int, float, bool or str, not {dtype!r}")
        if "regex" in params:
            raise ValueError("gen: give dtype or regex, not both")
        params["regex"] = DTYPE_REGEX[dtype]
    SamplingParams.from_dict(params, names=GEN_NAMES)  # a bad value fails at this gen
    return Gen(name, params, dtype=dtype or schema_type, where=caller_location())


def gen_params(
    options: Mapping[str, Any], *, allowed: Mapping[str, str] = GEN_OPTIONS
) -> dict[str, Any]:
    """Engine field -> value for gen()-named `options` (None values left out); an unknown
    name is a TypeError listing the known ones."""
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        known = ", ".join(sorted(allowed))
        raise TypeError(f"unknown option(s) {unknown}; plait takes: {known}")
    return {allowed[k]: _materialized(v) for k, v in options.items() if v is not None}


def _materialized(value: Any) -> Any:
    """A list for an iterable option given as a generator or other one-shot iterable (it
    is read when the gen is checked and again when it runs); other values unchanged."""
    if isinstance(value, (str, bytes, Mapping, type, list, tuple)):
        return value
    return list(value) if isinstance(value, Iterable) else value


def _gen_signature() -> inspect.Signature:
    """gen()'s signature as help() and editors show it: every option as a keyword."""
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("name", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)]
    params += [inspect.Parameter(k, kw, default=None) for k in ("dtype", *GEN_OPTIONS)]
    return inspect.Signature(params, return_annotation=Gen)


gen.__signature__ = _gen_signature()  # type: ignore[attr-defined]


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
    where = caller_location(3)
    return Concat((RoleBegin(role, where), as_node(expr), RoleEnd(role, where)))


def system(expr: NodeLike = "") -> Concat:
    """A system message through the model's chat template."""
    return _role("system", expr)


def user(expr: NodeLike = "") -> Concat:
    """A user message through the model's chat template."""
    return _role("user", expr)


def assistant(expr: NodeLike = "") -> Concat:
    """An assistant message; a `gen` inside it stops at the end-of-turn token."""
    return _role("assistant", expr)

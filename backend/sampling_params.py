"""Per-request sampling parameters, validated on arrival."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from plait.backend.stop_conditions import check_stop_regexes

GREEDY_EPS = 1e-6
MAX_TOP_LOGPROBS = 20
CONSTRAINT_FIELDS = ("json_schema", "regex", "ebnf", "choices", "json_object", "structural_tag")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request; field names follow SGLang's `sampling_params`.

    `temperature=0` is greedy. `top_k <= 0` disables top-k. `n > 1` draws parallel samples
    that share the prompt's KV cache. At most one constraint (`json_schema`, `regex`, `ebnf`,
    `choices`, `json_object`, `structural_tag`) may be set. Generation stops at the first
    `stop` string or `stop_regex` match (`re.search` on the output text), which is cut from the
    text unless `no_stop_trim`. A constrained output about to reach `max_new_tokens` inside an
    unfinished structure is completed by the engine (`close_on_length`; finish_reason
    "length" with `closed`) so that it stays in the constraint's language.
    """

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    stop_regex: tuple[str, ...] = ()
    no_stop_trim: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    seed: int | None = None
    n: int = 1
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    choices: tuple[str, ...] | None = None
    json_object: bool = False
    structural_tag: str | None = None
    any_whitespace: bool = False
    strict_mode: bool = True
    jump_forward: bool = True
    close_on_length: bool = True
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1

    @property
    def constraint(self) -> tuple[str, Any] | None:
        """(kind, value) of the one constraint set, or None."""
        for name in CONSTRAINT_FIELDS:
            value = getattr(self, name)
            if value not in (None, False):
                return name, value
        return None

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SamplingParams:
        """Build from a JSON-like dict; unknown keys and wrong types raise ValueError."""
        data = dict(data or {})
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"sampling_params: unknown field(s) {unknown}")
        for name in ("stop", "stop_regex"):
            if isinstance(data.get(name), str):
                data[name] = [data[name]]
        schema = data.get("json_schema")
        if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
            schema = schema.model_json_schema()  # a pydantic model class
        if isinstance(schema, dict):
            data["json_schema"] = _json_text("json_schema", schema)
        if isinstance(data.get("structural_tag"), dict):
            data["structural_tag"] = _json_text("structural_tag", data["structural_tag"])
        if data.get("logit_bias") is not None:
            data["logit_bias"] = _bias_pairs(data["logit_bias"])
        for name in ("stop", "stop_token_ids", "stop_regex", "choices"):
            if data.get(name) is not None:
                if not isinstance(data[name], (list, tuple)):
                    raise ValueError(f"sampling_params.{name} must be a list")
                data[name] = tuple(data[name])
        params = cls(**data)
        params.check_types()
        return params

    def check_types(self) -> None:
        """Raise ValueError naming the first field whose value has the wrong type."""
        for name, kind in FIELD_KINDS.items():
            value = getattr(self, name)
            if value is not None and not _TYPE_CHECKS[kind](value):
                raise ValueError(f"sampling_params.{name} has the wrong type: {value!r}")

    def validate(self, *, vocab_size: int) -> None:
        """Raise ValueError naming the first field out of its range."""
        self.check_types()
        checks = [
            (self.max_new_tokens >= 0, "max_new_tokens must be >= 0"),
            (self.min_new_tokens >= 0, "min_new_tokens must be >= 0"),
            (self.temperature >= 0, "temperature must be >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (self.repetition_penalty > 0, "repetition_penalty must be > 0"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty must be in [-2, 2]"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty must be in [-2, 2]"),
            (self.n >= 1, "n must be >= 1"),
            (0 <= self.top_logprobs_num <= MAX_TOP_LOGPROBS, "top_logprobs_num must be in [0, 20]"),
            (all(0 <= t < vocab_size for t in self.stop_token_ids), "stop_token_ids out of vocab"),
            (all(isinstance(s, str) and s for s in self.stop), "stop must be non-empty strings"),
            (
                all(0 <= t < vocab_size for t, _ in self.logit_bias),
                "logit_bias: token id out of vocab",
            ),
            (
                all(-100 <= b <= 100 for _, b in self.logit_bias),
                "logit_bias values must be in [-100, 100]",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"sampling_params: {message}")
        constraints = [
            name for name in CONSTRAINT_FIELDS if getattr(self, name) not in (None, False)
        ]
        if len(constraints) > 1:
            raise ValueError(f"sampling_params: at most one constraint, got {constraints}")
        if self.choices is not None and not self.choices:
            raise ValueError("sampling_params: choices must not be empty")
        try:
            check_stop_regexes(self.stop_regex)
        except ValueError as e:
            raise ValueError(f"sampling_params.{e}") from None

    def replace(self, **changes: Any) -> SamplingParams:
        return dataclasses.replace(self, **changes)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_float(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _json_text(name: str, value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"sampling_params.{name} cannot be written as JSON: {exc}") from None


def _bias_pairs(value: Any) -> tuple[tuple[int, float], ...]:
    """`{token_id: bias}` (ids as ints or decimal strings, as OpenAI sends them) or a list of
    pairs -> sorted (id, bias) pairs."""
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (list, tuple)) and all(
        isinstance(x, (list, tuple)) and len(x) == 2 for x in value
    ):
        items = list(value)
    else:
        raise ValueError("sampling_params.logit_bias must map token ids to biases")
    pairs = {}
    for key, bias in items:
        token = int(key) if isinstance(key, str) and key.strip().lstrip("-").isdigit() else key
        if not _is_int(token) or not _is_float(bias):
            raise ValueError(f"sampling_params.logit_bias: bad entry {key!r}: {bias!r}")
        pairs[token] = float(bias)
    return tuple(sorted(pairs.items()))


_TYPE_CHECKS: Mapping[str, Callable[[Any], bool]] = MappingProxyType(
    {
        "bool": lambda v: isinstance(v, bool),
        "int": _is_int,
        "float": _is_float,
        "str": lambda v: isinstance(v, str),
        "strs": lambda v: all(isinstance(x, str) for x in v),
        "ints": lambda v: all(_is_int(x) for x in v),
        "bias": lambda v: all(_is_int(t) and _is_float(b) for t, b in v),
    }
)


def _field_kind(name: str, default: Any) -> str:
    if name in ("stop", "stop_regex", "choices"):
        return "strs"
    if name == "stop_token_ids":
        return "ints"
    if name == "logit_bias":
        return "bias"
    if name == "seed":
        return "int"
    for kind, cls in (("bool", bool), ("int", int), ("float", float)):
        if isinstance(default, cls):
            return kind
    return "str"


# The type every field must have, read once from the dataclass defaults.
FIELD_KINDS: Mapping[str, str] = MappingProxyType(
    {
        f.name: _field_kind(f.name, f.default)
        for f in dataclasses.fields(SamplingParams)
        if f.name != "extra"
    }
)

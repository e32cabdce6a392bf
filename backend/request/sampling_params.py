"""Per-request sampling parameters: the one definition of every field.

Each field's type, range and default is declared once, on `SamplingParams`, together with
how it is spelled outside the engine (`Wire`): its keyword in `plait.gen()` and its name on
the OpenAI endpoints. Everything else is derived from these declarations: validation (with
a message naming the field), `gen()`'s keywords (`GEN_OPTIONS`), a program run's defaults
(`RUN_OPTIONS`), the OpenAI request fields and their mapping (`OPENAI_FIELDS`), vLLM's
constraint fields (`VLLM_FIELDS`, `VLLM_GUIDED`), and what `OpenAIBackend` may send to
OpenAI itself (`OPENAI_STANDARD`). Field names are SGLang's `sampling_params` names, so the
native API needs no mapping.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from plait.backend.request.checks import RequestError
from plait.backend.request.limits import check_json_values, check_literals, check_regex
from plait.backend.request.stop_conditions import check_stop_regexes

GREEDY_EPS = 1e-6
MAX_TOKENS = 2**31 - 1
MAX_N = 64
MAX_TOP_LOGPROBS = 20
MAX_SEED = 2**63 - 1
MIN_SEED = -(2**63)
MAX_TEMPERATURE = 1000.0
MAX_REPETITION_PENALTY = 100.0
MAX_STOPS = 64
MAX_STOP_CHARS = 4096
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGIT_BIAS = 1 << 18
MAX_CHOICES = 4096
MAX_CONSTRAINT_CHARS = 1 << 20
CONSTRAINT_FIELDS = (
    "json_schema",
    "regex",
    "ebnf",
    "lark",
    "choices",
    "json_object",
    "structural_tag",
)
# The grammar backends (plait.backend.grammar): xgrammar, llguidance, or per constraint the one
# that enforces all of it (`auto`; docs/structured.md).
GrammarBackend = Literal["xgrammar", "llguidance", "auto"]
GRAMMAR_BACKENDS: tuple[str, ...] = get_args(GrammarBackend)


@dataclass(frozen=True)
class Wire:
    """How a field is spelled outside the engine: `gen`, its keyword in `plait.gen()` (None:
    gen does not take it); `openai`, its name on the OpenAI endpoints (None: not there, or
    set through another field such as response_format); `standard`: OpenAI's own API has
    it (the only fields `OpenAIBackend` sends); `vllm`: its name in vLLM's
    `structured_outputs` (and, with `guided`, also as a `guided_<name>` field)."""

    gen: str | None
    openai: str | None
    standard: bool = False
    vllm: str | None = None
    guided: bool = False


Id = Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)]
Count = Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)]
Unit = Annotated[float, Field(strict=True, ge=0, le=1)]
Penalty = Annotated[float, Field(strict=True, ge=-2, le=2)]
StopText = Annotated[StrictStr, Field(min_length=1, max_length=MAX_STOP_CHARS)]
Constraint = Annotated[StrictStr, Field(max_length=MAX_CONSTRAINT_CHARS)]
JsonLayout = Literal["compact", "dumps", "spaced", "flexible"]  # plait.backend.grammar.layout
Bias = tuple[Id, Annotated[float, Field(strict=True, ge=-100, le=100)]]


def _same(name: str, *, standard: bool = False) -> Wire:
    return Wire(name, name, standard)


class SamplingParams(BaseModel):
    """How to sample one request; field names follow SGLang's `sampling_params`.

    `temperature=0` is greedy. `top_k <= 0` disables top-k. `n > 1` draws parallel samples
    that share the prompt's KV cache (sample i seeded with seed + i). At most one constraint
    (`json_schema`, `regex`, `ebnf`, `lark`, `choices`, `json_object`, `structural_tag`) may
    be set; `grammar_backend` picks the grammar backend that enforces it (None: the engine's
    `EngineConfig.grammar_backend`; `lark` grammars need llguidance).
    Generation stops at the first `stop` string or `stop_regex` match (`re.search` on the
    output text), which is cut from the text unless `no_stop_trim`. A constrained output
    about to reach `max_new_tokens` inside an unfinished structure is completed by the
    engine (`close_on_length`; finish_reason "length" with `closed`) so that it stays in the
    constraint's language. With a reasoning model (`EngineConfig.reasoning_parser`, or
    `reasoning=True`) the constraint applies only after the reasoning section ends
    (`reasoning=False`: from the first token); `max_reasoning_tokens` ends the section by
    writing its end marker once it has that many tokens. Every number is range-checked
    here; token ids against the model's vocabulary in `check_vocab`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    max_new_tokens: Annotated[Count, Wire("max_tokens", "max_tokens", standard=True)] = 128
    min_new_tokens: Annotated[Count, Wire("min_tokens", "min_tokens")] = 0
    temperature: Annotated[
        float, Field(strict=True, ge=0, le=MAX_TEMPERATURE), _same("temperature", standard=True)
    ] = 1.0
    top_p: Annotated[float, Field(strict=True, gt=0, le=1), _same("top_p", standard=True)] = 1.0
    top_k: Annotated[StrictInt, Field(ge=-1, le=MAX_TOKENS), _same("top_k")] = -1
    min_p: Annotated[Unit, _same("min_p")] = 0.0
    repetition_penalty: Annotated[
        float, Field(strict=True, gt=0, le=MAX_REPETITION_PENALTY), _same("repetition_penalty")
    ] = 1.0
    frequency_penalty: Annotated[Penalty, _same("frequency_penalty", standard=True)] = 0.0
    presence_penalty: Annotated[Penalty, _same("presence_penalty", standard=True)] = 0.0
    logit_bias: Annotated[
        tuple[Bias, ...], Field(max_length=MAX_LOGIT_BIAS), _same("logit_bias", standard=True)
    ] = ()
    stop: Annotated[
        tuple[StopText, ...], Field(max_length=MAX_STOPS), _same("stop", standard=True)
    ] = ()
    stop_token_ids: Annotated[
        tuple[Id, ...], Field(max_length=MAX_STOP_TOKEN_IDS), _same("stop_token_ids")
    ] = ()
    stop_regex: Annotated[
        tuple[StopText, ...], Field(max_length=MAX_STOPS), _same("stop_regex")
    ] = ()
    no_stop_trim: Annotated[StrictBool, _same("no_stop_trim")] = False
    ignore_eos: Annotated[StrictBool, _same("ignore_eos")] = False
    skip_special_tokens: Annotated[StrictBool, _same("skip_special_tokens")] = True
    seed: Annotated[
        StrictInt | None, Field(ge=MIN_SEED, le=MAX_SEED), _same("seed", standard=True)
    ] = None
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N), Wire(None, "n")] = 1
    return_logprob: Annotated[StrictBool, Wire("return_logprobs", None)] = False
    top_logprobs_num: Annotated[
        StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS), Wire("top_logprobs", None)
    ] = 0
    logprob_start_len: Annotated[
        StrictInt, Field(ge=-1, le=MAX_TOKENS), Wire("logprob_start_len", None)
    ] = -1
    json_schema: Annotated[
        Constraint | None, Wire("json_schema", None, vllm="json", guided=True)
    ] = None
    regex: Annotated[Constraint | None, Wire("regex", "regex", vllm="regex", guided=True)] = None
    ebnf: Annotated[Constraint | None, Wire("ebnf", "ebnf", vllm="grammar", guided=True)] = None
    lark: Annotated[Constraint | None, _same("lark")] = None
    choices: Annotated[
        tuple[StrictStr, ...] | None,
        Field(min_length=1, max_length=MAX_CHOICES),
        Wire("choices", None, vllm="choice", guided=True),
    ] = None
    json_object: Annotated[StrictBool, Wire("json_object", None, vllm="json_object")] = False
    structural_tag: Annotated[
        Constraint | None, Wire("structural_tag", None, vllm="structural_tag")
    ] = None
    grammar_backend: Annotated[GrammarBackend | None, _same("grammar_backend")] = None
    any_whitespace: Annotated[StrictBool, _same("any_whitespace")] = False
    json_layout: Annotated[JsonLayout | None, _same("json_layout")] = None
    strict_mode: Annotated[StrictBool, _same("strict_mode")] = True
    jump_forward: Annotated[StrictBool, _same("jump_forward")] = True
    close_on_length: Annotated[StrictBool, _same("close_on_length")] = True
    reasoning: Annotated[StrictBool | None, _same("reasoning")] = None
    max_reasoning_tokens: Annotated[Count | None, _same("max_reasoning_tokens")] = None

    # --- derived views ----------------------------------------------------------------
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

    # --- construction -----------------------------------------------------------------
    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any] | None,
        *,
        names: Mapping[str, str] | None = None,
        lax: bool = False,
    ) -> SamplingParams:
        """Build from a JSON-like dict; an unknown field, a wrong type or a value out of
        range raises `SamplingError` naming the field, as `names` spells it (engine field ->
        the caller's name, e.g. max_new_tokens -> max_tokens on the OpenAI endpoints).
        `lax` first converts scalars the way OpenAI-compatible servers do (3.0 -> 3 for an
        integer, "0.5" -> 0.5, 1 -> True); the ranges are the same either way."""
        values = dict(data or {})
        if lax:
            values = {k: _lax_scalar(k, v) for k, v in values.items()}
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise SamplingError.of(exc, names or {}) from None

    def replace(self, **changes: Any) -> SamplingParams:
        """A copy with `changes`, validated like any new request (a bad value raises
        SamplingError naming the field)."""
        return type(self).from_dict({**self.__dict__, **changes})

    def check_vocab(self, *, vocab_size: int) -> None:
        """Raise ValueError naming the first field with a token id outside the model's
        vocabulary (the one check that needs the model)."""
        if any(t >= vocab_size for t in self.stop_token_ids):
            raise ValueError("sampling_params.stop_token_ids: token id out of the vocabulary")
        if any(t >= vocab_size for t, _ in self.logit_bias):
            raise ValueError("sampling_params.logit_bias: token id out of the vocabulary")

    @field_validator("stop", "stop_regex", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("json_schema", mode="before")
    @classmethod
    def _schema_text(cls, value: Any) -> Any:
        if isinstance(value, type) and hasattr(value, "model_json_schema"):
            value = value.model_json_schema()  # a pydantic model class
        return _json_text("json_schema", value) if isinstance(value, (dict, bool)) else value

    @field_validator("structural_tag", mode="before")
    @classmethod
    def _tag_text(cls, value: Any) -> Any:
        return _json_text("structural_tag", value) if isinstance(value, dict) else value

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _bias_pairs(cls, value: Any) -> Any:
        return () if value is None else bias_pairs(value)

    @field_validator("stop_regex")
    @classmethod
    def _usable_patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        check_stop_regexes(value)
        return value

    @field_validator("regex")
    @classmethod
    def _regex_size(cls, value: str | None) -> str | None:
        if value is not None:
            check_regex(value)
        return value

    @field_validator("ebnf", "lark", "choices")
    @classmethod
    def _literal_size(cls, value: Any) -> Any:
        if value is not None:
            check_literals([value] if isinstance(value, str) else list(value), what="its text")
        return value

    @field_validator("grammar_backend")
    @classmethod
    def _takes_lark(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value == "xgrammar" and info.data.get("lark") is not None:
            raise ValueError("xgrammar does not take Lark grammars (use llguidance or auto)")
        return value

    @field_validator("json_schema", "structural_tag")
    @classmethod
    def _json_size(cls, value: str | None) -> str | None:
        if value is not None:
            check_json_values(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SamplingParams:
        given = [name for name in CONSTRAINT_FIELDS if getattr(self, name) not in (None, False)]
        if len(given) > 1:
            raise ValueError(f"at most one constraint, got {given}")
        if self.seed is not None and self.seed + self.n - 1 > MAX_SEED:
            raise ValueError(f"seed + n - 1 must be <= {MAX_SEED} (sample i uses seed + i)")
        return self


class SamplingError(RequestError):
    """Invalid sampling parameters; `field` is the offending field (None when several)."""

    @classmethod
    def of(cls, exc: ValidationError, names: Mapping[str, str]) -> SamplingError:
        """From pydantic's first error: `<field>: <problem>`, the field spelled by `names`."""
        err = exc.errors()[0]
        loc = [str(part) for part in err.get("loc", ())]
        message = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            message = "unknown field"
        if not loc:
            return cls(f"sampling_params: {message}", field=None)
        field = names.get(loc[0], loc[0])
        where = ".".join([field, *loc[1:]])
        prefix = "" if loc[0] in names else "sampling_params."
        return cls(f"{prefix}{where}: {message}", field=field)


def _json_text(name: str, value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"{name} cannot be written as JSON: {exc}") from None


def bias_pairs(value: Any) -> list[tuple[Any, Any]]:
    """`{token_id: bias}` (ids as ints or decimal strings, as OpenAI sends them) or a list of
    pairs -> (id, bias) pairs sorted by id; the field's own types check each pair."""
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (list, tuple)) and all(
        isinstance(x, (list, tuple)) and len(x) == 2 for x in value
    ):
        items = [tuple(x) for x in value]
    else:
        raise ValueError("must map token ids to biases")
    pairs = {_token_key(key): bias for key, bias in items}
    try:
        return sorted(pairs.items())
    except TypeError:  # a key that is no token id: the field's types report it
        return list(pairs.items())


def _token_key(key: Any) -> Any:
    if isinstance(key, str) and key.strip().lstrip("-").isdigit() and len(key) < 20:
        return int(key)
    if not isinstance(key, int):
        raise ValueError(f"token ids must be integers, got {key!r}")
    return key


def _lax_scalar(name: str, value: Any) -> Any:
    """`value` converted to the plain type of field `name` (int, float or bool) when pydantic's
    lax mode would convert it; anything else unchanged (strict validation then reports it)."""
    kind = _SCALARS.get(name)
    if kind is None or value is None:
        return value
    try:
        return kind.validate_python(value)
    except ValidationError:
        return value


# --- derived from the declarations above ---------------------------------------------------
_SCALARS: Mapping[str, TypeAdapter[Any]] = MappingProxyType(
    {
        name: TypeAdapter(kind)
        for name, info in SamplingParams.model_fields.items()
        if (kind := info.annotation) is not None and kind in (int, float, bool, int | None)
    }
)
WIRE: Mapping[str, Wire] = MappingProxyType(
    {
        name: next(m for m in info.metadata if isinstance(m, Wire))
        for name, info in SamplingParams.model_fields.items()
    }
)
GEN_OPTIONS: Mapping[str, str] = MappingProxyType(
    {w.gen: name for name, w in WIRE.items() if w.gen is not None}
)
RUN_OPTIONS: Mapping[str, str] = MappingProxyType(
    {key: name for key, name in GEN_OPTIONS.items() if name not in CONSTRAINT_FIELDS}
)
OPENAI_FIELDS: Mapping[str, str] = MappingProxyType(
    {w.openai: name for name, w in WIRE.items() if w.openai is not None}
)
VLLM_FIELDS: Mapping[str, str] = MappingProxyType(
    {w.vllm: name for name, w in WIRE.items() if w.vllm is not None}
)
VLLM_GUIDED: Mapping[str, str] = MappingProxyType(
    {f"guided_{w.vllm}": name for name, w in WIRE.items() if w.guided}
)
OPENAI_STANDARD: Mapping[str, str] = MappingProxyType(
    {name: w.openai for name, w in WIRE.items() if w.standard and w.openai is not None}
)

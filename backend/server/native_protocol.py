"""SGLang's native `/generate` request: every field of `GenerateReqInput` (sglang 0.5.23),
plus the `model` field that SGLang's Model Gateway adds to the bodies it forwards.

Each field has one role, declared once on the field itself (`role_of`, `fields_with`):

- used: plait reads it (`text`, `input_ids`, `sampling_params`, the logprob fields, ...);
  wrong types and out-of-range values are a 400 naming the field;
- ignored: a hint for SGLang's own machinery (sessions, priorities, routing, prefill/decode
  disaggregation, tracing, metric labels, multimodal tiling) that changes nothing plait
  answers: accepted with SGLang's type, then dropped;
- off: a feature plait does not have (images, LoRA, hidden states, custom logit processors,
  ...): accepted at its "off" value (its default, None, False, or empty), anything else is a
  400 "FIELD: not supported by plait" (`check_supported`), never silently ignored.

Unknown fields are refused ("FIELD: Extra inputs are not permitted"), as SGLang's own
server refuses them. docs/server.md lists every field with its role.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

from plait.backend.request.sampling_params import MAX_TOP_LOGPROBS
from plait.backend.server.protocol import ApiError

Role = Literal["used", "ignored", "off"]
ROLE_KEY = "x-plait-role"
IGNORED_NOTE = "SGLang compatibility: accepted and ignored by plait"
OFF_NOTE = "SGLang compatibility: not supported by plait; only its off value is accepted"

OptStr = str | None
OptStrs = str | list[str | None] | None
OptInts = int | list[int | None] | None
OptBools = bool | list[bool] | None
OptDict = dict[str, Any] | None
HiddenStates = bool | Literal["last"]
LogprobsMode = Literal["selected", "support"]
TopN = Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)]
Start = Annotated[int, Field(ge=-1)]  # -1: the last prompt token only


def ignored(default: Any = None) -> Any:
    """A field accepted and dropped."""
    return Field(default, description=IGNORED_NOTE, json_schema_extra={ROLE_KEY: "ignored"})


def off(default: Any = None) -> Any:
    """A field accepted only at its off value (`is_off`)."""
    return Field(default, description=OFF_NOTE, json_schema_extra={ROLE_KEY: "off"})


def role_of(info: FieldInfo) -> Role:
    """A field's role: `ignored` / `off` as declared, else `used`."""
    extra = info.json_schema_extra
    role = extra.get(ROLE_KEY, "used") if isinstance(extra, dict) else "used"
    assert role in ("used", "ignored", "off"), role
    return role  # type: ignore[return-value]


def is_off(value: Any, default: Any) -> bool:
    """None, False, the default, an empty list or dict, or a list of such values."""
    if value is None or value is False or value == default:
        return True
    if isinstance(value, dict | list) and not value:
        return True
    return isinstance(value, list) and all(is_off(item, default) for item in value)


class GenerateRequest(BaseModel):
    """POST /generate, in SGLang's `GenerateReqInput` format (strict: `"true"` is no bool,
    `false` no token id)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # --- used -----------------------------------------------------------------------------
    model: str | None = None  # the served model (the gateway adds it); any other is a 400
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    rid: str | list[str] | None = None
    return_logprob: OptBools = None
    logprob_start_len: Start | list[Start] | None = None
    top_logprobs_num: TopN | list[TopN] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False

    # --- ignored: hints for SGLang's machinery --------------------------------------------
    session_id: OptStr = ignored()
    log_metrics: bool = ignored(True)
    modalities: list[str | None] | None = ignored()
    mm_hashes: list[str] | list[list[str]] | None = ignored()
    mm_content_hashes: list[str | None] | list[list[str | None]] | None = ignored()
    use_audio_in_video: bool = ignored(False)
    video_config: OptDict = ignored()
    routed_experts_start_len: int = ignored(0)
    bootstrap_host: OptStrs = ignored()
    bootstrap_port: OptInts = ignored()
    bootstrap_room: OptInts = ignored()
    bootstrap_pair_key: OptStrs = ignored()
    decode_tp_size: OptInts = ignored()
    routed_dp_rank: int | None = ignored()
    data_parallel_rank: int | None = ignored()
    disagg_prefill_dp_rank: int | None = ignored()
    routing_key: OptStr = ignored()
    conversation_id: OptStr = ignored()
    http_worker_ipc: OptStr = ignored()
    background: bool = ignored(False)
    priority: int | None = ignored()
    no_logs: bool = ignored(False)  # plait logs no prompts or outputs
    custom_labels: dict[str, str] | None = ignored()
    external_trace_header: OptDict = ignored()
    received_time: float | None = ignored()
    need_wait_for_mm_inputs: bool | None = ignored()
    num_items_assigned: dict[str, list[int]] | None = ignored()
    encoder_urls: list[str] | None = ignored()
    max_dynamic_patch: int | None = ignored()
    min_dynamic_patch: int | None = ignored()
    image_max_dynamic_patch: int | None = ignored()
    video_max_dynamic_patch: int | None = ignored()
    images_config: OptDict = ignored()
    mm_processor_kwargs: OptDict = ignored()
    kv_hints: dict[str, Any] | list[dict[str, Any] | None] | None = ignored()

    # --- off: features plait does not have ------------------------------------------------
    input_embeds: list[list[float]] | list[list[list[float]]] | None = off()
    image_data: Any = off()
    video_data: Any = off()
    audio_data: Any = off()
    watermark: Any = off()
    token_ids_logprob: list[int] | list[list[int]] | None = off()
    return_sampling_mask: OptBools = off()
    sampling_logprobs_mode: LogprobsMode | list[LogprobsMode | None] | None = off()
    return_flat_raw_top_logprobs: bool = off(False)
    return_flat_raw_output_top_logprobs: bool = off(False)
    return_flat_raw_top_logprobs_b64: bool = off(False)
    return_hidden_states: HiddenStates | list[HiddenStates] = off(False)
    return_routed_experts: bool = off(False)
    return_indexer_topk: bool = off(False)
    session_params: OptDict = off()
    lora_path: OptStrs = off()
    lora_id: OptStrs = off()
    custom_logit_processor: OptStrs = off()
    positional_embed_overrides: Any = off()
    require_reasoning: bool = off(False)
    max_thinking_tokens: int | None = off()
    extra_key: str | list[str] | None = off()  # a cache namespace: plait's cache is shared
    cache_salt: str | list[str] | None = off()  # (the same)
    return_bytes: bool = off(False)
    return_entropy: bool = off(False)
    return_prompt_token_ids: bool = off(False)
    multi_item_delimiter_indices: list[int] | list[list[int]] | None = off()
    token_indices_to_pool: list[int] | list[list[int]] | None = off()

    def check_supported(self) -> None:
        """A 400 naming the first `off` field given a value other than its off value."""
        for name, info in type(self).model_fields.items():
            if role_of(info) == "off" and not is_off(getattr(self, name), info.default):
                raise ApiError(400, f"{name}: not supported by plait", param=name)


def fields_with(role: Role) -> tuple[str, ...]:
    """The names of GenerateRequest's fields of one role, in declaration order."""
    fields = GenerateRequest.model_fields
    return tuple(name for name, info in fields.items() if role_of(info) == role)


class ProfileBody(BaseModel):
    """POST /start_profile's optional body (for the schema: `ProfileRequest` checks it)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    output_dir: str | None = None  # a relative subdirectory of --profile-dir
    num_steps: int | None = Field(default=None, ge=1)

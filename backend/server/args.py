"""`plait serve`'s flags and what they configure: `ServerSettings` (the HTTP side), `ServerArgs`
(those plus the engine's config), the parser's arguments and the flags that reproduce a
configuration (for the workers `plait serve --dp N` starts).

Every EngineConfig field is a flag (`--kv-tokens`, `--chunked-prefill-size`, ...; booleans
as `--flag/--no-flag`), plus the short forms `--max-running` and `--chunked-prefill`. Nothing
here loads the runtime, so `plait router` and the `--dp` launcher stay light.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from plait.backend.config import EngineConfig
from plait.backend.server.auth import AccessKeys, AuthConfig, add_key_arguments, keys_from_namespace

DEFAULT_MAX_BODY_BYTES = 16 << 20
ALIASES = {"max_running_requests": "--max-running", "chunked_prefill_size": "--chunked-prefill"}
HELP = {
    "model": (
        "a builtin name (plait-tiny, plait-small, smollm2-135m, gemma3-270m), a local Hugging "
        "Face model directory, or a .gguf file"
    ),
    "kv_tokens": "KV-cache pool size in tokens (default: from --kv-memory-mib or --mem-fraction)",
    "kv_memory_mib": "KV-cache pool size in MiB (default: from --mem-fraction)",
    "mem_fraction": (
        "share of the GPU's free memory (default 0.8) or the CPU's available RAM (0.25) the "
        "KV-cache pool may take"
    ),
    "max_running_requests": "most requests decoded together",
    "chunked_prefill_size": "prompt tokens per prefill chunk (0: no chunking)",
    "profile_dir": (
        "the only directory /start_profile writes traces under (default: $PLAIT_PROFILE_DIR; "
        "without either, profiling is refused)"
    ),
    "activation_bits": (
        "bits the CPU's quantized matmuls hold each activation in: 16 (default) or 8 "
        "(llama.cpp's precision, about 1.3x faster)"
    ),
    "grammar_workers": "processes that compile grammars (one past its deadline is killed)",
    "grammar_timeout_s": "seconds a grammar may take to compile, queueing included",
    "grammar_backend": (
        "xgrammar, llguidance, or auto (default: per constraint, xgrammar unless it would warn "
        "about a keyword that llguidance enforces; a request may choose its own)"
    ),
}


@dataclass(frozen=True)
class ServerSettings:
    """HTTP-side settings: the name the model is served under; who may call (`auth`); the
    largest request body; whether a request may bring its own chat template, and the bounds
    templates render under; after how long without a scheduler heartbeat /health reports
    503; how long to keep reporting unhealthy before shutting down after a child died."""

    model_name: str | None = None
    auth: AuthConfig = field(default_factory=AuthConfig)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    allow_request_chat_template: bool = False
    template_timeout_s: float = 5.0
    health_stall_s: float = 30.0
    fatal_grace_s: float = 1.0


@dataclass(frozen=True)
class ServerArgs:
    """Everything `plait serve` needs: HTTP settings plus the engine's config."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    host: str = "127.0.0.1"
    port: int = 30000
    settings: ServerSettings = field(default_factory=ServerSettings)
    log_level: str = "info"
    keys: AccessKeys = field(default_factory=AccessKeys)


# --- flags --------------------------------------------------------------------------------
def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `plait serve`: HTTP settings and one per EngineConfig field."""
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--served-model-name", default=None, help="model id in the API")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    _add_http_arguments(parser.add_argument_group("access and limits"))
    _add_engine_arguments(parser.add_argument_group("engine (EngineConfig fields)"))


def _add_http_arguments(group: argparse._ArgumentGroup) -> None:
    defaults = ServerSettings()
    add_key_arguments(group, admin=True)
    group.add_argument(
        "--max-body-bytes", type=int, default=defaults.max_body_bytes,
        help=f"largest request body; larger ones get 413 (default {defaults.max_body_bytes})",
    )  # fmt: skip
    group.add_argument(
        "--allow-request-chat-template", action="store_true",
        help="run chat templates that requests send (chat_template_kwargs.chat_template)",
    )  # fmt: skip
    group.add_argument(
        "--chat-template-timeout", type=float, default=defaults.template_timeout_s,
        help=f"seconds a chat template may render (default {defaults.template_timeout_s:g})",
    )  # fmt: skip
    group.add_argument(
        "--health-stall-timeout", type=float, default=defaults.health_stall_s,
        help="/health answers 503 once the scheduler has not reported for this many seconds "
        f"(default {defaults.health_stall_s:g})",
    )  # fmt: skip


def _add_engine_arguments(engine: argparse._ArgumentGroup) -> None:
    hints = typing.get_type_hints(EngineConfig)
    for f in dataclasses.fields(EngineConfig):
        flags = [f"--{f.name.replace('_', '-')}"] + ([ALIASES[f.name]] if f.name in ALIASES else [])
        text = f"{HELP.get(f.name, f.name.replace('_', ' '))} (default: {f.default})"
        kind = _flag_kind(hints[f.name])
        engine.add_argument(*flags, dest=f.name, default=f.default, help=text, **kind)


def _flag_kind(hint: Any) -> dict[str, Any]:
    """argparse options for a field annotated `hint` (int, float, str, bool, X | None)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) and len(args) == 1:
        hint = args[0]
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction}
    return {"type": hint, "metavar": hint.__name__.upper()}


def args_from_namespace(ns: argparse.Namespace) -> ServerArgs:
    engine = {f.name: getattr(ns, f.name) for f in dataclasses.fields(EngineConfig)}
    keys = keys_from_namespace(ns)
    settings = ServerSettings(
        model_name=ns.served_model_name,
        auth=keys.auth(),
        max_body_bytes=ns.max_body_bytes,
        allow_request_chat_template=ns.allow_request_chat_template,
        template_timeout_s=ns.chat_template_timeout,
        health_stall_s=ns.health_stall_timeout,
    )
    return ServerArgs(
        engine=EngineConfig(**engine),
        host=ns.host,
        port=ns.port,
        settings=settings,
        log_level=ns.log_level,
        keys=keys,
    )


def settings_flags(settings: ServerSettings) -> list[str]:
    """The HTTP flags (keys aside) that give `settings`: those that differ from the defaults."""
    defaults, flags = ServerSettings(), []
    if settings.model_name:
        flags += ["--served-model-name", settings.model_name]
    if settings.max_body_bytes != defaults.max_body_bytes:
        flags += ["--max-body-bytes", str(settings.max_body_bytes)]
    if settings.allow_request_chat_template:
        flags.append("--allow-request-chat-template")
    if settings.template_timeout_s != defaults.template_timeout_s:
        flags += ["--chat-template-timeout", repr(settings.template_timeout_s)]
    if settings.health_stall_s != defaults.health_stall_s:
        flags += ["--health-stall-timeout", repr(settings.health_stall_s)]
    return flags

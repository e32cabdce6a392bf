"""Compile constraints into xgrammar grammars, with a bounded cache.

A request's constraint becomes a `GrammarKey` (kind + normalized text + JSON options).
`build_grammar` turns a key into an xgrammar `Grammar` (schema rewriting and conversion, the
regex DFA: the part whose cost has no bound), in a compile worker process (`workers`);
`compile_built` compiles it against the vocabulary on a thread of the engine's process (cheap:
token masks are built at first use). Neither runs on the scheduler's thread. The cache of
compiled grammars and running jobs is cache.py's.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from dataclasses import dataclass
from typing import Any

import xgrammar as xgr

from plait.backend.grammar.layout import COMPACT, COMPACT_SEPARATORS, resolve_layout, schema_grammar
from plait.backend.grammar.regex_fsm import RegexFSM
from plait.backend.grammar.schema.hoist import moved_rules, splice_rules
from plait.backend.grammar.schema.rewrite import rewrite_schema
from plait.backend.grammar.schema.warnings import SchemaGap, gap_warnings, schema_gaps
from plait.backend.grammar.structural_tag import (
    StructuralTagError,
    expand_json_schemas,
    normalize_structural_tag,
)
from plait.backend.request.limits import regex_size
from plait.backend.request.sampling_params import SamplingParams

JSON_OBJECT_SCHEMA = '{"type":"object"}'
MAX_FSM_REGEX_SIZE = 2000  # larger regexes jump forward with xgrammar's string, no own DFA
_XGR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


class GrammarError(ValueError):
    """A constraint that cannot be compiled; the message names the problem."""


@dataclass(frozen=True)
class GrammarKey:
    """What a compiled grammar depends on: kind, normalized text, JSON options (`layout`,
    one of `layout.LAYOUTS`)."""

    kind: str
    text: str
    layout: str = COMPACT
    strict_mode: bool = True


@dataclass(frozen=True)
class CompiledConstraint:
    """A compiled grammar, its regex DFA (regex constraints) and the warnings it raises."""

    key: GrammarKey
    grammar: xgr.CompiledGrammar
    regex_fsm: RegexFSM | None = None
    warnings: tuple[str, ...] = ()
    compile_s: float = 0.0


def new_compiler(info: xgr.TokenizerInfo) -> xgr.GrammarCompiler:
    """The engine's compiler settings: our own LRU caches results, and token masks are built
    on first use (compiling a large schema takes milliseconds instead of seconds; the limits
    of `constraint_limits` keep that first use bounded)."""
    return xgr.GrammarCompiler(
        info, max_threads=1, cache_enabled=False, enable_dynamic_compilation=True
    )


def grammar_key(params: SamplingParams) -> GrammarKey:
    """The cache key of a request's constraint; raises GrammarError for malformed input."""
    constraint = params.constraint
    if constraint is None:
        raise GrammarError("the request has no constraint")
    kind, value = constraint
    layout = resolve_layout(layout=params.json_layout, any_whitespace=params.any_whitespace)
    if kind == "json_schema":
        return GrammarKey(kind, normalize_schema(value), layout, params.strict_mode)
    if kind == "json_object":
        return GrammarKey(kind, JSON_OBJECT_SCHEMA, layout, strict_mode=False)
    if kind == "choices":
        return GrammarKey(kind, json.dumps(list(value), ensure_ascii=False))
    if kind == "structural_tag":
        try:
            text = normalize_structural_tag(value)
        except StructuralTagError as exc:
            raise GrammarError(str(exc)) from exc
        return GrammarKey(kind, text, layout, params.strict_mode)
    return GrammarKey(kind, str(value) if kind == "regex" else str(value).strip())


def normalize_schema(value: str) -> str:
    """Compact JSON text of a schema (key order kept: it orders the generated properties)."""
    try:
        schema = json.loads(value)
    except json.JSONDecodeError as exc:
        raise GrammarError(f"json_schema is not valid JSON: {exc}") from exc
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"json_schema must be an object, got {type(schema).__name__}")
    return json.dumps(schema, separators=COMPACT_SEPARATORS, ensure_ascii=False)


def json_schema_grammar(key: GrammarKey, **options: Any) -> tuple[xgr.Grammar, list[SchemaGap]]:
    """The (uncompiled) grammar of a JSON key and the schema keywords it cannot enforce.
    The schema is first rewritten into an equivalent one xgrammar enforces more of."""
    schema = rewrite_schema(json.loads(key.text), strict_mode=key.strict_mode)
    text = json.dumps(schema, ensure_ascii=False)
    grammar = schema_grammar(text, layout=key.layout, strict_mode=key.strict_mode, **options)
    grammar = splice_rules(grammar, moved_rules(schema), layout=key.layout)  # hoist.py
    return grammar, schema_gaps(schema, strict_mode=key.strict_mode)


def choices_ebnf(choices: list[str]) -> str:
    """EBNF accepting exactly one of `choices` (string literals in JSON escaping)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


@dataclass(frozen=True)
class BuiltGrammar:
    """A key's grammar before compilation (no vocabulary yet), its regex DFA and warnings."""

    grammar: xgr.Grammar
    regex_fsm: RegexFSM | None = None
    warnings: tuple[str, ...] = ()


def build_grammar(key: GrammarKey) -> BuiltGrammar:
    """The grammar of one key: the costly, unbounded part (schema rewriting and conversion,
    the regex DFA), run in a compile worker process; raises GrammarError naming the problem."""
    try:
        return _build(key)
    except RuntimeError as exc:
        raise GrammarError(f"invalid {key.kind}: {clean_error(exc)}") from exc


def compile_built(
    compiler: xgr.GrammarCompiler, key: GrammarKey, built: BuiltGrammar, *, since: float
) -> CompiledConstraint:
    """Compile a built grammar against the vocabulary (token masks come at first use)."""
    try:
        grammar = compiler.compile_grammar(built.grammar)
    except RuntimeError as exc:
        raise GrammarError(f"invalid {key.kind}: {clean_error(exc)}") from exc
    elapsed = time.perf_counter() - since
    return CompiledConstraint(key, grammar, built.regex_fsm, built.warnings, elapsed)


def compile_key(compiler: xgr.GrammarCompiler, key: GrammarKey) -> CompiledConstraint:
    """Build and compile one key in this process (tests, benchmarks)."""
    start = time.perf_counter()
    return compile_built(compiler, key, build_grammar(key), since=start)


def _build(key: GrammarKey) -> BuiltGrammar:
    if key.kind in ("json_schema", "json_object"):
        grammar, warnings = _json_grammar(key)
        return BuiltGrammar(grammar, None, warnings)
    if key.kind == "regex":
        small = regex_size(key.text, cap=MAX_FSM_REGEX_SIZE) <= MAX_FSM_REGEX_SIZE
        fsm = RegexFSM.build(key.text) if small else None
        return BuiltGrammar(xgr.Grammar.from_regex(key.text), fsm)
    if key.kind == "choices":
        return BuiltGrammar(xgr.Grammar.from_ebnf(choices_ebnf(json.loads(key.text))))
    if key.kind == "ebnf":
        return BuiltGrammar(xgr.Grammar.from_ebnf(key.text))
    if key.kind == "structural_tag":
        text, warnings = expand_json_schemas(key.text, lambda schema: _section_ebnf(key, schema))
        return BuiltGrammar(xgr.Grammar.from_structural_tag(text), None, warnings)
    raise GrammarError(f"unknown constraint kind {key.kind!r}")


def _section_ebnf(key: GrammarKey, schema: Any) -> tuple[str, tuple[str, ...]]:
    """EBNF of one JSON section of a structural tag, with the tag request's JSON options."""
    text = json.dumps(schema, separators=COMPACT_SEPARATORS, ensure_ascii=False)
    grammar, warnings = _json_grammar(dataclasses.replace(key, kind="json_schema", text=text))
    return str(grammar), warnings


def _json_grammar(key: GrammarKey) -> tuple[xgr.Grammar, tuple[str, ...]]:
    """strict_mode forbids properties and items the schema does not list; when that leaves
    a schema unsatisfiable (e.g. minProperties above the listed properties), build it
    without strict mode and say so."""
    try:
        grammar, gaps = json_schema_grammar(key)
        return grammar, gap_warnings(gaps)
    except RuntimeError as exc:
        if not key.strict_mode:
            raise
        note = f"strict_mode was turned off for this schema ({clean_error(exc)})"
    grammar, gaps = json_schema_grammar(dataclasses.replace(key, strict_mode=False))
    return grammar, (note, *gap_warnings(gaps))


def clean_error(exc: BaseException) -> str:
    """xgrammar's message without its log prefix (time, C++ file and line)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _XGR_PREFIX.sub("", first)

"""Compile constraints into grammars of either backend, xgrammar or llguidance.

A request's constraint becomes a `GrammarKey` (kind + normalized text + JSON options + the
grammar backend). `build_grammar` turns a key into a serialized grammar (schema rewriting and
conversion, the regex DFA: the part whose cost has no bound), in a compile worker process
(`workers`): xgrammar's `Grammar` (here), llguidance's grammar text (`llg_build`), or for
`auto` the first of them that enforces every keyword. `compile_built` compiles it against
the vocabulary on a thread of the engine's process (cheap: xgrammar builds token masks at
first use, llguidance computes each mask when asked). Neither runs on the scheduler's thread.
The cache of compiled grammars and running jobs is cache.py's.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any

import xgrammar as xgr

from plait.backend.grammar.errors import GrammarError, clean_error
from plait.backend.grammar.keys import (
    AUTO,
    LLGUIDANCE,
    XGRAMMAR,
    BuiltGrammar,
    GrammarKey,
    key_backend,
)
from plait.backend.grammar.layout import COMPACT_SEPARATORS, resolve_layout, schema_grammar
from plait.backend.grammar.llg_build import build_llguidance
from plait.backend.grammar.llg_matcher import LlgCompiler
from plait.backend.grammar.regex_fsm import RegexFSM
from plait.backend.grammar.schema.hoist import moved_rules, splice_rules
from plait.backend.grammar.schema.rewrite import rewrite_schema
from plait.backend.grammar.schema.warnings import SchemaGap, gap_warnings, schema_gaps
from plait.backend.grammar.structural_tag import (
    StructuralTagError,
    expand_json_schemas,
    normalize_structural_tag,
)
from plait.backend.grammar.vocab import Vocab
from plait.backend.request.sampling_params import SamplingParams

JSON_OBJECT_SCHEMA = '{"type":"object"}'


@dataclass(frozen=True)
class CompiledConstraint:
    """A compiled grammar (xgrammar's `CompiledGrammar`, or llguidance's template matcher),
    the backend that compiled it, its regex DFA (regex constraints) and its warnings."""

    key: GrammarKey
    grammar: Any
    regex_fsm: RegexFSM | None = None
    warnings: tuple[str, ...] = ()
    compile_s: float = 0.0
    backend: str = XGRAMMAR


def new_compiler(info: xgr.TokenizerInfo) -> xgr.GrammarCompiler:
    """The engine's compiler settings: our own LRU caches results, and token masks are built
    on first use (compiling a large schema takes milliseconds instead of seconds; the limits
    of `constraint_limits` keep that first use bounded)."""
    return xgr.GrammarCompiler(
        info, max_threads=1, cache_enabled=False, enable_dynamic_compilation=True
    )


def grammar_key(params: SamplingParams, *, backend: str = XGRAMMAR) -> GrammarKey:
    """The cache key of a request's constraint, with its backend (the request's, else
    `backend`, the engine's); raises GrammarError for malformed input."""
    constraint = params.constraint
    if constraint is None:
        raise GrammarError("the request has no constraint")
    kind, value = constraint
    chosen = key_backend(kind, params.grammar_backend or backend)
    layout = resolve_layout(layout=params.json_layout, any_whitespace=params.any_whitespace)
    if kind == "json_schema":
        return GrammarKey(kind, normalize_schema(value), layout, params.strict_mode, chosen)
    if kind == "json_object":
        return GrammarKey(kind, JSON_OBJECT_SCHEMA, layout, strict_mode=False, backend=chosen)
    if kind == "choices":
        return GrammarKey(kind, json.dumps(list(value), ensure_ascii=False), backend=chosen)
    if kind == "structural_tag":
        try:
            text = normalize_structural_tag(value)
        except StructuralTagError as exc:
            raise GrammarError(str(exc)) from exc
        return GrammarKey(kind, text, layout, params.strict_mode, chosen)
    text = str(value) if kind == "regex" else str(value).strip()
    return GrammarKey(kind, text, backend=chosen)


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


def build_grammar(key: GrammarKey) -> BuiltGrammar:
    """The grammar of one key: the costly, unbounded part (schema rewriting and conversion,
    the regex DFA), run in a compile worker process; raises GrammarError naming the problem.
    For `auto`: xgrammar's grammar when it raises no warning, else llguidance's when that
    enforces every keyword (no warning either), else xgrammar's with its warnings."""
    if key.backend == LLGUIDANCE:
        return build_llguidance(key)
    if key.backend != AUTO:
        return _xgrammar(key)
    try:
        built: BuiltGrammar | GrammarError = _xgrammar(dataclasses.replace(key, backend=XGRAMMAR))
    except GrammarError as exc:
        built = exc
    if isinstance(built, BuiltGrammar) and not built.warnings:
        return built
    try:
        other = build_llguidance(dataclasses.replace(key, backend=LLGUIDANCE))
    except GrammarError:
        if isinstance(built, GrammarError):
            raise built from None
        return built
    return built if isinstance(built, BuiltGrammar) and other.warnings else other


def _xgrammar(key: GrammarKey) -> BuiltGrammar:
    try:
        grammar, fsm, warnings = _build(key)
    except RuntimeError as exc:
        raise GrammarError(f"invalid {key.kind}: {clean_error(exc)}") from exc
    return BuiltGrammar(XGRAMMAR, grammar.serialize_json(), fsm, warnings)


class Compilers:
    """Both backends' compilers for one model's vocabulary (one per compile thread:
    xgrammar's compiler is not shared between threads; llguidance's is the vocabulary's)."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.xgr = new_compiler(vocab.info)

    @property
    def llg(self) -> LlgCompiler:
        return self.vocab.llg_compiler

    def compile(self, built: BuiltGrammar) -> Any:
        """The compiled grammar (raises RuntimeError or ValueError with the backend's
        message)."""
        if built.backend == LLGUIDANCE:
            return self.llg.compile(built.data)
        return self.xgr.compile_grammar(xgr.Grammar.deserialize_json(built.data))


def compile_built(
    compilers: Compilers, key: GrammarKey, built: BuiltGrammar, *, since: float
) -> CompiledConstraint:
    """Compile a built grammar against the vocabulary (token masks come at first use)."""
    try:
        grammar = compilers.compile(built)
    except (RuntimeError, ValueError) as exc:
        raise GrammarError(f"invalid {key.kind}: {clean_error(exc)}") from exc
    elapsed = time.perf_counter() - since
    return CompiledConstraint(
        key, grammar, built.regex_fsm, built.warnings, elapsed, backend=built.backend
    )


def compile_key(compilers: Compilers, key: GrammarKey) -> CompiledConstraint:
    """Build and compile one key in this process (tests, benchmarks)."""
    start = time.perf_counter()
    return compile_built(compilers, key, build_grammar(key), since=start)


def _build(key: GrammarKey) -> tuple[xgr.Grammar, RegexFSM | None, tuple[str, ...]]:
    if key.kind in ("json_schema", "json_object"):
        grammar, warnings = _json_grammar(key)
        return grammar, None, warnings
    if key.kind == "regex":
        return xgr.Grammar.from_regex(key.text), RegexFSM.bounded(key.text), ()
    if key.kind == "choices":
        return xgr.Grammar.from_ebnf(choices_ebnf(json.loads(key.text))), None, ()
    if key.kind == "ebnf":
        return xgr.Grammar.from_ebnf(key.text), None, ()
    if key.kind == "structural_tag":
        text, warnings = expand_json_schemas(key.text, lambda schema: _section_ebnf(key, schema))
        return xgr.Grammar.from_structural_tag(text), None, warnings
    raise GrammarError(f"{key.kind}: xgrammar does not take this constraint kind")


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

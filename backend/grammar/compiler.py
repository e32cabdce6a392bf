"""Compile constraints into xgrammar grammars off the scheduler thread, with a bounded cache.

A request's constraint becomes a `GrammarKey` (kind + normalized text + JSON options). Keys
are compiled on a small worker pool; requests with the same key share one compilation and,
once it is done, one cached `CompiledConstraint`. The scheduler thread owns the cache and the
job table, so no locks are needed: workers only run `compile_key` and record when they start.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import xgrammar as xgr

from plait.backend.grammar.regex_fsm import RegexFSM
from plait.backend.grammar.schema.rewrite import rewrite_schema
from plait.backend.grammar.schema.warnings import SchemaGap, gap_warnings, schema_gaps
from plait.backend.grammar.structural_tag import (
    StructuralTagError,
    expand_json_schemas,
    normalize_structural_tag,
)
from plait.backend.sampling_params import SamplingParams

# Whitespace between JSON tokens when any_whitespace is on: enough for indented output,
# too little for a model to flood the output with spaces.
MAX_JSON_WHITESPACE = 16
COMPACT_SEPARATORS = (",", ":")
JSON_OBJECT_SCHEMA = '{"type":"object"}'
_XGR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


class GrammarError(ValueError):
    """A constraint that cannot be compiled; the message names the problem."""


@dataclass(frozen=True)
class GrammarKey:
    """What a compiled grammar depends on: kind, normalized text, JSON layout options."""

    kind: str
    text: str
    any_whitespace: bool = False
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
    on first use (compiling a large schema takes milliseconds instead of seconds)."""
    return xgr.GrammarCompiler(
        info, max_threads=1, cache_enabled=False, enable_dynamic_compilation=True
    )


def grammar_key(params: SamplingParams) -> GrammarKey:
    """The cache key of a request's constraint; raises GrammarError for malformed input."""
    constraint = params.constraint
    if constraint is None:
        raise GrammarError("the request has no constraint")
    kind, value = constraint
    if kind == "json_schema":
        text = normalize_schema(value)
        return GrammarKey(kind, text, params.any_whitespace, params.strict_mode)
    if kind == "json_object":
        return GrammarKey(kind, JSON_OBJECT_SCHEMA, params.any_whitespace, strict_mode=False)
    if kind == "choices":
        return GrammarKey(kind, json.dumps(list(value), ensure_ascii=False))
    if kind == "structural_tag":
        try:
            text = normalize_structural_tag(value)
        except StructuralTagError as exc:
            raise GrammarError(str(exc)) from exc
        return GrammarKey(kind, text, params.any_whitespace, params.strict_mode)
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


def json_layout(*, any_whitespace: bool) -> dict[str, Any]:
    """xgrammar JSON options: compact output, or bounded whitespace between tokens."""
    if any_whitespace:
        return {"any_whitespace": True, "max_whitespace_cnt": MAX_JSON_WHITESPACE}
    return {"any_whitespace": False, "separators": COMPACT_SEPARATORS}


def json_schema_grammar(key: GrammarKey, **options: Any) -> tuple[xgr.Grammar, list[SchemaGap]]:
    """The (uncompiled) grammar of a JSON key and the schema keywords it cannot enforce.
    The schema is first rewritten into an equivalent one xgrammar enforces more of."""
    schema = rewrite_schema(json.loads(key.text))
    layout = {**json_layout(any_whitespace=key.any_whitespace), **options}
    text = json.dumps(schema, ensure_ascii=False)
    grammar = xgr.Grammar.from_json_schema(text, strict_mode=key.strict_mode, **layout)
    return grammar, schema_gaps(schema, strict_mode=key.strict_mode)


def choices_ebnf(choices: list[str]) -> str:
    """EBNF accepting exactly one of `choices` (string literals in JSON escaping)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def compile_key(compiler: xgr.GrammarCompiler, key: GrammarKey) -> CompiledConstraint:
    """Compile one key (runs on a worker thread); raises GrammarError naming the problem."""
    start = time.perf_counter()
    try:
        grammar, fsm, warnings = _compile(compiler, key)
    except RuntimeError as exc:
        raise GrammarError(f"invalid {key.kind}: {clean_error(exc)}") from exc
    elapsed = time.perf_counter() - start
    return CompiledConstraint(key, grammar, fsm, warnings, elapsed)


def _compile(
    compiler: xgr.GrammarCompiler, key: GrammarKey
) -> tuple[xgr.CompiledGrammar, RegexFSM | None, tuple[str, ...]]:
    if key.kind in ("json_schema", "json_object"):
        return _compile_json(compiler, key)
    if key.kind == "regex":
        return compiler.compile_regex(key.text), RegexFSM.build(key.text), ()
    if key.kind == "choices":
        return compiler.compile_grammar(choices_ebnf(json.loads(key.text))), None, ()
    if key.kind == "ebnf":
        return compiler.compile_grammar(key.text), None, ()
    if key.kind == "structural_tag":
        text, warnings = expand_json_schemas(key.text, lambda schema: _section_ebnf(key, schema))
        return compiler.compile_structural_tag(text), None, warnings
    raise GrammarError(f"unknown constraint kind {key.kind!r}")


def _compile_json(
    compiler: xgr.GrammarCompiler, key: GrammarKey
) -> tuple[xgr.CompiledGrammar, None, tuple[str, ...]]:
    grammar, warnings = _json_grammar(key)
    return compiler.compile_grammar(grammar), None, warnings


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


@dataclass
class CompileJob:
    """One key being compiled; `started` is set by the worker when it begins."""

    key: GrammarKey
    future: Future[CompiledConstraint] | None = None
    started: float | None = None


class GrammarCache:
    """Compiled grammars by key (LRU, `capacity` entries) and the jobs still compiling."""

    def __init__(self, *, compiler: xgr.GrammarCompiler, capacity: int, workers: int) -> None:
        self.compiler = compiler
        self.capacity = max(capacity, 0)
        self.entries: OrderedDict[GrammarKey, CompiledConstraint] = OrderedDict()
        self.jobs: dict[GrammarKey, CompileJob] = {}
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="plait-grammar")

    def get(self, key: GrammarKey) -> CompiledConstraint | None:
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
        return entry

    def start(self, key: GrammarKey) -> CompileJob:
        """The job compiling `key`, started now unless one is already running."""
        job = self.jobs.get(key)
        if job is None:
            job = CompileJob(key)
            job.future = self.pool.submit(self._run, job)
            self.jobs[key] = job
        return job

    def _run(self, job: CompileJob) -> CompiledConstraint:
        job.started = time.monotonic()
        return compile_key(self.compiler, job.key)

    def collect(self) -> None:
        """Move finished compilations into the cache (failed ones are dropped)."""
        for key, job in list(self.jobs.items()):
            assert job.future is not None
            if job.future.done():
                del self.jobs[key]
                if job.future.exception() is None:
                    self.put(job.future.result())

    def put(self, entry: CompiledConstraint) -> None:
        self.entries[entry.key] = entry
        self.entries.move_to_end(entry.key)
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

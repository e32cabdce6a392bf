"""What a grammar is built from and what a compile worker gives back, for either backend.

A request's constraint becomes a `GrammarKey`: its kind, normalized text, JSON options and the
grammar backend that builds it (`xgrammar`, `llguidance`, or `auto`: per constraint, the
first that enforces every keyword). A worker turns the key into a `BuiltGrammar`: the
serialized grammar of the backend that took it, its regex DFA and its warnings.
"""

from __future__ import annotations

from dataclasses import dataclass

from plait.backend.grammar.errors import GrammarError
from plait.backend.grammar.layout import COMPACT
from plait.backend.grammar.regex_fsm import RegexFSM
from plait.backend.request.sampling_params import GRAMMAR_BACKENDS

XGRAMMAR, LLGUIDANCE, AUTO = GRAMMAR_BACKENDS
# What `auto` may hand to llguidance: constraints with JSON schemas in them. Plain regexes,
# EBNF and choices go to xgrammar (both enforce them alike); Lark only llguidance reads.
AUTO_KINDS = frozenset({"json_schema", "json_object", "structural_tag"})


@dataclass(frozen=True)
class GrammarKey:
    """What a compiled grammar depends on: kind, normalized text, JSON options (`layout`,
    one of `layout.LAYOUTS`), and the grammar backend (`auto` only for `AUTO_KINDS`)."""

    kind: str
    text: str
    layout: str = COMPACT
    strict_mode: bool = True
    backend: str = XGRAMMAR


@dataclass(frozen=True)
class BuiltGrammar:
    """A key's grammar before compilation (no vocabulary yet): the backend that reads it,
    its serialized form (xgrammar's JSON, or llguidance's grammar text), its regex DFA and
    warnings."""

    backend: str
    data: str
    regex_fsm: RegexFSM | None = None
    warnings: tuple[str, ...] = ()


def key_backend(kind: str, backend: str) -> str:
    """The backend a key of `kind` names when `backend` is asked for: `auto` stays only
    where schemas decide it; Lark grammars are llguidance's."""
    if kind == "lark":
        if backend == XGRAMMAR:
            raise GrammarError(
                "lark: xgrammar does not take Lark grammars (grammar_backend llguidance or auto)"
            )
        return LLGUIDANCE
    if backend == AUTO and kind not in AUTO_KINDS:
        return XGRAMMAR
    return backend

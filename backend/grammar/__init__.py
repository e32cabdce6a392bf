"""Constrained decoding: grammars compiled from a request's constraint (JSON Schema, regex,
EBNF, Lark, choices, structural tags) with xgrammar or llguidance, token masks filled while the
forward runs, and the text the grammar writes itself (jump-forward, closing at the token
limit).

The scheduler sees only `GrammarHooks` (built by `make_grammar`) and the `Rewrite` it
returns after a sampled token.
"""

from plait.backend.grammar.backend import make_grammar
from plait.backend.grammar.hooks import GrammarHooks, MaskWaiter, Rewrite
from plait.backend.grammar.layout import FIXED_LAYOUTS, resolve_layout

__all__ = [
    "FIXED_LAYOUTS",
    "GrammarHooks",
    "MaskWaiter",
    "Rewrite",
    "make_grammar",
    "resolve_layout",
]

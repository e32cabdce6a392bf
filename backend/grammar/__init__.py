"""Constrained decoding: grammars compiled from a request's constraint (JSON Schema, regex,
EBNF, Lark, choices, structural tags) with xgrammar or llguidance, token masks filled while the
forward runs, and the text the grammar writes itself (jump-forward, closing at the token
limit).

The scheduler sees only `GrammarHooks` (`backend.make_grammar` builds them, `OnDemandGrammar`
builds them at the first constrained request) and the `Rewrite` it returns after a sampled
token. This package's top level imports neither grammar backend (xgrammar, llguidance and
their compilers take about half a second to import): `OnDemandGrammar` imports `backend`
when it builds it.
"""

from plait.backend.grammar.hooks import GrammarHooks, MaskWaiter, Rewrite
from plait.backend.grammar.layout import FIXED_LAYOUTS, resolve_layout
from plait.backend.grammar.on_demand import OnDemandGrammar, grammar_on_demand

__all__ = [
    "FIXED_LAYOUTS",
    "GrammarHooks",
    "MaskWaiter",
    "OnDemandGrammar",
    "Rewrite",
    "grammar_on_demand",
    "resolve_layout",
]

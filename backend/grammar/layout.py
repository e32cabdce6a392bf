"""JSON layouts: what whitespace a JSON grammar allows between tokens.

- `compact`: none (separators `,` and `:`);
- `dumps`: one space after each `,` and `:` and none elsewhere (`{"a": 1, "b": [1, 2]}`),
  what `json.dumps` writes by default and what models have seen most;
- `spaced`: each gap between tokens is empty or one space (`{"a": 1, "b": [1, 2]}`);
- `flexible`: each gap is empty, one space, or a newline followed by at most
  `MAX_INDENT` spaces (indented output as models write it: `json.dumps(indent=2)` up to
  four levels deep).

No layout allows a run of padding: the model cannot fill a gap with sixteen spaces or blank
lines, which small models do greedily once a grammar lets them (they then run to the token
limit). xgrammar's own `any_whitespace` allows any `[ \\n\\r\\t]` run up to a count; the
`spaced` and `flexible` grammars are xgrammar's `any_whitespace` grammar with every
whitespace repetition replaced by the layout's gap rule (in its lookaheads too).
llguidance is given the same layouts as options (`llguidance_options`): its separators, and
a whitespace pattern it matches at most once per gap.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where a grammar is built: the engine loads without it
    import xgrammar as xgr

COMPACT = "compact"
DUMPS = "dumps"
SPACED = "spaced"
FLEXIBLE = "flexible"
LAYOUTS = (COMPACT, DUMPS, SPACED, FLEXIBLE)
DEFAULT_LAYOUT = DUMPS  # measured best with spaced (docs/structured.md), and no optional gaps
FIXED_LAYOUTS = (COMPACT, DUMPS)  # one way to write each value: no whitespace to choose
COMPACT_SEPARATORS = (",", ":")
_SEPARATORS = {COMPACT: COMPACT_SEPARATORS, DUMPS: (", ", ": ")}
MAX_INDENT = 8
GAP_RULE = "plait_layout_gap"
_GAPS = {
    SPACED: '("" | " ")',
    FLEXIBLE: f'("" | " " | ("\\n" [ ]{{0, {MAX_INDENT}}}))',
}
_LLG_GAPS = {SPACED: " ", FLEXIBLE: f" |\\n {{0,{MAX_INDENT}}}"}  # each gap: empty or one match
# The count xgrammar is given, so that its whitespace repetitions can be found in its EBNF.
_XGR_WHITESPACE_CNT = 16
_WHITESPACE_REPEAT = re.compile(rf"\bwhitespace(?:_\d+)?\{{0, {_XGR_WHITESPACE_CNT}\}}")


def resolve_layout(*, layout: str | None, any_whitespace: bool) -> str:
    """The layout a request asked for: `json_layout` if given, else `flexible` for
    `any_whitespace`, else the default."""
    if layout is not None:
        return layout
    return FLEXIBLE if any_whitespace else DEFAULT_LAYOUT


def schema_grammar(schema_text: str, *, layout: str, **options: Any) -> xgr.Grammar:
    """xgrammar's grammar of a JSON Schema (text) in `layout`; `options` go to xgrammar
    (`strict_mode`, `any_order`)."""
    import xgrammar as xgr

    if layout in _SEPARATORS:
        return xgr.Grammar.from_json_schema(
            schema_text, any_whitespace=False, separators=_SEPARATORS[layout], **options
        )
    if layout not in _GAPS:
        raise ValueError(f"unknown JSON layout {layout!r} (one of {', '.join(LAYOUTS)})")
    loose = xgr.Grammar.from_json_schema(
        schema_text, any_whitespace=True, max_whitespace_cnt=_XGR_WHITESPACE_CNT, **options
    )
    return with_gaps(loose, layout=layout)


def llguidance_options(layout: str) -> dict[str, Any]:
    """llguidance's JSON options (`x-guidance`) for `layout`."""
    if layout in _SEPARATORS:
        item, key = _SEPARATORS[layout]
        return {"item_separator": item, "key_separator": key, "whitespace_flexible": False}
    if layout not in _LLG_GAPS:
        raise ValueError(f"unknown JSON layout {layout!r} (one of {', '.join(LAYOUTS)})")
    return {"item_separator": ",", "key_separator": ":", "whitespace_pattern": _LLG_GAPS[layout]}


def array_tokens(layout: str) -> tuple[str, str, str, str]:
    """EBNF of an array's opening, item separator and closing, and of the empty array, in
    `layout` (the gap layouts name `GAP_RULE`; `gap_rule` defines it)."""
    if layout in _SEPARATORS:
        return '"["', json.dumps(_SEPARATORS[layout][0]), '"]"', '"[" "]"'
    if layout not in _GAPS:
        raise ValueError(f"unknown JSON layout {layout!r} (one of {', '.join(LAYOUTS)})")
    return f'"[" {GAP_RULE}', f'{GAP_RULE} "," {GAP_RULE}', f'{GAP_RULE} "]"', f'"[" {GAP_RULE} "]"'


def gap_rule(layout: str) -> str:
    """The definition of `GAP_RULE` in a gap layout ("" in the others)."""
    return f"{GAP_RULE} ::= {_GAPS[layout]}" if layout in _GAPS else ""


def with_gaps(grammar: xgr.Grammar, *, layout: str) -> xgr.Grammar:
    """`grammar` (xgrammar's any_whitespace form) with each whitespace run replaced by the
    layout's gap."""
    import xgrammar as xgr

    text, count = _WHITESPACE_REPEAT.subn(GAP_RULE, str(grammar))
    if count == 0:  # no whitespace between tokens (a schema of one string or number)
        return grammar
    return xgr.Grammar.from_ebnf(f"{text}\n{gap_rule(layout)}\n")

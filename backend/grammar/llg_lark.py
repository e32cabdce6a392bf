"""Lark for llguidance: `ebnf` grammars (GBNF, as xgrammar reads them) converted with
llguidance's `gbnf_to_lark`, and structural tags (xgrammar's format, as
`structural_tag.normalize_structural_tag` writes them), each JSON section a `%json` schema:

- `const_string`: a string literal; `regex`: `/.../`; `grammar` (EBNF): a subgrammar
  (`@name`), converted from GBNF;
- `json_schema` (style `json`): `%json {...}`, the section's schema as `llg_build.json_schema`
  gives it (rewritten, strict mode, the request's layout);
- `sequence`, `or`, `optional`, `plus`, `star`, `repeat`: concatenation, `|`, `?`, `+`, `*`,
  `{m,n}`;
- `tag`: begin, content, end (one string or several); `any_text` content is a lazy lexeme
  that ends at the first end string; `any_text` elsewhere only last (any text);
- `triggered_tags`: free text up to the first trigger (a lazy lexeme), then a tag whose
  `begin` starts with it; the text after the last tag holds no trigger; with `at_least_one`
  the output opens with a tag, with `stop_after_first` it ends after one (as in xgrammar);
- `tags_with_separator`: tags separated by the separator, nothing else.

Every other format (token formats, dispatch, XML styles, `excludes`, `any_order`, limits on
`any_text`) is refused with a GrammarError naming it: xgrammar takes those.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import llguidance as llg
from llguidance.gbnf_to_lark import any_to_lark

from plait.backend.grammar.errors import GrammarError, error_line

Node = dict[str, Any]
SectionFn = Callable[[Any], tuple[dict[str, Any], tuple[str, ...]]]
ANY_TEXT = r"/(.|\n)*/"
_PLAIN_JSON_KEYS = frozenset({"type", "json_schema", "style"})
# xgrammar's format types: one of these that llguidance does not take is refused as such,
# any other type as unknown
XGRAMMAR_FORMATS = frozenset({
    "const_string", "json_schema", "any_text", "token", "exclude_token", "any_tokens", "grammar",
    "regex", "sequence", "or", "tag", "triggered_tags", "token_triggered_tags",
    "tags_with_separator", "optional", "plus", "star", "repeat", "dispatch", "token_dispatch",
    "qwen_xml_parameter",
})  # fmt: skip
_REPEATS = {"optional": "?", "plus": "+", "star": "*"}


def ebnf_lark(text: str) -> str:
    """An `ebnf` grammar (GBNF, rule `root`) as Lark; raises GrammarError if it does not
    convert."""
    try:
        return any_to_lark(text)
    except Exception as exc:  # noqa: BLE001 - the converter raises plain Exceptions
        raise GrammarError(f"invalid ebnf: {error_line(str(exc))}") from exc


def tag_grammar(text: str, *, section: SectionFn) -> tuple[str, tuple[str, ...]]:
    """The llguidance grammar (its JSON form) of a normalized tag, and the warnings of its
    JSON sections; `section(schema)` gives each JSON section's schema and warnings."""
    lark = _Lark(section)
    start = lark.expr(json.loads(text)["format"], last=True)
    grammars = [{"name": "structural_tag", "lark_grammar": lark.text(start)}, *lark.subgrammars]
    return json.dumps({"grammars": grammars}), tuple(dict.fromkeys(lark.warnings))


class _Lark:
    """Rules written while a tag's formats are converted."""

    def __init__(self, section: SectionFn) -> None:
        self.section = section
        self.rules: list[str] = []
        self.subgrammars: list[dict[str, str]] = []
        self.warnings: list[str] = []

    def text(self, start: str) -> str:
        return "\n".join([f"start: {start}", *self.rules]) + "\n"

    def rule(self, body: str, options: str = "") -> str:
        name = f"r{len(self.rules)}"
        self.rules.append(f"{name}{options}: {body}")
        return name

    def terminal(self, body: str) -> str:
        """A named terminal (the `&` and `~` operators are allowed only there)."""
        name = f"T{len(self.rules)}"
        self.rules.append(f"{name}: {body}")
        return name

    def expr(self, node: Any, *, last: bool = False) -> str:
        """The Lark expression of one format; `last`: nothing follows it in the output."""
        if not isinstance(node, dict) or not isinstance(node.get("type"), str):
            raise GrammarError("structural_tag: every format must be an object with a 'type'")
        kind = node["type"]
        convert = getattr(self, f"_{kind}", None)
        if convert is None and kind not in XGRAMMAR_FORMATS:
            raise GrammarError(f"invalid structural_tag: unknown format type {kind!r}")
        if convert is None:
            raise unsupported(f"format '{kind}'")
        return str(convert(node, last))

    # --- leaves -----------------------------------------------------------------------
    def _const_string(self, node: Node, last: bool) -> str:
        return literal(_field(node, "value", str))

    def _regex(self, node: Node, last: bool) -> str:
        return self.rule(f"/{llg.regex_to_lark(_field(node, 'pattern', str))}/")

    def _any_text(self, node: Node, last: bool) -> str:
        if not last:
            raise unsupported("'any_text' followed by other text outside a tag")
        _plain_any_text(node)
        return self.rule(ANY_TEXT)

    def _json_schema(self, node: Node, last: bool) -> str:
        if not set(node) <= _PLAIN_JSON_KEYS or node.get("style", "json") != "json":
            raise unsupported("'json_schema' with a style other than json, or options")
        schema, warnings = self.section(node.get("json_schema", True))
        self.warnings.extend(warnings)
        return self.rule("%json " + json.dumps(schema, ensure_ascii=False))

    def _grammar(self, node: Node, last: bool) -> str:
        name = f"g{len(self.subgrammars)}"
        lark = ebnf_lark(_field(node, "grammar", str))
        self.subgrammars.append({"name": name, "lark_grammar": lark})
        return f"@{name}"

    # --- combinations -----------------------------------------------------------------
    def _sequence(self, node: Node, last: bool) -> str:
        items = _field(node, "elements", list)
        parts = [self.expr(x, last=last and i == len(items) - 1) for i, x in enumerate(items)]
        return "(" + " ".join(parts) + ")" if parts else '""'

    def _or(self, node: Node, last: bool) -> str:
        items = _field(node, "elements", list)
        if not items:
            raise GrammarError("structural_tag: 'or' needs elements")
        return "(" + " | ".join(self.expr(x, last=last) for x in items) + ")"

    def _optional(self, node: Node, last: bool) -> str:
        return f"({self.expr(node.get('content'))}){_REPEATS['optional']}"

    def _plus(self, node: Node, last: bool) -> str:
        return f"({self.expr(node.get('content'))}){_REPEATS['plus']}"

    def _star(self, node: Node, last: bool) -> str:
        return f"({self.expr(node.get('content'))}){_REPEATS['star']}"

    def _repeat(self, node: Node, last: bool) -> str:
        low, high = _field(node, "min", int), _field(node, "max", int)
        bound = f"{{{low},}}" if high < 0 else f"{{{low},{high}}}"
        return f"({self.expr(node.get('content'))}){bound}"

    # --- tags -------------------------------------------------------------------------
    def _tag(self, node: Node, last: bool, *, skip: int = 0) -> str:
        """begin (its first `skip` characters left out: a trigger wrote them), content, end."""
        begin = _field(node, "begin", str)[skip:]
        end = node.get("end")
        ends = [end] if isinstance(end, str) else end
        if not isinstance(ends, list) or not ends or not all(isinstance(e, str) for e in ends):
            raise unsupported("a tag whose 'end' is not a string or a list of strings")
        content = node.get("content")
        if isinstance(content, dict) and content.get("type") == "any_text" and all(ends):
            _plain_any_text(content)  # text up to the first end string: a lazy lexeme
            alternatives = "|".join(_regex_text(e) for e in ends)
            body = self.rule(f"{ANY_TEXT[:-1]}({alternatives})/", "[lazy]")
            return f"({literal(begin)} {body})" if begin else body
        inner = self.expr(content, last=last and not any(ends))
        close = "(" + " | ".join(literal(e) for e in ends) + ")"
        return " ".join(part for part in (literal(begin) if begin else "", inner, close) if part)

    def _triggered_tags(self, node: Node, last: bool) -> str:
        """As xgrammar reads it: with `at_least_one` the output opens with a whole tag;
        with `stop_after_first` it ends after one tag."""
        triggers, tags = _field(node, "triggers", list), _field(node, "tags", list)
        if node.get("excludes") or not triggers or not tags:
            raise unsupported("'triggered_tags' with excludes, or without triggers or tags")
        heads = {t: self.rule(f"{ANY_TEXT[:-1]}{_regex_text(t)}/", "[lazy]") for t in triggers}
        bodies = []
        for tag in tags:
            begin = _field(tag, "begin", str)
            trigger = next((t for t in triggers if begin.startswith(t)), None)
            if trigger is None:
                raise GrammarError(f"structural_tag: no trigger begins the tag {begin!r}")
            bodies.append(f"{heads[trigger]} {self._tag(tag, False, skip=len(trigger))}")
        triggered = self.rule(" | ".join(f"({b})" for b in bodies))
        free = self.terminal(free_text(triggers))
        if node.get("at_least_one"):
            first = self.rule(" | ".join(f"({self._tag(tag, False)})" for tag in tags))
            return first if node.get("stop_after_first") else f"{first} ({triggered})* {free}"
        return (
            f"({triggered} | {free})" if node.get("stop_after_first") else f"({triggered})* {free}"
        )

    def _tags_with_separator(self, node: Node, last: bool) -> str:
        tags = _field(node, "tags", list)
        if not tags:
            raise GrammarError("structural_tag: 'tags_with_separator' needs tags")
        one = self.rule(" | ".join(f"({self._tag(t, False)})" for t in tags))
        if node.get("stop_after_first"):
            return one if node.get("at_least_one") else f"({one})?"
        many = f"{one} ({literal(_field(node, 'separator', str))} {one})*"
        return many if node.get("at_least_one") else f"({many})?"


def _plain_any_text(node: Node) -> None:
    if any(node.get(k) for k in ("excludes", "max_tokens", "max_chars")):
        raise unsupported("'any_text' with excludes or limits")


def free_text(triggers: list[str]) -> str:
    """A terminal for any text that holds none of `triggers`."""
    alternatives = "|".join(_regex_text(t) for t in triggers)
    return f"{ANY_TEXT} & ~/(.|\\n)*({alternatives})(.|\\n)*/"


def literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _regex_text(text: str) -> str:
    """`text` matched literally inside `/.../`."""
    escaped = "".join(f"\\{c}" if c in r"\.^$|?*+()[]{}/-" else c for c in text)
    return escaped.replace("\n", "\\n")


def _field(node: Any, name: str, kind: type) -> Any:
    value = node.get(name) if isinstance(node, dict) else None
    if not isinstance(value, kind):
        raise GrammarError(f"structural_tag: '{name}' must be a {kind.__name__}")
    return value


def unsupported(what: str) -> GrammarError:
    return GrammarError(
        f"structural_tag: {what} is not supported by llguidance (grammar_backend xgrammar takes it)"
    )

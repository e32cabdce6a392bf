"""How big a constraint may be before anything compiles it: checked at the edge, with the
other sampling fields (a 400 naming the field), so that an absurd constraint costs nothing.

Building a grammar is bounded in time in the grammar's worker processes; these limits refuse
cheaply what would only run into that bound, and what would make the token masks themselves
costly (they are built during decoding, at first use): a regex whose repetitions expand to
more than MAX_REGEX_SIZE elements (`a{1000000}`); more than MAX_ENUM_VALUES values, or more
than MAX_LITERAL_CHARS characters of them, in the `enum`s and `const`s of a JSON schema or a
structural tag (xgrammar's masks for a larger set of alternatives take minutes: 4000 strings
of 25 characters do); as many characters of `choices`; an EBNF grammar longer than that. Any
constraint's text is at most `MAX_CONSTRAINT_CHARS` characters and `choices` at most
`MAX_CHOICES` strings (`SamplingParams`).
"""

from __future__ import annotations

import json
import re
from typing import Any

try:  # the parser `re` itself uses
    from re import _constants as _sre  # type: ignore[attr-defined]
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

MAX_REGEX_SIZE = 10_000  # pattern elements once every repetition is expanded
MAX_ENUM_VALUES = 4096  # enum values and consts in one JSON schema or structural tag
MAX_LITERAL_CHARS = 1 << 16  # their characters (as JSON), choices' characters, an EBNF's
MAX_JSON_DEPTH = 64  # nesting a schema may have (deeper ones are refused, not walked)
_REPEAT = re.compile(r"(?<!\\)\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


class ConstraintTooLarge(ValueError):
    """A constraint over one of the limits above; the message says which and by how much."""


def check_regex(pattern: str) -> None:
    """Refuse a regex whose repetitions expand beyond MAX_REGEX_SIZE elements."""
    size = regex_size(pattern)
    if size > MAX_REGEX_SIZE:
        raise ConstraintTooLarge(
            f"the pattern expands to more than {MAX_REGEX_SIZE} elements (repetition counts "
            "multiply); use a smaller repetition count"
        )


def regex_size(pattern: str, *, cap: int = MAX_REGEX_SIZE) -> int:
    """Elements of `pattern` with each repetition expanded (its upper bound, or its lower
    bound + 1 when unbounded); counting stops past `cap`. A pattern Python's parser cannot
    read is judged by its largest repetition count alone."""
    try:
        parsed = _sre_parse.parse(pattern)
    except Exception:  # noqa: BLE001 - syntax Python does not know: fall back to the counts
        counts = [int(n) for m in _REPEAT.finditer(pattern) for n in m.groups() if n]
        return max(counts, default=0)
    return _size(list(parsed), cap)


def _size(items: list[Any], cap: int) -> int:
    total = 0
    for op, av in items:
        if op in _REPEATS:
            low, high, sub = av
            times = high if high != _sre.MAXREPEAT else low + 1
            total += max(times, 1) * _size(list(sub), cap)
        elif op is _sre.SUBPATTERN:
            total += _size(list(av[-1]), cap)
        elif op is _sre.BRANCH:
            total += sum(_size(list(branch), cap) for branch in av[1])
        elif op in (_sre.ASSERT, _sre.ASSERT_NOT):
            total += _size(list(av[1]), cap)
        else:
            total += 1
        if total > cap:
            return total
    return total


_REPEATS = tuple(
    getattr(_sre, name)
    for name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
    if hasattr(_sre, name)
)


def check_literals(texts: list[str], *, what: str) -> None:
    """Refuse literal alternatives (`choices`, an EBNF grammar) over MAX_LITERAL_CHARS."""
    size = sum(map(len, texts))
    if size > MAX_LITERAL_CHARS:
        raise ConstraintTooLarge(f"{what}: {size} characters; at most {MAX_LITERAL_CHARS}")


def check_json_values(text: str) -> None:
    """Refuse a JSON schema or structural tag (JSON text) with more than MAX_ENUM_VALUES
    enum values and consts, or more than MAX_LITERAL_CHARS characters of them, in all; a
    `pattern` over the regex limit; nesting deeper than MAX_JSON_DEPTH. Text that is not JSON
    is left to the compiler, which names the problem."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return
    tally = _Tally()
    tally.walk(value, depth=0)
    if tally.values > MAX_ENUM_VALUES:
        raise ConstraintTooLarge(
            f"it lists {tally.values} enum/const values; at most {MAX_ENUM_VALUES} are allowed"
        )
    if tally.chars > MAX_LITERAL_CHARS:
        raise ConstraintTooLarge(
            f"its enum/const values: {tally.chars} characters; at most {MAX_LITERAL_CHARS}"
        )


class _Tally:
    """Enum/const values and their characters (as JSON) in a schema; checks its patterns."""

    def __init__(self) -> None:
        self.values = 0
        self.chars = 0

    def walk(self, node: Any, *, depth: int) -> None:
        if depth > MAX_JSON_DEPTH:
            raise ConstraintTooLarge(f"it nests deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(node, list):
            for item in node:
                self.walk(item, depth=depth + 1)
            return
        if not isinstance(node, dict):
            return
        for key, item in node.items():
            if key in ("enum", "const"):
                values = item if key == "enum" and isinstance(item, list) else [item]
                self.values += len(values)
                self.chars += sum(len(json.dumps(v, ensure_ascii=False)) for v in values)
            elif key == "pattern" and isinstance(item, str):
                check_regex(item)
            self.walk(item, depth=depth + 1)

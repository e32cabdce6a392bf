"""Stop strings and stop regexes: where generation stops and how much text that needs.

A request stops at the first place its output text contains one of its `stop` strings or a
match of one of its `stop_regex` patterns (`re.search`; `^` and `\\A` mean the start of the
output). After every token the scheduler checks a `Tail` of the output: enough decoded tokens
to hold any new match, after some tokens of context so that lookbehinds and `\\b` see what
precedes it. The detokenizer cuts the final text at the first stop in the whole text (before
it; `no_stop_trim` keeps the text whole) and, while streaming, holds back the characters a stop
could still begin in.

Patterns are validated up front: they must compile, must not match the empty string, and must
not repeat a repetition without bound (`(a+)+`, `(\\w{2,5})*`), whose matching time can grow
exponentially and would stall the scheduler for everyone. A pattern without a length bound
(`\\d+`) is checked against the last `UNBOUNDED_CHARS` characters, and that many are held back
while streaming.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

try:  # the parser `re` itself uses: widths and structure of a pattern
    from re import _constants as _sre_constants  # type: ignore[attr-defined]
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre_constants  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

UNBOUNDED_CHARS = 256  # how far back an unbounded pattern is looked for, and held back
LOOKAROUND_CHARS = 32  # extra room for text a lookahead needs after the match
CONTEXT_TOKENS = 8  # tokens decoded before the checked window, for lookbehinds and \b
_UNBOUNDED = 1 << 16
_REPEATS = (_sre_constants.MAX_REPEAT, _sre_constants.MIN_REPEAT, _sre_constants.POSSESSIVE_REPEAT)


@dataclass(frozen=True)
class StopMatch:
    """The first stop in a text: ``text[start:end]``; `matched` is the stop string or the
    regex pattern (as SGLang reports them)."""

    start: int
    end: int
    matched: str


@dataclass(frozen=True)
class Tail:
    """The end of an output as text; matches must start at or after `start` (what comes
    before is context, or the output's beginning when `start` is 0)."""

    text: str
    start: int = 0


def check_stop_regexes(patterns: tuple[str, ...]) -> None:
    """Raise ValueError naming the first pattern that cannot be used as a stop."""
    for i, pattern in enumerate(patterns):
        try:
            re.compile(pattern)
            tree = _sre_parse.parse(pattern)
        except Exception as exc:  # noqa: BLE001 - re.error, OverflowError, RecursionError
            raise ValueError(f"stop_regex[{i}] is not a valid regular expression: {exc}") from None
        if tree.getwidth()[0] == 0:
            raise ValueError(f"stop_regex[{i}] {pattern!r} can match the empty string")
        if _nested_repeat(tree, inside=False):
            raise ValueError(
                f"stop_regex[{i}] {pattern!r} repeats a repetition without bound "
                "(its matching time can grow exponentially)"
            )


def first_stop(tail: Tail, strings: tuple[str, ...], regexes: tuple[str, ...]) -> StopMatch | None:
    """The earliest stop string or regex match starting at or after ``tail.start`` (the
    longer one on a tie)."""
    text, pos = tail.text, tail.start
    found = [StopMatch(i, i + len(s), s) for s in strings if (i := text.find(s, pos)) >= 0]
    for pattern in regexes:
        m = re.compile(pattern).search(text, pos)
        if m is not None:
            found.append(StopMatch(m.start(), m.end(), pattern))
    return min(found, key=lambda m: (m.start, -m.end)) if found else None


@functools.lru_cache(maxsize=1024)  # asked after every token of every request with stops
def regex_width(pattern: str) -> int:
    """Characters a match and the lookaround it needs can span (`UNBOUNDED_CHARS` at most)."""
    try:
        width = int(_sre_parse.parse(pattern).getwidth()[1])
    except Exception:  # noqa: BLE001 - unparsable: assume the largest
        return UNBOUNDED_CHARS
    if "(?=" in pattern or "(?!" in pattern:
        width += LOOKAROUND_CHARS
    return min(width, UNBOUNDED_CHARS)


def window_chars(strings: tuple[str, ...], regexes: tuple[str, ...]) -> int:
    """Characters at the end of the output that can hold a new stop."""
    return max([len(s) for s in strings] + [regex_width(p) for p in regexes], default=0)


def hold_back_chars(strings: tuple[str, ...], regexes: tuple[str, ...]) -> int:
    """Characters to keep unsent while streaming: a stop may begin in them."""
    return max(window_chars(strings, regexes) - 1, 0)


def _nested_repeat(pattern: Any, *, inside: bool) -> bool:
    """Whether a repetition sits inside an unbounded one (`(a+)+`, `(a{2,5})+`): the ways to
    split a run between them grow exponentially when the match fails."""
    for op, arg in pattern.data:
        if op in _REPEATS:
            _low, high, sub = arg
            if inside and high > 1:
                return True
            if _nested_repeat(sub, inside=inside or high >= _sre_constants.MAXREPEAT):
                return True
        elif any(_nested_repeat(child, inside=inside) for child in _children(op, arg)):
            return True
    return False


def _children(op: Any, arg: Any) -> list[Any]:
    """The subpatterns below one parsed item (groups, alternatives, lookarounds)."""
    if op == _sre_constants.SUBPATTERN:
        return [arg[-1]]
    if op == _sre_constants.BRANCH:
        return list(arg[1])
    if op in (_sre_constants.ASSERT, _sre_constants.ASSERT_NOT):
        return [arg[1]]
    if op == getattr(_sre_constants, "ATOMIC_GROUP", None):
        return [arg]
    return []

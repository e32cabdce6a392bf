"""Stop strings and stop regexes: where generation stops and how much text that needs.

A request stops at the first place its output text contains one of its `stop` strings or a
match of one of its `stop_regex` patterns (`re.search`; `^` and `\\A` mean the start of the
output). After every token the scheduler checks a `Tail` of the output: enough decoded tokens
to hold any new match, after some tokens of context so that lookbehinds and `\\b` see what
precedes it, decoded with the request's `skip_special_tokens` (so with False a stop can match
the text of a special token). The scheduler records where the match starts
(`FinishReason.trim_chars`); the detokenizer cuts the final text there (`no_stop_trim` keeps
it whole) and, while streaming, holds back the characters a stop could still begin in.

Patterns are validated up front (they must compile and must not match the empty string) and
matched with the `regex` package, which avoids most catastrophic backtracking (`(a+)+b`,
`(.|\\s)*END`) and is given a time limit: a search that still runs past `SEARCH_TIMEOUT_S`
fails that request alone instead of stalling the scheduler. A pattern without a length bound
(`\\d+`) is checked against the last `UNBOUNDED_CHARS` characters, and that many are held back
while streaming.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import regex

try:  # the parser `re` itself uses: the widths of a pattern
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parse  # type: ignore[no-redef]

UNBOUNDED_CHARS = 256  # how far back an unbounded pattern is looked for, and held back
LOOKAROUND_CHARS = 32  # extra room for text a lookahead needs after the match
CONTEXT_TOKENS = 8  # tokens decoded before the checked window, for lookbehinds and \b
SEARCH_TIMEOUT_S = 0.05  # per search; the window is at most a few hundred characters
_UNBOUNDED = 1 << 16


class StopRegexTimeout(ValueError):
    """A stop regex took too long to search the output."""


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
            compiled = regex.compile(pattern)
        except Exception as exc:  # noqa: BLE001 - regex.error, OverflowError, RecursionError
            raise ValueError(f"stop_regex[{i}] is not a valid regular expression: {exc}") from None
        widths = _widths(pattern)
        if (widths is not None and widths[0] == 0) or compiled.search("") is not None:
            raise ValueError(f"stop_regex[{i}] {pattern!r} can match the empty string")


def first_stop(tail: Tail, strings: tuple[str, ...], regexes: tuple[str, ...]) -> StopMatch | None:
    """The earliest stop string or regex match starting at or after ``tail.start`` (the
    longer one on a tie). Raises StopRegexTimeout when a search runs out of time."""
    text, pos = tail.text, tail.start
    found = [StopMatch(i, i + len(s), s) for s in strings if (i := text.find(s, pos)) >= 0]
    for pattern in regexes:
        try:
            m = regex.compile(pattern).search(text, pos, timeout=SEARCH_TIMEOUT_S)
        except TimeoutError:
            raise StopRegexTimeout(
                f"stop_regex {pattern!r} took longer than {SEARCH_TIMEOUT_S * 1000:.0f} ms to "
                "search the output; simplify the pattern"
            ) from None
        if m is not None:
            found.append(StopMatch(m.start(), m.end(), pattern))
    return min(found, key=lambda m: (m.start, -m.end)) if found else None


def regex_width(pattern: str) -> int:
    """Characters a match and the lookaround it needs can span (`UNBOUNDED_CHARS` at most)."""
    widths = _widths(pattern)
    if widths is None:  # unparsable by `re`: assume the largest
        return UNBOUNDED_CHARS
    width = widths[1]
    if "(?=" in pattern or "(?!" in pattern:
        width += LOOKAROUND_CHARS
    return min(width, UNBOUNDED_CHARS)


def window_chars(strings: tuple[str, ...], regexes: tuple[str, ...]) -> int:
    """Characters at the end of the output that can hold a new stop."""
    return max([len(s) for s in strings] + [regex_width(p) for p in regexes], default=0)


def hold_back_chars(strings: tuple[str, ...], regexes: tuple[str, ...]) -> int:
    """Characters to keep unsent while streaming: a stop may begin in them."""
    return max(window_chars(strings, regexes) - 1, 0)


@functools.lru_cache(maxsize=1024)  # asked after every token of every request with stops
def _widths(pattern: str) -> tuple[int, int] | None:
    """The shortest and longest text `pattern` matches, or None if `re`'s parser cannot tell
    (syntax only the regex package knows)."""
    try:
        low, high = _sre_parse.parse(pattern).getwidth()
    except Exception:  # noqa: BLE001 - any parser failure means "cannot tell"
        return None
    return int(low), int(high)

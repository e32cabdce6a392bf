"""Stop strings and stop regexes: where generation stops and how much text that needs.

A request stops at the first place its output text contains one of its `stop` strings or a
match of one of its `stop_regex` patterns (`re.search`). The scheduler checks the decoded tail
of the output after every token; the detokenizer cuts the final text at the same match (before
it, or after it with `no_stop_trim`) and, while streaming, holds back enough characters that a
stop is never sent and then retracted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

try:  # the parser `re` itself uses; gives a pattern's maximum match width
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parse  # type: ignore[no-redef]

# Characters held back while streaming for a pattern whose matches are unbounded (`\d+`):
# a longer match may have its beginning streamed before the stop is seen.
UNBOUNDED_HOLD_CHARS = 256
_UNBOUNDED = 1 << 16


@dataclass(frozen=True)
class StopMatch:
    """The first stop in a text: ``text[start:end]`` is the stop string or regex match."""

    start: int
    end: int

    def matched(self, text: str) -> str:
        return text[self.start : self.end]


def check_stop_regexes(patterns: tuple[str, ...]) -> None:
    """Raise ValueError naming the first pattern that does not compile or matches ''."""
    for i, pattern in enumerate(patterns):
        try:
            compiled = re.compile(pattern)
        except re.error as e:
            raise ValueError(f"stop_regex[{i}] is not a valid regular expression: {e}") from e
        if compiled.search("") is not None:
            raise ValueError(f"stop_regex[{i}] {pattern!r} matches the empty string")


def first_stop(text: str, strings: tuple[str, ...], regexes: tuple[str, ...]) -> StopMatch | None:
    """The earliest stop string or regex match in ``text`` (the longer one on a tie)."""
    found = [StopMatch(i, i + len(s)) for s in strings if (i := text.find(s)) >= 0]
    for pattern in regexes:
        m = re.search(pattern, text)
        if m is not None:
            found.append(StopMatch(m.start(), m.end()))
    return min(found, key=lambda m: (m.start, -m.end)) if found else None


def regex_width(pattern: str) -> int | None:
    """The longest text ``pattern`` can match, or None when unbounded (or unknown)."""
    try:
        width = int(_sre_parse.parse(pattern).getwidth()[1])
    except Exception:  # noqa: BLE001 - a private parser: any failure means "unknown"
        return None
    return None if width >= _UNBOUNDED else width


def window_chars(strings: tuple[str, ...], regexes: tuple[str, ...]) -> int | None:
    """Characters at the end of the output that can contain a new stop (None = all of it)."""
    widths = [len(s) for s in strings] + [regex_width(p) for p in regexes]
    if any(w is None for w in widths):
        return None
    return max((w for w in widths if w is not None), default=0)


def hold_back_chars(strings: tuple[str, ...], regexes: tuple[str, ...]) -> int:
    """Characters to keep unsent while streaming: a stop may begin in them."""
    widths = [len(s) for s in strings]
    for pattern in regexes:
        width = regex_width(pattern)
        widths.append(UNBOUNDED_HOLD_CHARS if width is None else min(width, UNBOUNDED_HOLD_CHARS))
    return max(max(widths, default=1) - 1, 0)

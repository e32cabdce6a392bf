"""The error of a constraint that does not compile, and the backends' messages made readable."""

from __future__ import annotations

import re

_XGR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


class GrammarError(ValueError):
    """A constraint that cannot be compiled; the message names the problem."""


def clean_error(exc: BaseException) -> str:
    """A backend's message on one line: xgrammar's without its log prefix (time, C++ file and
    line), llguidance's without its source excerpts (`error_line`)."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    return _XGR_PREFIX.sub("", error_line(text))


def error_line(message: str) -> str:
    """The first line of a message and the `error:` lines of a regex report (llguidance
    quotes the offending source under its message)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return "unknown error"
    kept = [lines[0]] + [line for line in lines[1:] if line.startswith("error:")]
    return " ".join(kept)

"""String formats written as patterns, where xgrammar's own format grammar accepts more
than the format.

- `ipv4`: xgrammar allows leading zeros (`010.0.0.1`), which an IPv4 parser rejects;
- `date`, `date-time`: xgrammar checks no day against its month (`2550-06-31`); the patterns
  know each month's days and February 29th of leap years (every fourth year, centuries only
  when divisible by 400), and years 0001-9999 (Python's `date` has no year 0);
- `uuid`, `duration`, `json-pointer`, `relative-json-pointer` beside a `minLength` or
  `maxLength` (which lengths.py then folds into the pattern);
- `time` (and the time of `date-time`): hours 00-23, minutes 00-59, seconds 00-59, an offset
  `Z` or `+hh:mm` / `-hh:mm` (hours 00-23), `T` and `Z` in either case; a leap second
  (`:60`) only at 23:59 UTC (`Z`, `+00:00`, `-00:00`): a leap second under another offset
  (`15:59:60-08:00`) is rejected, which the warning walker reports as strict
  (`LEAP_SECOND_PATTERNS`).
"""

from __future__ import annotations

from typing import Any

_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = f"{_OCTET}(?:\\.{_OCTET}){{3}}"

# No `{n}` counts: xgrammar's regex may lose a count followed by an optional group (the
# walker warns of that shape), and the fraction of a time is one.
_D = "[0-9]"
_YEAR = f"(?:{_D}{_D}{_D}[1-9]|{_D}{_D}[1-9]0|{_D}[1-9]00|[1-9]000)"
_MULTIPLE_OF_4 = "(?:0[48]|[2468][048]|[13579][26])"  # two digits, 00 excluded
_LEAP_YEAR = f"(?:{_D}{_D}{_MULTIPLE_OF_4}|{_MULTIPLE_OF_4}00)"
_LONG_MONTHS = "(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
_SHORT_MONTHS = "(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
_FEBRUARY = "02-(?:0[1-9]|1[0-9]|2[0-8])"
_DATE = f"(?:{_YEAR}-(?:{_LONG_MONTHS}|{_SHORT_MONTHS}|{_FEBRUARY})|{_LEAP_YEAR}-02-29)"

_HOUR = "(?:[01][0-9]|2[0-3])"
# Written with an empty branch, not `?`: xgrammar drops the first element of an optional
# group holding a `+` (`(?:x[0-9]+)?` accepts "5"), which let "10:10:105Z" through.
_FRACTION = "(?:\\.[0-9]+|)"
_OFFSET = f"(?:[Zz]|[+-]{_HOUR}:[0-5][0-9])"
_TIME = (
    f"(?:{_HOUR}:[0-5][0-9]:[0-5][0-9]{_FRACTION}{_OFFSET}|23:59:60{_FRACTION}(?:[Zz]|[+-]00:00))"
)

FORMAT_PATTERNS = {
    "ipv4": f"^{_IPV4}$",
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}[Tt]{_TIME}$",
}
LEAP_SECOND_PATTERNS = frozenset(FORMAT_PATTERNS[f] for f in ("time", "date-time"))

# Formats written as patterns only beside a length (xgrammar's own grammars of them match
# JSON escapes, which a pattern does not; a length-bounded string holds none anyway):
# the same languages as xgrammar's.
_HEX = "[0-9A-Fa-f]"
_DIGITS = "[0-9][0-9]*"
_DURATION_DATE = (
    f"(?:{_DIGITS}D|{_DIGITS}M(?:{_DIGITS}D|)|{_DIGITS}Y(?:{_DIGITS}M(?:{_DIGITS}D|)|))"
)
_DURATION_TIME = (
    f"T(?:{_DIGITS}H(?:{_DIGITS}M(?:{_DIGITS}S|)|)|{_DIGITS}M(?:{_DIGITS}S|)|{_DIGITS}S)"
)
_POINTER = "(?:/(?:[^/~]|~[01])*)*"
LENGTH_FORMAT_PATTERNS = {
    "uuid": f"^{_HEX * 8}-{_HEX * 4}-{_HEX * 4}-{_HEX * 4}-{_HEX * 12}$",
    "duration": f"^P(?:{_DURATION_DATE}(?:{_DURATION_TIME}|)|{_DURATION_TIME}|{_DIGITS}W)$",
    "json-pointer": f"^{_POINTER}$",
    "relative-json-pointer": f"^(?:0|[1-9][0-9]*)(?:#|{_POINTER})$",
}
# The shortest value of each other format xgrammar checks (a search over its grammars,
# checked by a test): a `minLength` up to it says nothing more (`implied_length`).
FORMAT_SHORTEST = {"email": 3, "hostname": 1, "uri": 2, "uri-reference": 0,
                   "uri-template": 0, "ipv6": 2}  # fmt: skip
LENGTHS = ("minLength", "maxLength")


def format_patterns(node: dict[str, Any]) -> None:
    """A string's `format` in FORMAT_PATTERNS, without a pattern of its own, becomes that
    pattern, and one in LENGTH_FORMAT_PATTERNS does beside a length (in place)."""
    fmt, lengths = node.get("format"), [k for k in LENGTHS if k in node]
    if node.get("type") != "string" or not isinstance(fmt, str) or "pattern" in node:
        return
    pattern = FORMAT_PATTERNS.get(fmt) or (LENGTH_FORMAT_PATTERNS.get(fmt) if lengths else None)
    if pattern is not None:
        del node["format"]
        node["pattern"] = pattern


def implied_length(node: dict[str, Any]) -> bool:
    """Whether a string's only length is a `minLength` every value of its `format` meets."""
    fmt, shortest = node.get("format"), node.get("minLength")
    if "maxLength" in node or not isinstance(fmt, str) or not isinstance(shortest, int):
        return False
    return shortest <= FORMAT_SHORTEST.get(fmt, -1)

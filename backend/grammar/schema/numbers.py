"""Numbers xgrammar cannot bound exactly, as an automaton over their text.

xgrammar steps an integer `multipleOf` only without a range and only up to 1024, and has no
form for a decimal step (0.01), for the numbers that are not integers, or for those that are
not multiples. Each is a regular language over a number's text; their intersection with
the bounds is one automaton (interegular products), written as one EBNF rule per state:

- the syntax: `-?(0|[1-9][0-9]*)`, then for a `number` an optional fraction (a fraction
  with a digit other than 0 for the numbers that are not integers); no exponent, as in
  xgrammar's own ranges;
- each bound: the magnitude's integer part longer or shorter than the bound's, or as long
  and greater or smaller at its first different digit, or equal and the fraction compared
  likewise, signs apart;
- a step s = p / 10^d: the digits read as one integer, its remainder mod p while the
  fraction has at most d digits, only zeros after them; a multiple ends on remainder 0
  (times the 10s the fraction lacks). "Not a multiple" is the complement.

A number schema gets this rule (`numeric_of`) only where xgrammar's own is not exact, and
only within `MAX_STATES` (a step of p / 10^d has about p·(d + 2) states) and for bounds of
at most `MAX_BOUND_DIGITS` digits.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import interegular
from interegular.fsm import FSM, Alphabet, anything_else

from plait.backend.grammar.schema.automata import char_class, live_states, moves
from plait.backend.grammar.schema.utils import ANNOTATIONS, MAX_INTEGER_STEP, is_number, node_types

MAX_STATES = 4096
MAX_BOUND_DIGITS = 24
NUMBER_KEYS = {"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
               "multipleOf", "not"}  # fmt: skip
NOT_INTEGER, DIGITS = {"type": "integer"}, "0123456789"
_INTEGER = "-?(0|[1-9][0-9]*)"
_FRACTION = "(\\.[0-9]+)?"


@dataclass(frozen=True)
class Numeric:
    """Numbers between the bounds (None: none; `*_open`: exclusive), multiples of `step`
    (or not multiples of `off_step`), integers (`integral` True), not integers (False)."""

    low: Fraction | None
    low_open: bool
    high: Fraction | None
    high_open: bool
    step: Fraction | None
    off_step: Fraction | None
    integral: bool | None


def integral_steps(node: dict[str, Any]) -> None:
    """Steps xgrammar steps itself (in place): a number with a whole `multipleOf` (5, 2.0)
    is an integer (JSON Schema counts 10.0 as one), and an integer multiple of p / q is one
    of p (0.5: any integer, so the step goes)."""
    step, types = _fraction(node.get("multipleOf")), node.get("type")
    if step is None or step <= 0:
        return
    if types == "integer" and step.denominator != 1:
        node["multipleOf"] = step.numerator
        if step.numerator == 1:
            del node["multipleOf"]
    elif step.denominator == 1 and step <= MAX_INTEGER_STEP and "number" in str(types):
        node["multipleOf"] = int(step)
        if types == "number":
            node["type"] = "integer"
        elif isinstance(types, list):
            node["type"] = list(dict.fromkeys("integer" if t == "number" else t for t in types))


def numeric_of(node: Any) -> Numeric | None:
    """The rule of a number schema xgrammar does not bound exactly (above), or None."""
    types = node_types(node) if isinstance(node, dict) else set()
    if not types or not types <= {"number", "integer"}:
        return None
    if set(node) - ANNOTATIONS - NUMBER_KEYS or not _plain_bounds(node):
        return None
    negated = node.get("not")
    step, off_step = _fraction(node.get("multipleOf")), None
    if negated is not None and negated != NOT_INTEGER:
        off_step = _fraction(negated.get("multipleOf")) if isinstance(negated, dict) else None
        if off_step is None or set(negated) != {"multipleOf"}:
            return None
    if ("multipleOf" in node and step is None) or (step is not None and step <= 0):
        return None
    if "number" not in types and negated == NOT_INTEGER:
        return None  # an integer that is not one: nothing (merge.contradicts)
    integral = "number" not in types or (False if negated == NOT_INTEGER else None)
    if integral and step is not None:
        step = Fraction(step.numerator)  # an integer multiple of p / q is one of p
    low, low_open = _bound(node, "minimum", "exclusiveMinimum", max)
    high, high_open = _bound(node, "maximum", "exclusiveMaximum", min)
    if any(b is not None and len("".join(_digits(abs(b)))) > MAX_BOUND_DIGITS for b in (low, high)):
        return None  # a bound of more digits has no small automaton
    spec = Numeric(low, low_open, high, high_open, step, off_step, integral)
    return spec if _needs_rule(spec) and _size(spec) <= MAX_STATES else None


def _plain_bounds(node: dict[str, Any]) -> bool:
    keys = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
    return all(is_number(node[k]) for k in keys if k in node)


def _fraction(value: Any) -> Fraction | None:
    return Fraction(repr(value)) if is_number(value) and math.isfinite(value) else None


def _bound(node: dict[str, Any], closed: str, opened: str, tighter: Any) -> tuple[Any, bool]:
    candidates = [(_fraction(node[k]), k == opened) for k in (closed, opened) if k in node]
    if not candidates:
        return None, False
    value = tighter(v for v, _ in candidates)
    return value, any(v == value and is_open for v, is_open in candidates)


def _needs_rule(spec: Numeric) -> bool:
    """Whether xgrammar's own grammar of the node would not be exact."""
    if spec.off_step is not None or spec.integral is False:
        return True
    if spec.step is None:
        return False
    ranged = spec.low is not None or spec.high is not None
    whole = spec.step.denominator == 1 and spec.step <= MAX_INTEGER_STEP
    return ranged or not whole or not spec.integral


def _size(spec: Numeric) -> int:
    sizes = [s.numerator * (_decimals(s) + 2) for s in (spec.step, spec.off_step) if s]
    return max(sizes, default=1)


def _decimals(step: Fraction) -> int:
    """d: the fewest fraction digits that write `step` (its denominator divides 10^d)."""
    d = 0
    while (step * 10**d).denominator != 1:
        d += 1
    return d


@functools.lru_cache(maxsize=64)
def number_fsm(spec: Numeric) -> FSM:
    """The automaton of every number text `spec` allows."""
    fraction = (
        "" if spec.integral else "\\.[0-9]*[1-9][0-9]*" if spec.integral is False else _FRACTION
    )
    fsm = _parse(_INTEGER + fraction)
    if spec.low is not None:
        fsm = fsm & _parse(_at_least(spec.low, strict=spec.low_open))
    if spec.high is not None:
        fsm = fsm & _parse(_at_most(spec.high, strict=spec.high_open))
    if spec.step is not None:
        fsm = fsm & _multiples(spec.step)
    if spec.off_step is not None:
        fsm = fsm & _multiples(spec.off_step).everythingbut()
    return fsm


def number_states(spec: Numeric) -> int:
    """How many states of the automaton can still end a number (0: no number is valid)."""
    fsm = number_fsm(spec)
    live = live_states(fsm)
    return len(live) if fsm.initial in live else 0


def number_rules(rule: str, spec: Numeric) -> dict[str, list[str]]:
    """One EBNF rule per live state of the automaton (only live targets: no dead end)."""
    fsm = number_fsm(spec)
    live = live_states(fsm)
    explicit = {c for c in fsm.alphabet if c is not anything_else}
    name = f"plait_{rule}_q{{}}".format  # xgrammar names its own helpers `<rule>_<n>`
    rules = {rule: [name(fsm.initial)]}
    for state in sorted(live):
        steps = [f"{char_class(chars, explicit)} {name(target)}"
                 for target, chars in moves(fsm, state, live).items()]  # fmt: skip
        rules[name(state)] = steps + (['""'] if state in fsm.finals else [])
    return rules


def _parse(pattern: str) -> FSM:
    return interegular.parse_pattern(pattern).to_fsm()


# --- bounds: the magnitude compared digit by digit ---------------------------------------
def _at_least(bound: Fraction, *, strict: bool) -> str:
    if bound >= 0:
        zero = "|-0(\\.0+)?" if bound == 0 and not strict else ""
        return f"({_magnitude(bound, greater=True, strict=strict)}){zero}"
    return f"(0|[1-9][0-9]*){_FRACTION}|-({_magnitude(-bound, greater=False, strict=strict)})"


def _at_most(bound: Fraction, *, strict: bool) -> str:
    if bound <= 0:
        zero = "|0(\\.0+)?" if bound == 0 and not strict else ""
        return f"-({_magnitude(-bound, greater=True, strict=strict)}){zero}"
    return f"-(0|[1-9][0-9]*){_FRACTION}|({_magnitude(bound, greater=False, strict=strict)})"


def _magnitude(bound: Fraction, *, greater: bool, strict: bool) -> str:
    """Unsigned number texts above (below) `bound` >= 0, or equal to it unless `strict`."""
    whole, fraction = _digits(bound)
    parts = _longer(whole) if greater else _shorter(whole)
    for i, digit in enumerate(whole):
        lo, hi = (
            (int(digit) + 1, 9)
            if greater
            else (1 if i == 0 and len(whole) > 1 else 0, int(digit) - 1)
        )
        if lo <= hi:
            parts.append(f"{whole[:i]}[{lo}-{hi}][0-9]{{{len(whole) - i - 1}}}{_FRACTION}")
    parts += [re.escape(whole) + f for f in _fractions(fraction, greater=greater, strict=strict)]
    return "|".join(parts) or "[^\\s\\S]"


def _digits(bound: Fraction) -> tuple[str, str]:
    d = _decimals(bound)
    text = str(bound.numerator * 10**d // bound.denominator).rjust(d + 1, "0")
    whole, fraction = text[: len(text) - d], text[len(text) - d :]
    return whole, fraction.rstrip("0")


def _longer(whole: str) -> list[str]:
    if whole == "0":
        return [f"[1-9][0-9]*{_FRACTION}"]
    return [f"[1-9][0-9]{{{len(whole)}}}[0-9]*{_FRACTION}"]


def _shorter(whole: str) -> list[str]:
    if len(whole) == 1:
        return []
    return [f"(0|[1-9][0-9]{{0,{len(whole) - 2}}}){_FRACTION}"]


def _fractions(fraction: str, *, greater: bool, strict: bool) -> list[str]:
    """What may follow the bound's own integer part."""
    equal = [] if strict else ["(\\.0+)?"] if not fraction else [f"\\.{fraction}0*"]
    if greater:
        above = [
            f"\\.{fraction[:i]}[{int(c) + 1}-9][0-9]*" for i, c in enumerate(fraction) if c != "9"
        ]
        beyond = [f"\\.{fraction}[0-9]*[1-9][0-9]*"]
        return equal + above + beyond
    if not fraction:
        return equal
    below = [f"\\.{fraction[:i]}[0-{int(c) - 1}][0-9]*" for i, c in enumerate(fraction) if c != "0"]
    shorter = ["(\\.0*)?"] + [f"\\.{fraction[:i]}0*" for i in range(1, len(fraction))]
    return equal + below + shorter


# --- steps: a remainder over the digits --------------------------------------------------
def _multiples(step: Fraction) -> FSM:
    """Texts of the multiples of `step` = p / 10^d (any syntax: the product brings it)."""
    d = _decimals(step)
    p = int(step * 10**d)
    alphabet = Alphabet.from_groups(*({c} for c in DIGITS), {"-"}, {"."}, {anything_else})
    index = {c: alphabet[c] for c in [*DIGITS, "-", "."]}
    states: dict[Any, int] = {}

    def state(key: Any) -> int:
        return states.setdefault(key, len(states))

    transitions: dict[int, dict[Any, int]] = {}
    start, finals = state(("start",)), set()
    frontier: list[tuple[Any, ...]] = [("start",)]
    while frontier:
        key = frontier.pop()
        if state(key) in transitions:
            continue
        out = transitions.setdefault(state(key), {})
        for char, target in _step_moves(key, p, d):
            if target not in states:
                frontier.append(target)
            out[index[char]] = state(target)
        if _step_final(key, p, d):
            finals.add(state(key))
    return FSM(alphabet=alphabet, states=set(states.values()), initial=start, finals=finals,
               map=transitions)  # fmt: skip


def _step_moves(key: tuple[Any, ...], p: int, d: int) -> list[tuple[str, tuple[Any, ...]]]:
    kind = key[0]
    if kind in ("start", "sign"):
        signs = [("-", ("sign",))] if kind == "start" else []
        return signs + [(c, ("int", int(c) % p)) for c in DIGITS]
    remainder = key[1]
    if kind == "int":
        point = [(".", ("frac", remainder, 0))]
        return point + [(c, ("int", (10 * remainder + int(c)) % p)) for c in DIGITS]
    read = key[2]
    if read < d:
        return [(c, ("frac", (10 * remainder + int(c)) % p, read + 1)) for c in DIGITS]
    return [("0", key)]


def _step_final(key: tuple[Any, ...], p: int, d: int) -> bool:
    if key[0] == "int":
        return key[1] * 10**d % p == 0
    return key[0] == "frac" and key[1] * 10 ** (d - key[2]) % p == 0

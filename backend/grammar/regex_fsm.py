"""A regex's DFA (built with interegular) and the characters it forces.

For a `regex` constraint, jump-forward follows the chain of states that have exactly one way
on: a non-accepting state whose only transition into a live state reads a single character.
`RegexCursor` tracks where one request stands as tokens (bytes) are accepted and rolled back;
bytes that end inside a UTF-8 character wait until the character is complete.
"""

from __future__ import annotations

from dataclasses import dataclass

import interegular
from interegular.fsm import anything_else

from plait.backend.request.limits import regex_size

MAX_FORCED_CHARS = 512
MAX_FSM_REGEX_SIZE = 2000  # larger regexes jump forward with the matcher's string, no own DFA


@dataclass(frozen=True)
class RegexFSM:
    """The DFA of one regex plus, per state, the single character it forces (if any)."""

    initial: int
    transitions: dict[int, dict[int, int]]
    symbol_of: dict[str, int]
    default_symbol: int | None
    forced_step: dict[int, tuple[str, int]]

    @classmethod
    def bounded(cls, pattern: str) -> RegexFSM | None:
        """The DFA of a regex constraint, None past `MAX_FSM_REGEX_SIZE` expanded elements
        (building it could take minutes) or when interegular cannot parse it."""
        small = regex_size(pattern, cap=MAX_FSM_REGEX_SIZE) <= MAX_FSM_REGEX_SIZE
        return cls.build(pattern) if small else None

    @classmethod
    def build(cls, pattern: str) -> RegexFSM | None:
        """The DFA of `pattern`, or None when interegular cannot parse it (then xgrammar's
        own jump-forward string is used instead)."""
        try:
            fsm = interegular.parse_pattern(pattern).to_fsm()
        except Exception:  # noqa: BLE001 - interegular raises many types for unsupported syntax
            return None
        mapping = dict(fsm.alphabet.items())
        default = mapping.pop(anything_else, None)
        transitions = {
            int(s): {int(k): int(v) for k, v in fsm.map.get(s, {}).items()} for s in fsm.states
        }
        finals = {int(s) for s in fsm.finals}
        live = _live_states(transitions, finals)
        forced = _forced_steps(
            transitions, chars_of=fsm.alphabet.by_transition, live=live, finals=finals
        )
        return cls(int(fsm.initial), transitions, mapping, default, forced)

    def step(self, state: int, char: str) -> int | None:
        symbol = self.symbol_of.get(char, self.default_symbol)
        return None if symbol is None else self.transitions[state].get(symbol)

    def forced_from(self, state: int) -> str:
        """The characters every match must read next from `state`."""
        out: list[str] = []
        while state in self.forced_step and len(out) < MAX_FORCED_CHARS:
            char, state = self.forced_step[state]
            out.append(char)
        return "".join(out)


def _live_states(transitions: dict[int, dict[int, int]], finals: set[int]) -> set[int]:
    """States from which an accepting state is reachable."""
    live = set(finals)
    changed = True
    while changed:
        changed = False
        for state, edges in transitions.items():
            if state not in live and any(dst in live for dst in edges.values()):
                live.add(state)
                changed = True
    return live


def _forced_steps(
    transitions: dict[int, dict[int, int]],
    *,
    chars_of: dict[int, list[object]],
    live: set[int],
    finals: set[int],
) -> dict[int, tuple[str, int]]:
    forced = {}
    for state in live - finals:
        edges = [(sym, dst) for sym, dst in transitions[state].items() if dst in live]
        if len(edges) != 1:
            continue
        chars = chars_of.get(edges[0][0], [])
        if len(chars) == 1 and isinstance(chars[0], str):
            forced[state] = (chars[0], edges[0][1])
    return forced


class RegexCursor:
    """One request's position in a RegexFSM, advanced by token bytes, rolled back by tokens.
    `state` is None once the text left the DFA (xgrammar's regex dialect differs)."""

    def __init__(self, fsm: RegexFSM) -> None:
        self.fsm = fsm
        self.state: int | None = fsm.initial
        self.pending = b""
        self.history: list[tuple[int | None, bytes]] = []

    def advance(self, data: bytes) -> None:
        """Read one token's bytes."""
        self.history.append((self.state, self.pending))
        buf = self.pending + data
        cut = utf8_complete_len(buf)
        self.pending = buf[cut:]
        for char in buf[:cut].decode("utf-8", errors="replace"):
            if self.state is None:
                break
            self.state = self.fsm.step(self.state, char)

    def rollback(self, n: int) -> None:
        """Forget the last `n` tokens."""
        if n <= 0:
            return
        self.state, self.pending = self.history[-n]
        del self.history[-n:]

    def forced(self) -> str:
        if self.state is None or self.pending:
            return ""
        return self.fsm.forced_from(self.state)


def utf8_complete_len(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 character."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte or ASCII: is its character complete?
            need = 1 if byte < 0x80 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if back >= need else len(data) - back
    return 0

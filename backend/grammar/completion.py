"""A short text that completes a grammar from a matcher's current state.

Used to close a constrained output before `max_new_tokens` runs out (`close_on_length`):
instead of cutting JSON in the middle of a string, the engine appends a short text that makes
the grammar's root complete.

The search runs over single bytes (every byte-level vocabulary has a token per byte). First
weighted A*: a node is a forked matcher, its cost the bytes written so far, and for JSON the
estimate of what is left counts the open containers and the open string (each needs at least
one more byte), weighted so that plain closing is found before anything else is explored.
When that spends its share of the budget (many required properties still to write), a
closing-first depth-first search on one matcher finds a longer completion without exploring
every alternative.

Nodes are merged when their parser states are equal: xgrammar's matcher reports the Earley
items of its last step (`_debug_print_internal_state`), and an item's start position is kept
as is when it lies before the search began (in the text both nodes share) and made relative
to the end otherwise. A repetition (`[a-z]{5,}`) shows the same items after each byte while
it counts, so the number of bytes in a row that kept the items is part of the identity (up
to `MAX_RUN`). For JSON the lexical state is added (the open containers with the
separators written in each since the search began), since the items only show the
innermost rule. llguidance shows no parser state; there a digest of the whole next-token
mask stands for the items (tokens that carry text past the current byte, `aker"` or `12"`,
tell apart states the single bytes do not), which merges more states than the items would.
A merge can make the answer longer or make the search miss one, never wrong: every byte of
an answer was accepted by a real matcher.
"""

from __future__ import annotations

import heapq
import re
import time
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from plait.backend.grammar.hooks import Matcher
from plait.backend.grammar.json_lexer import JsonLex
from plait.backend.grammar.llg_matcher import LlgMatcher

MAX_TRIALS = 4000  # bytes tried per search before giving up (each takes 5-50 us)
MAX_SECONDS = 0.1  # and a stop in CPU seconds: a few regex states take ~1 ms per mask
CLOCK_EVERY = 8  # trials between readings of the clock in a pass (a trial takes 5-50 us)
MAX_STATE_CHARS = 1 << 16  # parser states printed larger than this (huge enums) end the search
BEST_FIRST = 0.25  # share of the budget for the A* pass; the depth-first pass gets the rest
MAX_DEPTH = 1024  # bytes a depth-first completion may take
MAX_RUN = 64  # bytes in a row that keep a node's parser items (minLength 64, [a-z]{64})
WEIGHT = 3  # A* weight on the estimate (and on repeated bytes): prefer closing to content
# Printable ASCII without the backslash, and UTF-8 continuation bytes (to finish a character
# the output was cut in): completions need no escapes or new multi-byte characters (unless a
# pattern demands them; then the search finds nothing).
ALPHABET = frozenset(range(0x20, 0x7F)) - {ord("\\")} | frozenset(range(0x80, 0xC0))
# Values of common string formats (hostname, date-time, date, time, email, uuid, IPv4, IPv6,
# URI, duration), tried first when the output ends inside a string that neither a quote
# nor a space may continue: a real value reads better than the shortest one (`user@example.com`
# rather than `}@1`). A sample continues what the string holds (`2023-0` -> `2023-01-01`,
# `jane.doe` -> `jane.doe@example.com`).
FORMAT_SAMPLES = tuple(
    sample.encode()
    for sample in (
        "example.com",  # first: a hostname grammar accepts dates too
        "2000-01-01T12:00:00Z",
        "2000-01-01",
        "12:00:00Z",
        "user@example.com",
        "00000000-0000-4000-8000-000000000000",
        "192.0.2.1",
        "2001:db8::1",
        "https://example.com/",
        "P1D",
    )
)
ITEM = re.compile(
    r"rule_id=(\d+), sequence_id=(\d+), element_id=(\d+), rule_start_pos=(-?\d+), "
    r"sub_element_id=(\d+)"
)

Item = tuple[int, int, int, int, int]
Edge = tuple[int, bytes]  # a single-byte token and its byte
Key = tuple[frozenset[Hashable], int, object]


class CompleterUnavailable(RuntimeError):
    """This xgrammar version does not report its parser state in the expected form."""


class SearchTooLarge(RuntimeError):
    """The grammar's parser state is too large to search from (thousands of alternatives)."""


@dataclass
class _Node:
    """A search state: the bytes written since the search began, the JSON lexical state (if
    JSON), its parser items and for how many bytes in a row they have not changed (a
    repetition like `[a-z]{5,}` keeps its items while it counts), and, once kept, its
    matcher and the single-byte tokens it allows."""

    text: bytes
    lex: JsonLex | None
    matcher: Matcher | None = None
    allowed: tuple[Edge, ...] = ()
    items: frozenset[Hashable] = frozenset()
    run: int = 1

    @property
    def estimate(self) -> int:
        """Bytes still needed at least: one per open container or string (JSON only)."""
        return self.lex.open_count() if self.lex is not None else 0

    def child(self, data: bytes) -> _Node:
        lex = self.lex.feed(data) if self.lex is not None else None
        return _Node(self.text + data, lex)


class _Budget:
    """Trials and seconds for one pass of a search. Seconds are the searching thread's CPU
    time: a machine busy with other work slows a search but does not cut it short, so what
    a search finds does not depend on the load (its own work is still bounded)."""

    def __init__(self, trials: int, seconds: float) -> None:
        self.trials = trials
        self.used = 0
        self.start = time.thread_time()
        self.deadline = self.start + seconds

    def spend(self) -> bool:
        """Take one trial; False when none is left or the time is up (the clock, which
        costs about 1 us, is read every CLOCK_EVERY trials)."""
        self.used += 1
        if self.used % CLOCK_EVERY:
            return self.used <= self.trials
        return self.used <= self.trials and time.thread_time() <= self.deadline

    def expired(self) -> bool:
        """The time is up (checked after each costly matcher call, not only per trial)."""
        return time.thread_time() > self.deadline

    def elapsed(self) -> float:
        return time.thread_time() - self.start


class Completer:
    """Finds a short completion of a matcher's state, as bytes."""

    def __init__(
        self,
        *,
        token_bytes: Sequence[bytes],
        max_trials: int = MAX_TRIALS,
        max_seconds: float = MAX_SECONDS,
    ) -> None:
        self.byte_tokens = {data[0]: i for i, data in enumerate(token_bytes) if len(data) == 1}
        alphabet = sorted(set(self.byte_tokens) & ALPHABET, key=_order)
        self.ids = [self.byte_tokens[b] for b in alphabet]
        index = np.array(self.ids, dtype=np.int64)
        self.words, self.shifts = index >> 5, (index & 31).astype(np.int32)
        self.bytes_of = [token_bytes[t] for t in self.ids]
        self.mask = torch.zeros((1, (len(token_bytes) + 31) // 32), dtype=torch.int32)
        self.bits = self.mask.numpy()[0]
        self.filled = False  # `mask` holds the state `_key` just identified (llguidance)
        self.max_trials = max_trials
        self.max_seconds = max_seconds

    def complete(self, matcher: Matcher, *, text: bytes, is_json: bool) -> bytes | None:
        """The bytes after which `matcher` (which has accepted `text`) is complete; b"" if
        it already is, None when the search gives up (out of budget, or a parser state too
        large to search). `matcher` is left as it was."""
        if matcher.is_completed():
            return b""
        lex = JsonLex.scan(text) if is_json else None
        try:
            if lex is not None and lex.in_string and not lex.escaped:
                sampled = self._sampled(matcher, text)
                if sampled is not None:
                    return sampled
            return self._search(matcher, text=text, lex=lex, share=1.0)
        except SearchTooLarge:
            return None

    def _search(
        self, matcher: Matcher, *, text: bytes, lex: JsonLex | None, share: float
    ) -> bytes | None:
        """A* then depth-first, within `share` of the budget."""
        self.filled = False
        root = _Node(b"", lex)
        root.allowed = self._allowed(matcher, after=text[-1:])
        trials, seconds = self.max_trials * share, self.max_seconds * share
        first = _Budget(int(trials * BEST_FIRST), seconds * BEST_FIRST)
        found = self._best_first(matcher, root, base=len(text), budget=first)
        if found is not None:
            return found
        rest = _Budget(int(trials) - first.used, seconds - first.elapsed())
        return self._depth_first(matcher.fork(), root, base=len(text), budget=rest)

    def _sampled(self, matcher: Matcher, text: bytes) -> bytes | None:
        """The rest of the first format sample that ends the open string (see
        FORMAT_SAMPLES), then what completes the grammar after it; None when the string may
        end or go on with a space here (free text), or no sample fits."""
        if self._accepts(matcher.fork(), b'"') or self._accepts(matcher.fork(), b" "):
            return None
        for piece in _sample_pieces(written=len(text) - text.rfind(b'"') - 1):
            fork = matcher.fork()
            if self._accepts(fork, piece):
                after = text + piece
                if fork.is_completed():
                    return piece
                rest = self._search(fork, text=after, lex=JsonLex.scan(after), share=0.5)
                return None if rest is None else piece + rest
        return None

    def _accepts(self, matcher: Matcher, data: bytes) -> bool:
        """Feed `data` byte by byte; whether every byte was accepted."""
        for byte in data:
            token = self.byte_tokens.get(byte)
            if token is None or not matcher.accept_token(token):
                return False
        return True

    def _best_first(
        self, matcher: Matcher, root: _Node, *, base: int, budget: _Budget
    ) -> bytes | None:
        """Weighted A*: short completions, found in a few trials when closing is enough."""
        root.matcher = matcher.fork()
        heap = [(root.estimate, 0, 0, root)]
        seen = {self._key(matcher, root, base, None)}
        while heap:
            node = heapq.heappop(heap)[3]
            assert node.matcher is not None
            for token, data in node.allowed:
                if not budget.spend():
                    return None
                node.matcher.accept_token(token)
                if node.matcher.is_completed():
                    return node.text + data
                child = node.child(data)
                key = self._key(node.matcher, child, base, node)
                if child.run <= MAX_RUN and key not in seen:
                    seen.add(key)
                    child.matcher = node.matcher.fork()
                    child.allowed = self._allowed(child.matcher, after=data)
                    if budget.expired():
                        return None
                    cost = len(child.text)
                    rank = cost + WEIGHT * (child.estimate + child.run - 1)
                    heapq.heappush(heap, (rank, -cost, len(seen), child))
                node.matcher.rollback(1)
        return None

    def _depth_first(
        self, matcher: Matcher, root: _Node, *, base: int, budget: _Budget
    ) -> bytes | None:
        """Closing-first depth-first search on one matcher (accept on the way down, roll
        back on the way up): longer completions, but it does not drown in alternatives
        when many required properties are still to be written."""
        path = [(root, iter(root.allowed))]
        seen = {(self._key(matcher, root, base, None), 0)}
        while path:
            node, children = path[-1]
            for token, data in children:
                if not budget.spend():
                    return None
                matcher.accept_token(token)
                if matcher.is_completed():
                    return node.text + data
                child = node.child(data)
                key = (self._key(matcher, child, base, node), len(child.text))
                if child.run <= MAX_RUN and key not in seen and len(child.text) < MAX_DEPTH:
                    seen.add(key)
                    child.allowed = self._allowed(matcher, after=data)
                    if budget.expired():
                        return None
                    path.append((child, iter(child.allowed)))
                    break
                matcher.rollback(1)
            else:
                path.pop()
                if path:
                    matcher.rollback(1)
        return None

    def _key(self, matcher: Matcher, node: _Node, base: int, parent: _Node | None) -> Key:
        """The node's identity (and its `items` and `run` set): its parser state (`_state`),
        how many bytes in a row kept it, its JSON lexical state."""
        node.items = self._state(matcher, base=base, end=base + len(node.text))
        node.run = parent.run + 1 if parent is not None and parent.items == node.items else 1
        return node.items, node.run, node.lex.key if node.lex is not None else None

    def _state(self, matcher: Matcher, *, base: int, end: int) -> frozenset[Hashable]:
        """The parser state: xgrammar's items (positions after `base` relative to `end`), or
        the digest of llguidance's mask."""
        if isinstance(matcher, LlgMatcher):
            self.filled = True  # the digest's mask serves `_allowed` of the same state
            return frozenset({matcher.state_digest(self.mask)})
        return frozenset(
            (rule, seq, elem, sub, start if start <= base else start - end - 2)
            for rule, seq, elem, start, sub in parser_items(matcher)
        )

    def _allowed(self, matcher: Matcher, *, after: bytes) -> tuple[Edge, ...]:
        """The single-byte tokens the state allows, in search order; `after`: the byte
        before (a digit decides between `0` and `1`, see `_lead`). Where the grammar forces
        bytes, llguidance's mask allows only their canonical token (`,"` rather than `,`):
        there the forced byte is the one edge. The searches call it right after `_key` of
        the same state, whose llguidance mask is reused (`filled`)."""
        filled, self.filled = self.filled, False
        if isinstance(matcher, LlgMatcher):
            forced = matcher.forced_bytes()[:1]
            if forced and forced[0] in self.byte_tokens:
                return ((self.byte_tokens[forced[0]], forced),)
        if not filled:
            matcher.fill_next_token_bitmask(self.mask)
        keep = np.flatnonzero((self.bits[self.words] >> self.shifts) & 1)
        allowed = tuple((self.ids[i], self.bytes_of[i]) for i in keep.tolist())
        return allowed if after.isdigit() else _lead(allowed)


def parser_items(matcher: Any) -> list[Item]:
    """(rule, sequence, element, start, sub-element) of each Earley item of xgrammar's last
    step."""
    state = matcher._debug_print_internal_state()
    if len(state) > MAX_STATE_CHARS:
        raise SearchTooLarge(f"parser state of {len(state)} characters")
    items = [(int(a), int(b), int(c), int(d), int(e)) for a, b, c, d, e in ITEM.findall(state)]
    if not items:
        raise CompleterUnavailable(f"unexpected matcher state format: {state[:200]!r}")
    return items


def _sample_pieces(*, written: int) -> Iterator[bytes]:
    """Endings of the open string to try, each with its closing quote: every sample's rest
    after the `written` bytes the string holds, then the samples' tails that begin at
    punctuation, longest first (`jane.doe` + `@example.com`)."""
    for sample in FORMAT_SAMPLES:
        if written < len(sample):
            yield sample[written:] + b'"'
    for sample in FORMAT_SAMPLES:
        for k in range(1, len(sample)):
            if k != written and not sample[k : k + 1].isalnum():
                yield sample[k:] + b'"'


def _lead(allowed: tuple[Edge, ...]) -> tuple[Edge, ...]:
    """`allowed` with `1` tried before `0`: where a number, a year or an IPv4 part begins, a
    leading zero is shortest but often wrong (year 0000, `000.000.000.0`); inside a number
    `0` stays first (`1000`, `2000-01-01`)."""
    data = [d for _, d in allowed]
    if b"0" not in data or b"1" not in data:
        return allowed
    zero, one = data.index(b"0"), data.index(b"1")
    edges = list(allowed)
    edges[zero], edges[one] = edges[one], edges[zero]
    return tuple(edges)


def _order(byte: int) -> tuple[int, int]:
    """Closing punctuation, then the digits 0 and 1 (the shortest values), then the rest:
    among paths of equal cost the search prefers the one that closes soonest."""
    first = b'"}]01'
    return (0, first.index(byte)) if byte in first else (1, byte)

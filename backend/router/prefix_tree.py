"""`PrefixTree`: an approximate radix tree over characters, one per worker.

The router cannot see a worker's KV cache, so it remembers the text of every request it sent
there: the longest prefix of a new request's text found in a worker's tree approximates how
much of its prompt that worker has cached. Edges are labelled with strings; children are
keyed by their label's first character. Each node keeps the time it was last inserted or
matched through, and `evict` drops least recently used leaves until the tree holds at most a
given number of characters (the worker's cache evicts too, so old text is a poor guess).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterator


class _Node:
    __slots__ = ("children", "label", "last_used", "parent")

    def __init__(self, label: str, parent: _Node | None, now: float) -> None:
        self.label = label
        self.parent = parent
        self.children: dict[str, _Node] = {}
        self.last_used = now


def _common_length(a: str, b: str, start: int) -> int:
    """Length of the common prefix of `a` and `b[start:]`."""
    limit = min(len(a), len(b) - start)
    if a[:limit] == b[start : start + limit]:
        return limit
    lo, hi = 0, limit  # binary search on slice equality: C-speed comparisons
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[start : start + mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixTree:
    """The text routed to one worker, as a radix tree of characters (not thread-safe: the
    router uses it from its event loop only)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._root = _Node("", None, clock())
        self.chars = 0  # characters stored: the sum of the edge labels' lengths

    def match(self, text: str) -> int:
        """How many leading characters of `text` the tree holds (refreshes their nodes)."""
        node, pos, now = self._root, 0, self._clock()
        while pos < len(text):
            child = node.children.get(text[pos])
            if child is None:
                break
            common = _common_length(child.label, text, pos)
            child.last_used = now
            pos += common
            if common < len(child.label):
                break
            node = child
        return pos

    def insert(self, text: str) -> None:
        """Add `text` (splitting an edge where it leaves the tree)."""
        node, pos, now = self._root, 0, self._clock()
        node.last_used = now
        while pos < len(text):
            child = node.children.get(text[pos])
            if child is None:
                node.children[text[pos]] = _Node(text[pos:], node, now)
                self.chars += len(text) - pos
                return
            common = _common_length(child.label, text, pos)
            if common < len(child.label):
                child = self._split(child, common)
            child.last_used = now
            node, pos = child, pos + common

    def _split(self, child: _Node, at: int) -> _Node:
        """Cut `child`'s edge after `at` characters; returns the new upper node."""
        parent = child.parent
        assert parent is not None
        upper = _Node(child.label[:at], parent, child.last_used)
        parent.children[upper.label[0]] = upper
        child.label, child.parent = child.label[at:], upper
        upper.children[child.label[0]] = child
        return upper

    def evict(self, max_chars: int) -> int:
        """Drop least recently used leaves until at most `max_chars` remain; the count of
        characters dropped."""
        if self.chars <= max_chars:
            return 0
        before, order = self.chars, itertools.count()
        heap = [(leaf.last_used, next(order), leaf) for leaf in self._leaves()]
        heapq.heapify(heap)
        while heap and self.chars > max_chars:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.label[0]]
            self.chars -= len(leaf.label)
            if parent is not self._root and not parent.children:
                heapq.heappush(heap, (parent.last_used, next(order), parent))
        return before - self.chars

    def clear(self) -> None:
        self._root = _Node("", None, self._clock())
        self.chars = 0

    def _leaves(self) -> Iterator[_Node]:
        todo = list(self._root.children.values())
        while todo:
            node = todo.pop()
            if node.children:
                todo += node.children.values()
            else:
                yield node

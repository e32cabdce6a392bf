"""RadixAttention's prefix tree: token-id edges whose values are KV slots.

Every KV page is owned exactly once: by the tree, by a running request, or by the pool's free
list. A request that reuses a cached prefix locks the path to its last node so it cannot be
evicted; eviction removes least-recently-used unlocked leaves. With `page_size > 1` keys are
matched and split only at page boundaries.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from plait.backend.cache.kv_pool import TokenToKVPool


class TreeNode:
    """One edge of the tree: `key` token ids and their KV `value` slots."""

    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access")

    def __init__(self, key: list[int], value: torch.Tensor, parent: TreeNode | None) -> None:
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.parent = parent
        self.key = key
        self.value = value
        self.lock_ref = 0
        self.last_access = 0

    def is_leaf(self) -> bool:
        return not self.children


@dataclass(frozen=True)
class MatchResult:
    """Slots of the longest cached prefix and the node where it ends."""

    slots: torch.Tensor
    last_node: TreeNode

    @property
    def length(self) -> int:
        return int(self.slots.numel())


class RadixCache:
    """Prefix tree over the paged KV pool; `disabled=True` shares nothing (for ablations)."""

    def __init__(self, *, pool: TokenToKVPool, disabled: bool = False) -> None:
        self.pool = pool
        self.page_size = pool.page_size
        self.disabled = disabled
        self._clock = itertools.count(1)
        self.reset()

    def reset(self) -> None:
        """Drop the whole tree (the caller frees or clears the pool)."""
        self.root = TreeNode([], torch.empty(0, dtype=torch.int64), None)
        self.root.lock_ref = 1
        self._evictable = 0
        self._protected = 0

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return self._evictable + self._protected

    # --- lookup and insert -------------------------------------------------------------
    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        """Longest cached page-aligned prefix of `key`; splits a node matched partway."""
        if self.disabled:
            return MatchResult(torch.empty(0, dtype=torch.int64), self.root)
        node, values, pos = self.root, [], 0
        node.last_access = next(self._clock)
        while pos + self.page_size <= len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            n = self._common_len(child.key, key, pos)
            partial = n < len(child.key)
            if partial:
                child = self._split(child, n)
            child.last_access = next(self._clock)
            values.append(child.value)
            node, pos = child, pos + n
            if partial:
                break
        slots = torch.cat(values) if values else torch.empty(0, dtype=torch.int64)
        return MatchResult(slots, node)

    def insert(self, key: Sequence[int], value: torch.Tensor) -> int:
        """Insert the page-aligned `key` -> `value`; returns how many leading tokens were
        already cached (the caller frees its own copies of those slots)."""
        if self.disabled:
            return 0
        if len(key) % self.page_size or len(key) != value.numel():
            raise ValueError("insert: key must be page-aligned and match value in length")
        node, pos = self.root, 0
        node.last_access = next(self._clock)
        while pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                self._add_leaf(node, list(key[pos:]), value[pos:].clone())
                return pos
            n = self._common_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = next(self._clock)
            node, pos = child, pos + n
        return pos

    # --- locking -----------------------------------------------------------------------
    def inc_lock_ref(self, node: TreeNode) -> None:
        """Protect the path from `node` to the root against eviction."""
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one `inc_lock_ref(node)`."""
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError("dec_lock_ref on an unlocked node")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
            node = node.parent  # type: ignore[assignment]

    # --- eviction ----------------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots from LRU unlocked leaves; returns slots freed."""
        heap = [(n.last_access, id(n), n) for n in self._nodes() if n.is_leaf() and not n.lock_ref]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            self.pool.free(node.value)
            freed += len(node.key)
            self._evictable -= len(node.key)
            parent = node.parent
            assert parent is not None
            del parent.children[self._child_key(node.key, 0)]
            if parent is not self.root and parent.is_leaf() and not parent.lock_ref:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed

    # --- integrity ---------------------------------------------------------------------
    def check_integrity(self, *, held: Iterable[torch.Tensor] = ()) -> None:
        """Assert every pool page is owned exactly once: by the tree, `held`, or the free list.

        Also checks node invariants: keys match values in length, page alignment, lock counts
        and the evictable/protected totals.
        """
        owners: list[torch.Tensor] = [self.pool.free_pages()]
        evictable = protected = 0
        for node in self._nodes():
            assert len(node.key) == node.value.numel() > 0, "node key/value length mismatch"
            assert len(node.key) % self.page_size == 0, "node not page-aligned"
            assert node.lock_ref >= 0
            assert all(c.lock_ref <= node.lock_ref for c in node.children.values()), "lock order"
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
            owners.append(self._pages(node.value))
        owners.extend(self._pages(slots) for slots in held)
        assert (evictable, protected) == (self._evictable, self._protected), "size counters"
        pages = torch.cat(owners) if owners else torch.empty(0, dtype=torch.int64)
        expected = torch.arange(1, self.pool.num_pages + 1)
        assert pages.numel() == expected.numel(), (
            f"{pages.numel()} owned pages != {expected.numel()}"
        )
        assert torch.equal(torch.sort(pages).values, expected), "a page is owned twice or lost"

    # --- helpers -----------------------------------------------------------------------
    def _pages(self, slots: torch.Tensor) -> torch.Tensor:
        return torch.unique(slots.cpu().to(torch.int64) // self.page_size)

    def _nodes(self) -> list[TreeNode]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def _child_key(self, key: Sequence[int], pos: int) -> tuple[int, ...]:
        return tuple(key[pos : pos + self.page_size])

    def _common_len(self, node_key: list[int], key: Sequence[int], pos: int) -> int:
        limit = min(len(node_key), len(key) - pos)
        n = next((i for i in range(limit) if node_key[i] != key[pos + i]), limit)
        return n - n % self.page_size

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child` after `n` tokens; returns the new upper node."""
        parent = child.parent
        assert parent is not None
        upper = TreeNode(child.key[:n], child.value[:n], parent)
        upper.lock_ref, upper.last_access = child.lock_ref, child.last_access
        parent.children[self._child_key(upper.key, 0)] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        upper.children[self._child_key(child.key, 0)] = child
        return upper

    def _add_leaf(self, parent: TreeNode, key: list[int], value: torch.Tensor) -> None:
        leaf = TreeNode(key, value, parent)
        leaf.last_access = next(self._clock)
        parent.children[self._child_key(key, 0)] = leaf
        self._evictable += len(key)

"""In which order waiting requests are admitted: cache-aware (longest prefix match,
DFS-weight) or first-come-first-served for very long queues; and the plan one step fills
while admitting them."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from plait.backend.cache.kv_manager import KVManager
from plait.backend.cache.radix_cache import TreeNode
from plait.backend.request.req import Req


class SchedulePolicy:
    """Orders the waiting queue; `lpm` and `dfs-weight` look every request up in the tree."""

    def __init__(self, *, policy: str, kv: KVManager, fcfs_threshold: int) -> None:
        self.policy = policy
        self.kv = kv
        self.fcfs_threshold = fcfs_threshold

    def order(self, waiting: list[Req]) -> list[Req]:
        if self.policy == "fcfs" or len(waiting) > self.fcfs_threshold or self.kv.tree.disabled:
            return sorted(waiting, key=lambda r: r.arrival)
        matches = {r.rid: self.kv.match(r) for r in waiting}
        if self.policy == "lpm":
            return sorted(waiting, key=lambda r: (-matches[r.rid].length, r.arrival))
        return self._dfs_weight(waiting, {r.rid: matches[r.rid].last_node for r in waiting})

    def _dfs_weight(self, waiting: list[Req], nodes: dict[str, TreeNode]) -> list[Req]:
        """Visit the tree's heaviest subtrees first, emitting the requests parked at each node."""
        at_node: dict[int, list[Req]] = defaultdict(list)
        weight: dict[int, int] = defaultdict(int)
        for req in sorted(waiting, key=lambda r: r.arrival):
            node: TreeNode | None = nodes[req.rid]
            at_node[id(node)].append(req)
            while node is not None:
                weight[id(node)] += 1
                node = node.parent
        out: list[Req] = []
        stack = [self.kv.tree.root]
        while stack:
            node = stack.pop()
            out.extend(at_node.get(id(node), []))
            children = [c for c in node.children.values() if weight.get(id(c))]
            stack.extend(sorted(children, key=lambda c: weight[id(c)]))
        return out


# A waiting request whose next uncached tokens start like those of a request admitted in the
# same step may wait one step, then read them from the cache instead of computing them again:
# when the shared run is the shortest of SHARED_KEY_LENGTHS covering half of its uncached
# tokens (the longest when none does), or all of them when fewer remain. Bursts of prompts on
# one template (a system prompt, a few words apart) share most of their tokens and no 32 of
# them uncached. The scheduler also asks that the wait can gain (Scheduler._waits_to_share).
SHARED_KEY_LENGTHS = (16, 24, 32)

PrefixKey = tuple[int, tuple[int, ...]]


def prefix_keys(req: Req, cached: int) -> list[PrefixKey]:
    """(cached length, the next L tokens) for each L of SHARED_KEY_LENGTHS."""
    ids = req.ids(cached, cached + SHARED_KEY_LENGTHS[-1])
    return [(cached, tuple(ids[:n])) for n in SHARED_KEY_LENGTHS]


def deciding_key(keys: list[PrefixKey], uncached: int) -> PrefixKey:
    """The key whose match is worth a step's wait for a request with `uncached` tokens to
    compute: the shortest at least half of them (the longest when none is)."""
    half = (uncached + 1) // 2
    for n, key in zip(SHARED_KEY_LENGTHS, keys, strict=True):
        if n >= half:
            return key
    return keys[-1]


@dataclass
class AdmissionPlan:
    """Running totals while one step admits requests: prefill token budget left, KV tokens
    planned and reserved for future decodes, and the uncached-prefix keys admitted so far."""

    budget: int
    planned: int
    future: int
    admitted: list[Req] = field(default_factory=list)
    prefix_keys: set[PrefixKey] = field(default_factory=set)

    def shared_run(self, keys: list[PrefixKey], uncached: int) -> int:
        """How many uncached tokens a request (its `prefix_keys`) surely shares with one
        admitted this step: its deciding key's length, or 0 when no admitted one has it."""
        key = deciding_key(keys, uncached)
        return len(key[1]) if key in self.prefix_keys else 0

    def take(self, req: Req, chunk: int, future: int, keys: list[PrefixKey]) -> None:
        self.budget -= chunk
        self.planned += chunk
        self.future += future
        self.admitted.append(req)
        self.prefix_keys.update(keys)

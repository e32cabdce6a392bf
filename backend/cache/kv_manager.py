"""Who owns which KV slot: request rows, the paged pool and the radix tree, kept consistent.

The scheduler decides *what* runs; this module does the bookkeeping of *where* its KV lives:
admitting a request onto its cached prefix, allocating slots for new tokens, caching computed
prefixes into the tree, and releasing a request when it finishes or is retracted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from plait.backend.cache.kv_pool import ReqToTokenPool, TokenToKVPool
from plait.backend.cache.radix_cache import MatchResult, RadixCache
from plait.backend.request.req import Req


class KVManager:
    """Facade over ReqToTokenPool + TokenToKVPool + RadixCache."""

    def __init__(
        self, *, req_pool: ReqToTokenPool, kv_pool: TokenToKVPool, tree: RadixCache
    ) -> None:
        self.req_pool = req_pool
        self.kv_pool = kv_pool
        self.tree = tree

    # --- capacity ----------------------------------------------------------------------
    def available_tokens(self) -> int:
        """Slots free now plus slots the tree could give up."""
        return self.kv_pool.available_size() + self.tree.evictable_size()

    def ensure_free_pages(self, pages: int) -> bool:
        """Evict from the tree until `pages` pages are free; False if that is impossible."""
        missing = pages * self.kv_pool.page_size - self.kv_pool.available_size()
        if missing > 0:
            self.tree.evict(missing)
        return self.kv_pool.can_allocate_pages(pages)

    def pages_for(self, reqs: Sequence[Req]) -> int:
        return sum(self.kv_pool.pages_needed(r.kv_len, r.extend_len) for r in reqs)

    # --- admission ---------------------------------------------------------------------
    def match(self, req: Req) -> MatchResult:
        return self.tree.match_prefix(req.all_ids()[: req.match_limit()])

    def admit(self, req: Req, match: MatchResult) -> None:
        """Give `req` a row and lock its cached prefix."""
        req.row = self.req_pool.allocate()
        self.tree.inc_lock_ref(match.last_node)
        req.last_node = match.last_node
        req.cached_len = req.kv_len = match.length
        self.req_pool.write(req.row, 0, match.slots)

    # --- allocation --------------------------------------------------------------------
    def allocate(self, reqs: Sequence[Req]) -> torch.Tensor:
        """Slots for every request's `extend_len` new tokens, written into their rows."""
        parts = []
        table = self.req_pool.table
        for req in reqs:
            assert req.row is not None
            paged = self.kv_pool.page_size > 1 and req.kv_len
            last = int(table[req.row, req.kv_len - 1]) if paged else -1
            slots = self.kv_pool.allocate_extend(
                prefix_len=req.kv_len, extend_len=req.extend_len, last_slot=last
            )
            self.req_pool.write(req.row, req.kv_len, slots)
            parts.append(slots)
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)

    def step_slots(self, req: Req) -> torch.Tensor:
        """The slots `allocate` gave this step's `extend_len` tokens of `req`."""
        assert req.row is not None
        return self.req_pool.read(req.row, req.kv_len, req.kv_len + req.extend_len)

    def truncate(self, req: Req, new_len: int) -> None:
        """Forget the KV of positions [new_len, kv_len) (tokens replaced by jump-forward)."""
        assert req.row is not None and req.cached_len <= new_len <= req.kv_len
        p = self.kv_pool.page_size
        keep_pages_to = -(-new_len // p) * p  # the page holding new_len - 1 stays
        if keep_pages_to < req.kv_len:
            self.kv_pool.free(self.req_pool.read(req.row, keep_pages_to, req.kv_len))
        req.kv_len = new_len

    # --- caching and release -----------------------------------------------------------
    def cache_prefix(self, req: Req) -> None:
        """Insert the request's computed tokens into the tree and re-lock on the new node."""
        assert req.row is not None and req.last_node is not None
        p = self.kv_pool.page_size
        aligned = req.kv_len - req.kv_len % p
        if aligned <= req.cached_len or self.tree.disabled:
            return
        ids = req.all_ids()[:aligned]
        slots = self.req_pool.read(req.row, 0, aligned)
        present = self.tree.insert(ids, slots)
        self.kv_pool.free(slots[req.cached_len : present])
        match = self.tree.match_prefix(ids)
        assert match.length == aligned, "cached prefix must match in full"
        self.req_pool.write(req.row, 0, match.slots)
        self.tree.inc_lock_ref(match.last_node)
        self.tree.dec_lock_ref(req.last_node)
        req.last_node, req.cached_len = match.last_node, aligned

    def release(self, req: Req, *, cache: bool = True) -> None:
        """Return a finished or retracted request's slots to the tree or the pool."""
        if req.row is None:
            return
        if cache:
            self.cache_prefix(req)
        owned = self.req_pool.read(req.row, req.cached_len, req.kv_len)
        self.kv_pool.free(owned)
        if req.last_node is not None:
            self.tree.dec_lock_ref(req.last_node)
        self.req_pool.free(req.row)
        req.row, req.last_node, req.kv_len, req.cached_len = None, None, 0, 0

    def held_slots(self, reqs: Sequence[Req]) -> list[torch.Tensor]:
        """Slots owned by running requests (for integrity checks)."""
        return [
            self.req_pool.read(r.row, r.cached_len, r.kv_len) for r in reqs if r.row is not None
        ]

    def check_integrity(self, running: Sequence[Req]) -> None:
        self.tree.check_integrity(held=self.held_slots(running))

    def flush(self) -> None:
        """Drop the whole cache and every row; only valid when no request is running."""
        self.tree.reset()
        self.kv_pool.clear()
        self.req_pool.reset()

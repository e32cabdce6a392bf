"""Preallocated memory for the KV cache: request rows and paged token slots.

`ReqToTokenPool` maps (request row, position) to a KV slot. `TokenToKVPool` owns one K and one
V tensor per layer, indexed by slot, and a free list of pages (page 0 is a dummy target for
padding, so slot 0 always holds finite values).
"""

from __future__ import annotations

import torch


class ReqToTokenPool:
    """int32 [max_reqs, max_len] table of KV slots, one row per running request."""

    def __init__(self, *, max_reqs: int, max_len: int, device: torch.device) -> None:
        self.max_reqs = max_reqs
        self.max_len = max_len
        self.table = torch.zeros(max_reqs, max_len, dtype=torch.int32, device=device)
        self.reset()

    def reset(self) -> None:
        self._free_rows = list(range(self.max_reqs - 1, -1, -1))

    def available(self) -> int:
        return len(self._free_rows)

    def can_allocate(self, n: int = 1) -> bool:
        return len(self._free_rows) >= n

    def allocate(self) -> int:
        if not self._free_rows:
            raise RuntimeError("ReqToTokenPool is full")
        return self._free_rows.pop()

    def free(self, row: int) -> None:
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        self.table[row, start : start + slots.numel()] = slots.to(torch.int32)

    def read(self, row: int, start: int, end: int) -> torch.Tensor:
        return self.table[row, start:end].to(torch.int64)


class TokenToKVPool:
    """K/V storage [num_layers, num_slots, kv_heads, head_dim] with a page free list."""

    def __init__(
        self,
        *,
        num_tokens: int,
        page_size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if page_size < 1 or num_tokens < page_size:
            raise ValueError(f"bad KV pool size: num_tokens={num_tokens}, page_size={page_size}")
        self.page_size = page_size
        self.num_pages = num_tokens // page_size
        self.size = self.num_pages * page_size
        shape = (num_layers, self.size + page_size, num_kv_heads, head_dim)
        # Slots are written before they are read, except page 0 (the dummy that padded
        # positions point at): only it is zeroed, so a large CPU pool costs no memset and its
        # memory is committed as it fills.
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.k[:, :page_size].zero_()
        self.v[:, :page_size].zero_()
        self.device = device
        self._free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.int64)

    def available_size(self) -> int:
        """Free token slots (whole free pages)."""
        return int(self._free_pages.numel()) * self.page_size

    def pages_needed(self, prefix_len: int, extend_len: int) -> int:
        """New pages to grow a sequence from `prefix_len` to `prefix_len + extend_len` tokens."""
        p = self.page_size
        return -(-(prefix_len + extend_len) // p) - (-(-prefix_len // p))

    def can_allocate_pages(self, n: int) -> bool:
        return n <= self._free_pages.numel()

    def allocate_pages(self, n: int) -> torch.Tensor:
        if n > self._free_pages.numel():
            raise RuntimeError(
                f"KV pool out of memory: need {n} pages, {self.available_size()} free"
            )
        pages, self._free_pages = self._free_pages[:n], self._free_pages[n:]
        return pages

    def allocate_extend(self, *, prefix_len: int, extend_len: int, last_slot: int) -> torch.Tensor:
        """Slots for `extend_len` new tokens after `prefix_len`, filling the last page first."""
        p = self.page_size
        if p == 1:
            return self.allocate_pages(extend_len)
        in_page = min(extend_len, (p - prefix_len % p) % p)
        head = torch.arange(last_slot + 1, last_slot + 1 + in_page, dtype=torch.int64)
        pages = self.allocate_pages(self.pages_needed(prefix_len, extend_len))
        tail = (pages[:, None] * p + torch.arange(p)).flatten()[: extend_len - in_page]
        return torch.cat([head, tail])

    def free(self, slots: torch.Tensor) -> None:
        """Free the pages holding `slots` (the caller owns those pages whole)."""
        if slots.numel() == 0:
            return
        pages = torch.unique(slots.cpu().to(torch.int64) // self.page_size)
        self._free_pages = torch.cat([self._free_pages, pages])

    def free_pages(self) -> torch.Tensor:
        return self._free_pages.clone()

    def clear(self) -> None:
        self._free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.int64)

"""Tensors the kernels stream from, kept on huge pages: :func:`empty_huge`.

A one-token decode reads every weight once, from memory, a few hundred megabytes a step. On
4 KiB pages that stream takes a page walk every 4 KiB and the core's prefetchers start over at
every page: a C loop reading 512 MiB with the matmul's mix of work (16 dot instructions per
256 bytes) drew 9.7 GB/s from one core here on 4 KiB pages and 17.3 GB/s on 2 MiB pages. In
the matmul itself the gain is smaller (a 1B-class decode 2-3% faster), as it is bound by its
own instructions about as much as by memory. So a packed weight's arrays live in their own
anonymous mapping, advised to the kernel as huge pages (``MADV_HUGEPAGE``) before anything
touches it. Where the system has no transparent huge pages, or refuses the advice, the memory
is ordinary pages and nothing else changes."""

from __future__ import annotations

import contextlib
import math
import mmap

import torch

HUGE_PAGE = 2 << 20
ALIGN = 64  # each tensor starts on a cache line
_ADVICE = getattr(mmap, "MADV_HUGEPAGE", None)

Spec = tuple[tuple[int, ...], torch.dtype]


def empty_huge(*specs: Spec | None) -> tuple[torch.Tensor | None, ...]:
    """Uninitialized contiguous CPU tensors of the given (shape, dtype) (None for a None),
    side by side in one fresh mapping, starting at a 2 MiB boundary, whose whole huge pages
    are advised as such when they take at least one. The last partial huge page stays on
    ordinary pages (a huge one would hold up to 2 MiB that no tensor uses), and the unused
    head of the mapping is never touched, so it takes no memory. A part's codes and scales
    so share pages and stream as one."""
    sizes = [0 if s is None else math.prod(s[0]) * s[1].itemsize for s in specs]
    starts = [sum(-(-n // ALIGN) * ALIGN for n in sizes[:i]) for i in range(len(sizes))]
    total = starts[-1] + sizes[-1] if sizes else 0
    if _ADVICE is None or total < HUGE_PAGE:
        return tuple(None if s is None else torch.empty(s[0], dtype=s[1]) for s in specs)
    region = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(region, dtype=torch.uint8)
    base = -raw.data_ptr() % HUGE_PAGE
    with contextlib.suppress(OSError):  # no transparent huge pages here: ordinary pages
        region.madvise(_ADVICE, base, total // HUGE_PAGE * HUGE_PAGE)
    return tuple(
        None if s is None else raw[base + at : base + at + n].view(s[1]).view(s[0])
        for s, at, n in zip(specs, starts, sizes, strict=True)
    )

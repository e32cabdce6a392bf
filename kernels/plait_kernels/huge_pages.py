"""Host memory on transparent huge pages, for the arrays the CPU kernels stream every step.

A decode step reads every weight once. With 4 KiB pages that is a TLB miss every 4 KiB of
weights (in a virtual machine each one a two-dimensional page walk); on 2 MiB pages, one every
2 MiB. Linux gives an anonymous mapping huge pages where it is advised to (``MADV_HUGEPAGE``;
the default ``enabled`` setting is ``madvise``), so :func:`empty_huge` maps such an array itself
and advises the whole 2 MiB pages inside it: its first and last partial pages stay small, so no
array holds more memory than it uses. Where the platform has no such advice, or the array is
smaller than a huge page, it is a plain ``torch.empty``.

The packed weights (`native_weight`) live there: on a Zen 4 VM a one-row matmul over 200 MB of
Q4_K and Q6_K weights read them 1.02-1.24x as fast as from small pages, and one-request decode
of a 1B-class file ran about 4% faster (docs/performance.md). The KV pool does not: zeroing its
dummy page would commit a huge page per layer, and faulting those in after the weights cost a
load 0.8 s there, for attention that is a few percent of a step.
"""

from __future__ import annotations

import contextlib
import math
import mmap

import torch

HUGE_PAGE = 2 << 20  # bytes: x86-64's and arm64's (4 KiB granule) transparent huge page


def empty_huge(shape: tuple[int, ...], *, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized CPU tensor of `shape` whose whole 2 MiB pages are advised to be huge
    (a plain ``torch.empty`` below one huge page or without ``MADV_HUGEPAGE``). The tensor
    keeps its mapping alive; the mapping is released with the last tensor that views it."""
    nbytes = math.prod(shape) * dtype.itemsize
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < HUGE_PAGE or advice is None:
        return torch.empty(shape, dtype=dtype)
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = torch.frombuffer(region, dtype=torch.uint8)
    start = -whole.data_ptr() % HUGE_PAGE  # the first huge page boundary in the mapping
    huge = nbytes // HUGE_PAGE * HUGE_PAGE
    with contextlib.suppress(OSError):  # a kernel without huge pages: the advice is a hint
        region.madvise(advice, start, huge)
    return whole[start : start + nbytes].view(dtype).view(shape)

"""Huge pages for what the CPU kernels stream: `empty_huge` and the packed weights."""

from __future__ import annotations

import gc
import mmap
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_synthetic import random_blocks

from plait.kernels.huge_pages import HUGE_PAGE, empty_huge
from plait.kernels.native_weight import NativeWeight

SMAPS = Path("/proc/self/smaps")
pytestmark = pytest.mark.skipif(
    not hasattr(mmap, "MADV_HUGEPAGE") or not SMAPS.exists(),
    reason="needs Linux's MADV_HUGEPAGE and /proc/self/smaps",
)


def advised(t: torch.Tensor) -> bool:
    """Whether the area holding `t`'s first byte has the huge-page advice (`hg` in VmFlags)."""
    addr, inside = t.data_ptr(), False
    for line in SMAPS.read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if not head.endswith(":"):  # an area's first line: "lo-hi perms ..."
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "VmFlags:":
            return "hg" in line.split()[1:]
    raise AssertionError(f"no mapping holds {addr:#x}")


def test_large_arrays_start_on_an_advised_huge_page() -> None:
    t = empty_huge((3, HUGE_PAGE // 4), dtype=torch.float32)  # 3 huge pages' worth
    assert (t.shape, t.dtype, t.is_contiguous()) == ((3, HUGE_PAGE // 4), torch.float32, True)
    assert t.data_ptr() % HUGE_PAGE == 0
    assert advised(t)
    t.copy_(torch.arange(t.numel(), dtype=torch.float32).view(t.shape))
    assert float(t[2, -1]) == t.numel() - 1


def test_small_arrays_are_plain_tensors() -> None:
    t = empty_huge((HUGE_PAGE // 2 - 1,), dtype=torch.int16)  # a byte short of a huge page
    assert t.shape == (HUGE_PAGE // 2 - 1,) and t.dtype == torch.int16
    assert t.untyped_storage().nbytes() == HUGE_PAGE - 2  # its own storage, no mapping's slack
    big = empty_huge((HUGE_PAGE // 2,), dtype=torch.int16)
    assert big.untyped_storage().nbytes() == 2 * HUGE_PAGE  # a view into its mapping


def test_a_view_keeps_the_mapping_alive() -> None:
    t = empty_huge((HUGE_PAGE + 100,), dtype=torch.uint8)
    t.fill_(7)
    tail = t[-10:]
    del t
    gc.collect()
    assert tail.tolist() == [7] * 10


def test_packed_weights_are_advised() -> None:
    n, k = 4096, 2048  # Q4_K codes: 4 MiB
    w = NativeWeight.from_gguf("Q4_K", random_blocks("Q4_K", n, k, np.random.default_rng(0)))
    codes = w.parts[0].codes
    assert codes.numel() >= 2 * HUGE_PAGE and advised(codes)
    d = w.parts[0].d  # 64 KiB: a plain tensor (whose memory numpy may have advised: not asked)
    assert d is not None and d.untyped_storage().nbytes() == d.numel() * 2
    both = NativeWeight.stack([w, w])  # joined parts are copied into advised memory too
    assert len(both.parts) == 1 and advised(both.parts[0].codes)
    assert torch.equal(both.parts[0].codes[: codes.shape[0]], codes)


def test_a_kernel_refusing_the_advice_still_gets_its_array(monkeypatch: pytest.MonkeyPatch) -> None:
    class Refusing(mmap.mmap):
        def madvise(self, *args: int) -> None:
            raise OSError(22, "Invalid argument")  # a kernel built without huge pages

    monkeypatch.setattr(mmap, "mmap", Refusing)
    t = empty_huge((HUGE_PAGE,), dtype=torch.uint8)
    t.fill_(3)
    assert t.shape == (HUGE_PAGE,) and int(t.sum()) == 3 * HUGE_PAGE and not advised(t)

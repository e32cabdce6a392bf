"""Packed weights on huge pages (`empty_huge`): tensors of the asked shapes side by side in one
mapping advised as huge pages, small ones left to torch; a packed weight's arrays share it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_synthetic import random_blocks

from plait.kernels.huge_pages import ALIGN, HUGE_PAGE, empty_huge
from plait.kernels.native_weight import NativeWeight

linux = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/smaps")


def vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping holding `address`."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_shapes_dtypes_alignment_and_nones() -> None:
    specs = [((3, 1 << 20), torch.uint8), None, ((1000, 16), torch.float16), ((7,), torch.int8)]
    out = empty_huge(*specs)
    assert out[1] is None
    for t, spec in zip(out, specs, strict=True):
        if spec is None:
            continue
        assert t is not None and tuple(t.shape) == spec[0] and t.dtype == spec[1]
        assert t.is_contiguous() and t.data_ptr() % ALIGN == 0
    a, _, b, c = out
    assert a is not None and b is not None and c is not None
    assert b.data_ptr() == a.data_ptr() + a.numel()  # side by side, in order
    assert c.data_ptr() == b.data_ptr() + b.numel() * 2
    a.fill_(1), b.fill_(2.5), c.fill_(-3)  # each is its own memory
    assert int(a.sum()) == 3 << 20 and float(b[999, 15]) == 2.5 and int(c.sum()) == -21


@linux
def test_big_tensors_are_advised_small_ones_are_not() -> None:
    (big,) = empty_huge(((2 * HUGE_PAGE,), torch.uint8))
    assert big is not None and "hg" in vm_flags(big.data_ptr())
    assert big.data_ptr() % HUGE_PAGE == 0  # the first huge page starts the tensor
    (small,) = empty_huge(((4096,), torch.uint8))
    assert small is not None and "hg" not in vm_flags(small.data_ptr())


@linux
def test_a_packed_weight_keeps_codes_and_scales_in_one_advised_mapping() -> None:
    w = NativeWeight.from_gguf("Q4_K", random_blocks("Q4_K", 4096, 1024, np.random.default_rng(0)))
    part = w.parts[0]
    assert part.codes.nbytes >= HUGE_PAGE
    assert "hg" in vm_flags(part.codes.data_ptr())
    for t in part.tensors:
        assert t.untyped_storage().data_ptr() == part.codes.untyped_storage().data_ptr()
    stacked = NativeWeight.stack([w, w])  # joined parts: copied into a new advised mapping
    assert "hg" in vm_flags(stacked.parts[0].codes.data_ptr())
    assert torch.equal(stacked.dequantize(), torch.cat([w.dequantize()] * 2))

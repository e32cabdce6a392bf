"""apply_token_bitmask: Triton (interpreter) vs torch path vs xgrammar."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import xgrammar

from plait.kernels import apply_token_bitmask
from plait.kernels import bitmask as bitmask_module
from plait.kernels._native import CSRC, build_library, load_native
from plait.kernels.bitmask import (
    _apply_generic,
    apply_token_bitmask_torch,
    apply_token_bitmask_triton,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def pack(allowed: torch.Tensor) -> torch.Tensor:
    """[B, W*32] bool -> [B, W] int32, little-endian bits (xgrammar's layout)."""
    b, n = allowed.shape
    packed = np.packbits(allowed.numpy().astype(np.uint8), axis=-1, bitorder="little")
    return torch.from_numpy(packed.view(np.int32).reshape(b, n // 32).copy())


def random_mask(b: int, words: int, frac: float, *, seed: int, structured: bool = False):
    g = torch.Generator().manual_seed(seed)
    if structured:
        # Whole ranges of ids allowed or not (as grammars produce), plus a few stray ids.
        chunks = torch.rand(b, (words + 7) // 8, generator=g) < frac
        allowed = chunks.repeat_interleave(256, dim=1)[:, : words * 32]
        allowed ^= torch.rand(b, words * 32, generator=g) < 0.0005
    else:
        allowed = torch.rand(b, words * 32, generator=g) < frac
    return allowed, pack(allowed)


def expected(logits: torch.Tensor, allowed: torch.Tensor, rows: list[int] | None) -> torch.Tensor:
    """Plain definition: disallowed (or beyond the bitmask) -> -inf, on the selected rows."""
    out = logits.clone()
    v = logits.shape[1]
    keep = torch.zeros_like(logits, dtype=torch.bool)
    n = min(v, allowed.shape[1])
    keep[:, :n] = allowed[:, :n]
    sel = range(logits.shape[0]) if rows is None else rows
    for r in sel:
        out[r][~keep[r]] = float("-inf")
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [32000, 128256, 151936])
@pytest.mark.parametrize("frac", [0.01, 0.5, 0.99])
def test_triton_matches_torch(dtype: torch.dtype, vocab: int, frac: float) -> None:
    words = (vocab + 31) // 32
    allowed, bitmask = random_mask(3, words, frac, seed=vocab)
    logits = torch.randn(3, vocab).to(dtype)
    a, b = logits.clone(), logits.clone()
    apply_token_bitmask(a, bitmask, impl="torch")
    apply_token_bitmask_triton(b, bitmask, block_words=2048, programs=4)
    assert torch.equal(a, b)
    assert torch.equal(a, expected(logits, allowed, None))


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_indices_and_ragged_widths(dtype: torch.dtype) -> None:
    # Logits wider than the bitmask (tail masked) and a bitmask wider than logits (bits ignored).
    for vocab, words in [(1000, 30), (1000, 40), (31, 1)]:
        allowed, bitmask = random_mask(5, words, 0.5, seed=vocab + words)
        logits = torch.randn(5, vocab).to(dtype)
        for rows in (None, [4, 1]):
            a, b = logits.clone(), logits.clone()
            apply_token_bitmask(a, bitmask, indices=rows, impl="torch")
            apply_token_bitmask(b, bitmask, indices=rows, impl="triton")
            want = expected(logits, allowed, rows)
            assert torch.equal(a, want), (vocab, words, rows)
            assert torch.equal(b, want), (vocab, words, rows)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("frac", [0.0, 0.001, 0.01, 0.3, 0.5, 0.9, 0.99, 1.0])
@pytest.mark.parametrize("structured", [False, True])
@pytest.mark.parametrize("native", [True, False])
def test_torch_matches_xgrammar(
    dtype: torch.dtype, frac: float, structured: bool, native: bool
) -> None:
    vocab = 128256
    _, bitmask = random_mask(16, vocab // 32, frac, seed=int(frac * 1000), structured=structured)
    logits = torch.randn(16, vocab).to(dtype)
    for rows in (None, [0, 7, 15]):
        a, ref = logits.clone(), logits.clone()
        idx = None if rows is None else torch.tensor(rows)
        apply_token_bitmask_torch(a, bitmask, idx, native=native)
        xgrammar.apply_token_bitmask_inplace(ref, bitmask, indices=rows)
        assert torch.equal(a, ref)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("frac", [0.0, 0.3, 0.995, 1.0])
def test_torch_ragged_and_strided(native: bool, frac: float) -> None:
    # Logits narrower/wider than the mask (a partial tail word), strided rows, row subsets.
    for vocab, words in [(1000, 30), (1000, 40), (999, 32), (31, 1)]:
        allowed, bitmask = random_mask(5, words, frac, seed=vocab + words)
        base = torch.randn(5, vocab + 24)
        for rows in (None, [3, 0]):
            view = base.clone()[:, :vocab]
            idx = None if rows is None else torch.tensor(rows)
            apply_token_bitmask_torch(view, bitmask, idx, native=native)
            assert torch.equal(view, expected(base[:, :vocab], allowed, rows)), (vocab, words)


def test_without_a_compiler_xgrammar_kernel_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bitmask_module, "load_native", lambda name: None)
    calls: list[int] = []
    real = bitmask_module._xgrammar_cpu()
    assert real is not None
    counted = lambda *a, **k: calls.append(1) or real(*a, **k)  # noqa: E731
    monkeypatch.setattr(bitmask_module, "_xgrammar_cpu", lambda: counted)
    allowed, bitmask = random_mask(3, 40, 0.9, seed=5)
    base = torch.randn(3, 1270)
    for rows in (None, [2, 0]):
        out = base.clone()
        apply_token_bitmask(out, bitmask, indices=rows)
        assert torch.equal(out, expected(base, allowed, rows))
    assert len(calls) == 2


def test_native_kernel_builds_once_and_reports_failures(tmp_path: Path) -> None:
    assert load_native("bitmask_cpu") is not None  # the CPU path really runs the C kernel here
    source = CSRC / "bitmask_cpu.c"
    first = build_library(source, cc="cc", out_dir=tmp_path)
    stamp = first.stat().st_mtime_ns
    assert build_library(source, cc="cc", out_dir=tmp_path) == first  # reused, not rebuilt
    assert first.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary files left
    with pytest.raises(RuntimeError, match="no-such-compiler"):
        build_library(source, cc="no-such-compiler", out_dir=tmp_path / "x")
    broken = tmp_path / "broken.c"
    broken.write_text("int f( {")
    with pytest.raises(RuntimeError, match="failed"):
        build_library(broken, cc="cc", out_dir=tmp_path)


def test_torch_strided_logits_and_generic_path() -> None:
    allowed, bitmask = random_mask(4, 40, 0.9, seed=3)
    base = torch.randn(4, 1500)
    want = expected(base[:, :1200], allowed, None)
    view = base.clone()[:, :1200]  # row stride 1500
    apply_token_bitmask(view, bitmask)
    assert torch.equal(view, want)
    # The any-device fallback (used for CUDA tensors with impl="torch").
    generic = base[:, :1200].clone()
    _apply_generic(generic, bitmask, None, 1200)
    assert torch.equal(generic, want)


def test_empty_batches() -> None:
    bitmask = torch.zeros(0, 10, dtype=torch.int32)
    for impl in ("torch", "triton"):
        apply_token_bitmask(torch.zeros(0, 320), bitmask, impl=impl)
        logits = torch.zeros(2, 320)
        apply_token_bitmask(logits, torch.zeros(2, 10, dtype=torch.int32), indices=[], impl=impl)
        assert torch.equal(logits, torch.zeros(2, 320))
    apply_token_bitmask_torch(torch.zeros(2, 320), torch.zeros(2, 0, dtype=torch.int32))


def test_input_checks() -> None:
    logits = torch.zeros(2, 64)
    good = torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="logits"):
        apply_token_bitmask(torch.zeros(64), good)
    with pytest.raises(ValueError, match="logits"):
        apply_token_bitmask(torch.zeros(2, 64, dtype=torch.int32), good)
    with pytest.raises(ValueError, match="bitmask"):
        apply_token_bitmask(logits, good.long())
    with pytest.raises(ValueError, match="bitmask"):
        apply_token_bitmask(logits, torch.zeros(3, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="indices"):
        apply_token_bitmask(logits, good, indices=[2])
    with pytest.raises(ValueError, match="indices"):
        apply_token_bitmask(logits, good, indices=torch.zeros(1, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="impl"):
        apply_token_bitmask(logits, good, impl="cuda")

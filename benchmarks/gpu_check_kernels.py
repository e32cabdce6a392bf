"""The kernel sections of `benchmarks.gpu_check`: the device's copy bandwidth, every Triton kernel
against its torch reference (error and time), and the grammar mask against xgrammar's own.

Bytes moved are what a kernel must read and write once (as in `benchmarks/kernels.py`), so
`bytes / time / peak` is its share of the memory bandwidth, the peak being a measured
device-to-device copy (`copy_bandwidth`). On the CPU (`--dry-run`) the Triton kernels run
under `TRITON_INTERPRET=1` at tiny sizes: the errors mean something there, the times do not.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import torch

from benchmarks.kernels import gguf_like, packed_mask, paged_case
from plait.kernels import (
    apply_token_bitmask,
    extend_attention,
    paged_decode_attention,
    rmsnorm,
    rope,
    store_kv,
    top_k_top_p_sample,
)
from plait.kernels.quant import quant_linear, quant_linear_reference


@dataclass(frozen=True)
class KernelSizes:
    """The shapes each kernel check runs at (`REAL` on CUDA, `TINY` for the dry run)."""

    dtype: torch.dtype
    copy_mib: int
    repeats: int
    inner: int  # calls per timed sample (small kernels: launch overhead amortized)
    warmup: bool  # one untimed call first (Triton compiles there)
    bitmask: tuple[int, int]  # batch, vocab
    decode: tuple[tuple[int, int, int, int, int], ...]  # b, ctx, hq, hkv, d
    extend: tuple[int, int, int, int, int, int]  # b, prefix, extend, hq, hkv, d
    tokens: tuple[int, int, int, int, int]  # T, hidden, hq, hkv, d
    sampling: tuple[int, int]  # batch, vocab
    quant: tuple[tuple[str, int, int, int], ...]  # name, n, k, bits (Q4_1 or Q8_0)
    quant_m: tuple[int, ...]
    mask_vocabs: tuple[int, ...]
    mask_batches: tuple[int, ...]


REAL = KernelSizes(
    dtype=torch.bfloat16, copy_mib=2048, repeats=10, inner=10, warmup=True, bitmask=(512, 128256),
    decode=((64, 4096, 32, 8, 128), (64, 1024, 9, 3, 64)), extend=(4, 1500, 700, 32, 8, 128),
    tokens=(4096, 4096, 32, 8, 128), sampling=(64, 128256),
    quant=(("gate_up", 3072, 576, 4), ("lm_head", 49152, 576, 8)), quant_m=(1, 16, 512),
    mask_vocabs=(49152, 128256), mask_batches=(1, 16, 64),
)  # fmt: skip
TINY = KernelSizes(
    dtype=torch.float32, copy_mib=16, repeats=1, inner=1, warmup=False, bitmask=(2, 500),
    decode=((1, 16, 2, 1, 16),), extend=(1, 8, 4, 2, 1, 16), tokens=(4, 32, 2, 1, 16),
    sampling=(2, 128), quant=(("gate_up", 32, 32, 4), ("lm_head", 16, 32, 8)), quant_m=(1, 3),
    mask_vocabs=(500,), mask_batches=(1, 4),
)  # fmt: skip


@dataclass(frozen=True)
class Check:
    """One kernel at one size: its error against the reference and both times."""

    kernel: str
    case: str
    ok: bool
    max_err: float
    tol: float
    triton_ms: float
    torch_ms: float
    speedup: float
    gbytes: float
    gbps: float
    peak_share: float | None


class Timer:
    """Median milliseconds per call: CUDA events around `inner` calls on CUDA, wall time on the
    CPU; first an untimed call when the sizes ask for it."""

    def __init__(self, device: torch.device, sizes: KernelSizes) -> None:
        self.cuda = device.type == "cuda"
        self.repeats, self.inner, self.warmup = sizes.repeats, sizes.inner, sizes.warmup

    def ms(self, fn: Callable[[], object]) -> float:
        if self.warmup:
            fn()
            self._sync()
        samples = [self._sample(fn) for _ in range(self.repeats)]
        return statistics.median(samples) / self.inner

    def _sample(self, fn: Callable[[], object]) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            for _ in range(self.inner):
                fn()
            return (time.perf_counter() - t0) * 1e3
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(self.inner):
            fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def copy_bandwidth(device: torch.device, sizes: KernelSizes) -> dict[str, Any]:
    """The peak the shares are taken of: a device-to-device copy (read + write) in GB/s."""
    nbytes = sizes.copy_mib << 20
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = Timer(device, sizes).ms(lambda: dst.copy_(src))
    return {"bytes": 2 * nbytes, "ms": ms, "gbps": 2 * nbytes / ms / 1e6}


class KernelChecks:
    """Runs each kernel's check; `rows` collects them, `peak_gbps` divides their GB/s."""

    def __init__(self, device: torch.device, sizes: KernelSizes, peak_gbps: float | None) -> None:
        self.dev, self.sizes, self.peak = device, sizes, peak_gbps
        self.timer = Timer(device, sizes)
        self.rows: list[Check] = []

    def add(
        self,
        kernel: str,
        case: str,
        err: tuple[float, float],
        nbytes: float,
        fn: Callable[..., object],
    ) -> None:
        """Record a check: `err` is (max error, its tolerance); `fn(impl=...)` runs the kernel
        (timed with impl="triton" and impl="torch")."""
        fast, slow = (self.timer.ms(partial(fn, impl=impl)) for impl in ("triton", "torch"))
        gbps = nbytes / fast / 1e6
        share = gbps / self.peak if self.peak else None
        figures = (err[0], err[1], fast, slow, slow / fast, nbytes / 1e9, gbps, share)
        self.rows.append(Check(kernel, case, err[0] <= err[1], *figures))

    @property
    def el(self) -> int:
        return self.sizes.dtype.itemsize

    @property
    def tag(self) -> str:
        return str(self.sizes.dtype).removeprefix("torch.")


def max_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).abs().max()) if out.numel() else 0.0


def tolerance(dtype: torch.dtype) -> float:
    return 1e-4 if dtype == torch.float32 else 3e-2


def check_bitmask(kc: KernelChecks) -> None:
    b, vocab = kc.sizes.bitmask
    mask = packed_mask(b, vocab, 0.01, structured=False, seed=1).to(kc.dev)
    logits = torch.randn(b, vocab, device=kc.dev)
    out, ref = logits.clone(), logits.clone()
    apply_token_bitmask(out, mask, impl="triton")
    apply_token_bitmask(ref, mask, impl="torch")
    err = 0.0 if torch.equal(out, ref) else float("inf")
    nbytes = mask.numel() * 4 + b * vocab * 0.99 * 4  # the mask read, the 99% masked written
    case = f"B={b} V={vocab} fp32 1% allowed"
    kc.add("apply_token_bitmask", case, (err, 0.0), nbytes, partial(apply_token_bitmask, out, mask))


def check_decode(kc: KernelChecks) -> None:
    for shape in kc.sizes.decode:
        decode_case(kc, *shape)


def decode_case(kc: KernelChecks, b: int, ctx: int, hq: int, hkv: int, d: int) -> None:
    """Errors at random lengths; times with every request at `ctx` (the bytes counted)."""
    dtype, dev = kc.sizes.dtype, kc.dev
    k_pool, v_pool, r2t, slots = paged_case(b, ctx, hkv, d, dtype, dev, shuffled=True)
    q = torch.randn(b, hq, d, dtype=dtype, device=dev)
    lens = torch.randint(1, ctx + 1, (b,), device=dev)
    run = partial(paged_decode_attention, q, k_pool, v_pool, r2t, slots, scale=d**-0.5)
    err = max_err(run(lens, impl="triton"), run(lens, impl="torch"))
    full = torch.full((b,), ctx, device=dev)
    nbytes = 2 * b * ctx * hkv * d * kc.el + b * ctx * 4 + 2 * q.numel() * kc.el
    case = f"B={b} ctx={ctx} Hq={hq} Hkv={hkv} D={d} {kc.tag}, slots shuffled"
    kc.add("paged_decode_attention", case, (err, tolerance(dtype)), nbytes, partial(run, full))


def check_extend(kc: KernelChecks) -> None:
    b, pre, ext, hq, hkv, d = kc.sizes.extend
    dtype, dev = kc.sizes.dtype, kc.dev
    k_pool, v_pool, r2t, slots = paged_case(b, pre + ext, hkv, d, dtype, dev, shuffled=True)
    q = torch.randn(b * ext, hq, d, dtype=dtype, device=dev)
    lens = (torch.full((b,), pre, device=dev), torch.full((b,), ext, device=dev))
    run = partial(extend_attention, q, k_pool, v_pool, r2t, slots, *lens, scale=d**-0.5)
    err = (max_err(run(impl="triton"), run(impl="torch")), 2 * tolerance(dtype))
    nbytes = 2 * b * (pre + ext) * hkv * d * kc.el + 2 * q.numel() * kc.el
    case = f"B={b} prefix={pre} extend={ext} Hq={hq} Hkv={hkv} D={d} {kc.tag}"
    kc.add("extend_attention", case, err, nbytes, run)


def check_rmsnorm(kc: KernelChecks) -> None:
    t, h = kc.sizes.tokens[:2]
    x = torch.randn(t, h, dtype=kc.sizes.dtype, device=kc.dev)
    w = torch.randn(h, dtype=kc.sizes.dtype, device=kc.dev)
    run = partial(rmsnorm, x, w, eps=1e-6, residual=torch.randn_like(x))
    (out, summed), (ref, ref_sum) = run(impl="triton"), run(impl="torch")
    err = (max(max_err(out, ref), max_err(summed, ref_sum)), tolerance(kc.sizes.dtype))
    kc.add("rmsnorm", f"T={t} H={h} +residual {kc.tag}", err, 4 * x.numel() * kc.el, run)


def rope_cache(d: int, positions: int, device: torch.device) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=device).float() / d))
    ang = torch.arange(positions, device=device).float()[:, None] * inv
    return torch.cat([ang.cos(), ang.sin()], -1)


def check_rope(kc: KernelChecks) -> None:
    t, _, hq, hkv, d = kc.sizes.tokens
    qkv = torch.randn(t, hq + 2 * hkv, d, dtype=kc.sizes.dtype, device=kc.dev)
    ref = qkv.clone()
    pos = torch.randint(0, 4 * t, (t,), device=kc.dev)
    cache = rope_cache(d, 4 * t, kc.dev)
    rope(qkv[:, :hq], qkv[:, hq : hq + hkv], pos, cache, impl="triton")
    rope(ref[:, :hq], ref[:, hq : hq + hkv], pos, cache, impl="torch")
    run = partial(rope, qkv[:, :hq], qkv[:, hq : hq + hkv], pos, cache)
    case = f"T={t} Hq={hq} Hkv={hkv} D={d} fused-qkv views {kc.tag}"
    err = (max_err(qkv, ref), tolerance(kc.sizes.dtype))
    kc.add("rope", case, err, 2 * t * (hq + hkv) * d * kc.el + t * d * 4, run)


def check_store(kc: KernelChecks) -> None:
    t, _, hq, hkv, d = kc.sizes.tokens
    qkv = torch.randn(t, hq + 2 * hkv, d, dtype=kc.sizes.dtype, device=kc.dev)
    k, v = qkv[:, hq : hq + hkv], qkv[:, hq + hkv :]
    k_pool = torch.zeros(4 * t, hkv, d, dtype=kc.sizes.dtype, device=kc.dev)
    v_pool = torch.zeros_like(k_pool)
    slots = torch.randperm(4 * t, device=kc.dev)[:t]
    store_kv(k, v, k_pool, v_pool, slots, impl="triton")
    err = 0.0 if torch.equal(k_pool[slots], k) and torch.equal(v_pool[slots], v) else 1.0
    case = f"T={t} Hkv={hkv} D={d} strided k/v {kc.tag}"
    run = partial(store_kv, k, v, k_pool, v_pool, slots)
    kc.add("store_kv", case, (err, 0.0), 4 * t * hkv * d * kc.el, run)


def check_sampling(kc: KernelChecks) -> None:
    """Sampled ids against the torch path's: a rare flip at a boundary of the cumulative sum
    (a different summation order) is allowed, as in tests/test_kernels_gpu.py."""
    b, vocab = kc.sizes.sampling
    logits = torch.randn(b, vocab, device=kc.dev, dtype=torch.float64) * 4
    probs = torch.softmax(logits, -1).float()
    top_k = torch.randint(0, 100, (b,), device=kc.dev)
    top_p = torch.rand(b, device=kc.dev) * 0.5 + 0.5
    u = torch.rand(b, device=kc.dev)
    run = partial(top_k_top_p_sample, probs, top_k=top_k, top_p=top_p, uniforms=u)
    disagree = float((run(impl="triton") != run(impl="torch")).float().mean())
    case = f"B={b} V={vocab} (error: share of ids that differ)"
    kc.add("top_k_top_p_sample", case, (disagree, 0.05), probs.numel() * 4, run)


def check_quant(kc: KernelChecks) -> None:
    """quant_linear on SmolLM2's shapes (GGUF-like Q4_1 layer, Q8_0 LM head) against the
    reference (de-quantize, then matmul); the torch path is the timed baseline."""
    for name, n, k, bits in kc.sizes.quant:
        w = gguf_like(n, k, bits, kc.dev)
        for m in kc.sizes.quant_m:
            x = torch.randn(m, k, device=kc.dev).to(kc.sizes.dtype)
            ref = quant_linear_reference(x, w)
            tol = tolerance(kc.sizes.dtype) * max(1.0, float(ref.float().abs().max()))
            err = (max_err(quant_linear(x, w, impl="triton"), ref), tol)
            nbytes = w.nbytes + (m * k + m * n) * kc.el
            case = f"{name} {k}->{n} {'Q4_1' if bits == 4 else 'Q8_0'} M={m} {kc.tag}"
            kc.add("quant_linear", case, err, nbytes, partial(quant_linear, x, w))


BANDWIDTH_GOAL = 0.5
CHECKS = (
    check_bitmask,
    check_decode,
    check_extend,
    check_rmsnorm,
    check_rope,
    check_store,
    check_sampling,
    check_quant,
)


def kernel_checks(
    device: torch.device, sizes: KernelSizes, peak_gbps: float | None, *, deadline: float
) -> dict[str, Any]:
    """Every Triton kernel against its torch path; a check that raises is recorded as an
    error, one that would start past `deadline` (time.monotonic) is left out."""
    kc = KernelChecks(device, sizes, peak_gbps)
    errors, left_out = run_checks(kc, deadline)
    rows = [asdict(r) for r in kc.rows]
    ok = not errors and all(r["ok"] for r in rows)
    return {"ok": ok, "peak_gbps": peak_gbps, "bandwidth_goal": bandwidth_goal(rows),
            "rows": rows, "errors": errors, "left_out": left_out}  # fmt: skip


def run_checks(kc: KernelChecks, deadline: float) -> tuple[dict[str, str], list[str]]:
    errors, left_out = {}, []
    for check in CHECKS:
        if time.monotonic() > deadline:
            left_out.append(check.__name__)
            continue
        try:
            check(kc)
        except Exception as exc:  # noqa: BLE001 - one kernel must not hide the others
            errors[check.__name__] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return errors, left_out


def bandwidth_goal(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's goal: the mask kernel and decode attention at >= 50% of the peak."""
    wanted = ("apply_token_bitmask", "paged_decode_attention")
    return [
        {
            "kernel": r["kernel"],
            "case": r["case"],
            "peak_share": r["peak_share"],
            "meets_goal": r["peak_share"] is not None and r["peak_share"] >= BANDWIDTH_GOAL,
        }
        for r in rows
        if r["kernel"] in wanted
    ]


def mask_vs_xgrammar(device: torch.device, sizes: KernelSizes) -> dict[str, Any]:
    """plait's `apply_token_bitmask` against `xgrammar.apply_token_bitmask_inplace` on the same
    logits and masks (half the ids allowed): time per token (row), and equality."""
    timer = Timer(device, sizes)
    rows = [mask_row(timer, device, v, b) for v in sizes.mask_vocabs for b in sizes.mask_batches]
    backend = "triton" if device.type == "cuda" else "cpu"  # what xgrammar's "auto" picks
    return {"ok": all(r["equal"] for r in rows), "xgrammar_backend": backend, "rows": rows}


def mask_row(timer: Timer, device: torch.device, vocab: int, b: int) -> dict[str, Any]:
    import xgrammar

    mask = packed_mask(b, vocab, 0.5, structured=False, seed=b).to(device)
    ours = torch.randn(b, vocab, device=device)
    theirs = ours.clone()
    apply_token_bitmask(ours, mask)
    xgrammar.apply_token_bitmask_inplace(theirs, mask)
    equal = torch.equal(ours, theirs)
    plait_ms = timer.ms(partial(apply_token_bitmask, ours, mask))
    xgr_ms = timer.ms(partial(xgrammar.apply_token_bitmask_inplace, theirs, mask))
    us = {"plait_us_per_token": 1e3 * plait_ms / b, "xgrammar_us_per_token": 1e3 * xgr_ms / b}
    return {
        "vocab": vocab,
        "batch": b,
        "equal": equal,
        **us,
        "xgrammar_over_plait": xgr_ms / plait_ms,
    }

"""Kernel micro-benchmarks: the dispatched path vs the torch reference (and xgrammar on CPU).

    python benchmarks/kernels.py [--quick] [--peak-gbps 4800] [--threads 1] [--only quant]

Runs on CUDA when available (dispatch -> Triton), else on CPU (dispatch -> the torch path, so
there the reference column is a different baseline: xgrammar for the bitmask). Prints a markdown
table and writes benchmarks/results/kernels.json. Bandwidth counts the bytes a kernel must move
(its inputs read once, its outputs written once), so it is comparable across implementations.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from plait.kernels import (
    apply_token_bitmask,
    extend_attention,
    paged_decode_attention,
    rmsnorm,
    rope,
    store_kv,
    top_k_top_p_sample,
)
from plait.kernels.bitmask import apply_token_bitmask_torch
from plait.kernels.decode_attention import paged_decode_attention_torch
from plait.kernels.quant import QuantWeight, quant_linear

RESULTS = Path(__file__).resolve().parent / "results" / "kernels.json"


@dataclass(frozen=True)
class Row:
    kernel: str
    case: str
    impl: str
    ms: float
    gbps: float
    peak_frac: float | None
    speedup_vs_ref: float | None


def timed(
    fns: dict[str, Callable[[], object]], device: torch.device, repeats: int
) -> dict[str, float]:
    """Median wall time (ms) of each function; the repeats are interleaved round-robin so a
    noisy machine or a warming cache penalizes every implementation alike."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for fn in fns.values():
        fn()
    sync()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}


def packed_mask(b: int, vocab: int, frac: float, *, structured: bool, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    words = (vocab + 31) // 32
    if structured:  # whole 256-id ranges allowed or not, as grammars over sorted vocabs produce
        chunks = torch.rand(b, (words + 7) // 8, generator=g) < frac
        allowed = chunks.repeat_interleave(256, dim=1)[:, : words * 32]
    else:
        allowed = torch.rand(b, words * 32, generator=g) < frac
    bits = np.packbits(allowed.numpy().astype(np.uint8), axis=-1, bitorder="little")
    return torch.from_numpy(bits.view(np.int32).reshape(b, words).copy())


class Bench:
    def __init__(self, device: torch.device, repeats: int, peak_gbps: float | None) -> None:
        self.device = device
        self.repeats = repeats
        self.peak = peak_gbps
        self.rows: list[Row] = []

    def run(
        self,
        kernel: str,
        case: str,
        nbytes: float,
        impls: dict[str, Callable[[], object]],
        ref: str,
        *,
        calls: int = 1,
    ) -> None:
        """Time ``impls`` (each makes ``calls`` kernel calls; rows report one call)."""
        times = timed(impls, self.device, self.repeats)
        times = {name: ms / calls for name, ms in times.items()}
        for name, ms in times.items():
            gbps = nbytes / (ms * 1e-3) / 1e9
            frac = gbps / self.peak if self.peak else None
            speed = times[ref] / ms if name != ref else None
            self.rows.append(Row(kernel, case, name, ms, gbps, frac, speed))


def bench_bitmask(bench: Bench, quick: bool) -> None:
    dev = bench.device
    b = 512 if dev.type == "cuda" else 16
    vocab = 128256
    for frac in (0.01, 0.99):
        for structured in (False, True):
            if quick and structured:
                continue
            mask = packed_mask(b, vocab, frac, structured=structured, seed=1).to(dev)
            logits = torch.randn(b, vocab, device=dev)
            nbytes = mask.numel() * 4 + b * vocab * (1 - frac) * 4
            impls: dict[str, Callable[[], object]] = {
                "dispatch": partial(apply_token_bitmask, logits, mask),
                "torch": partial(apply_token_bitmask, logits, mask, impl="torch"),
            }
            ref = "torch"
            if dev.type == "cpu":
                import xgrammar

                impls = {
                    "dispatch": impls["dispatch"],
                    "torch generic": partial(apply_token_bitmask_torch, logits, mask, native=False),
                    "xgrammar": partial(xgrammar.apply_token_bitmask_inplace, logits, mask),
                }
                ref = "xgrammar"
            kind = "256-id ranges" if structured else "random ids"
            case = f"B={b} V={vocab} fp32 {frac:.0%} allowed ({kind})"
            bench.run("apply_token_bitmask", case, nbytes, impls, ref)


def paged_case(
    b: int, ctx: int, hkv: int, d: int, dtype: torch.dtype, dev: torch.device, *, shuffled: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A pool holding b requests of ctx tokens; their slots in allocation order, or shuffled
    (a fragmented pool: the worst case for reading rows)."""
    pool = b * ctx + 1
    k_pool = torch.randn(pool, hkv, d, dtype=dtype, device=dev)
    v_pool = torch.randn(pool, hkv, d, dtype=dtype, device=dev)
    ids = torch.randperm(pool - 1) if shuffled else torch.arange(pool - 1)
    req_to_token = (ids + 1).int().view(b, ctx).to(dev)
    return k_pool, v_pool, req_to_token, torch.arange(b, device=dev)


def bench_decode(bench: Bench, quick: bool) -> None:
    dev = bench.device
    if dev.type == "cuda":
        shapes = [(64, 4096, 32, 8, 128, torch.bfloat16, True)]
    else:  # the second shape: plait-small decoding 32 requests
        ctx = 512 if quick else 1024
        shapes = [
            (8, ctx, 32, 8, 64, torch.float32, True),
            (32, ctx, 8, 4, 64, torch.float32, False),
        ]
    for b, ctx, hq, hkv, d, dtype, shuffled in shapes:
        k_pool, v_pool, r2t, slots = paged_case(b, ctx, hkv, d, dtype, dev, shuffled=shuffled)
        q = torch.randn(b, hq, d, dtype=dtype, device=dev)
        lens = torch.full((b,), ctx, device=dev)
        el = torch.finfo(dtype).bits // 8
        nbytes = 2 * b * ctx * hkv * d * el + b * ctx * 4 + 2 * q.numel() * el
        args = (q, k_pool, v_pool, r2t, slots, lens)
        impls: dict[str, Callable[[], object]] = {
            "dispatch": partial(paged_decode_attention, *args, scale=d**-0.5),
        }
        if dev.type == "cpu":  # dispatch runs the C kernel; compare it with the gathering path
            ref = "torch gather"
            impls[ref] = partial(paged_decode_attention_torch, *args, scale=d**-0.5, native=False)
        else:
            ref = "torch"
            impls[ref] = partial(paged_decode_attention, *args, scale=d**-0.5, impl="torch")
        order = "shuffled" if shuffled else "in order"
        case = f"B={b} ctx={ctx} Hq={hq} Hkv={hkv} D={d} {str(dtype)[6:]}, slots {order}"
        bench.run("paged_decode_attention", case, nbytes, impls, ref)


def bench_extend(bench: Bench, quick: bool) -> None:
    dev = bench.device
    if dev.type == "cuda":
        b, pre, ext, hq, hkv, d, dtype = 8, 1024, 1024, 32, 8, 128, torch.bfloat16
    else:
        b, pre, ext, hq, hkv, d, dtype = 2, 256, 128 if quick else 256, 32, 8, 64, torch.float32
    k_pool, v_pool, r2t, slots = paged_case(b, pre + ext, hkv, d, dtype, dev, shuffled=True)
    q = torch.randn(b * ext, hq, d, dtype=dtype, device=dev)
    prefix = torch.full((b,), pre, device=dev)
    extend = torch.full((b,), ext, device=dev)
    el = torch.finfo(dtype).bits // 8
    nbytes = 2 * b * (pre + ext) * hkv * d * el + 2 * q.numel() * el
    args = (q, k_pool, v_pool, r2t, slots, prefix, extend)
    impls: dict[str, Callable[[], object]] = {
        "dispatch": lambda: extend_attention(*args, scale=d**-0.5),
        "torch": lambda: extend_attention(*args, scale=d**-0.5, impl="torch"),
    }
    case = f"B={b} prefix={pre} extend={ext} Hq={hq} Hkv={hkv} D={d} {str(dtype)[6:]}"
    bench.run("extend_attention", case, nbytes, impls, "torch")


def bench_small(bench: Bench, quick: bool) -> None:
    dev = bench.device
    cuda = dev.type == "cuda"
    t = 4096 if cuda else (128 if quick else 512)
    dtype = torch.bfloat16 if cuda else torch.float32
    el = torch.finfo(dtype).bits // 8
    h = 4096 if cuda else 2048
    x = torch.randn(t, h, dtype=dtype, device=dev)
    res = torch.randn(t, h, dtype=dtype, device=dev)
    w = torch.randn(h, dtype=dtype, device=dev)
    bench.run(
        "rmsnorm",
        f"T={t} H={h} +residual {str(dtype)[6:]}",
        4 * x.numel() * el,
        {
            "dispatch": lambda: rmsnorm(x, w, eps=1e-6, residual=res),
            "torch": lambda: rmsnorm(x, w, eps=1e-6, residual=res, impl="torch"),
        },
        "torch",
    )
    hq, hkv, d = 32, 8, 128
    qkv = torch.randn(t, hq + 2 * hkv, d, dtype=dtype, device=dev)
    q, k, v = qkv[:, :hq], qkv[:, hq : hq + hkv], qkv[:, hq + hkv :]
    pos = torch.randint(0, 8192, (t,), device=dev)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=dev).float() / d))
    ang = torch.arange(8192, device=dev).float()[:, None] * inv
    cache = torch.cat([ang.cos(), ang.sin()], -1)
    bench.run(
        "rope",
        f"T={t} Hq={hq} Hkv={hkv} D={d} fused-qkv views {str(dtype)[6:]}",
        2 * t * (hq + hkv) * d * el + t * d * 4,
        {
            "dispatch": lambda: rope(q, k, pos, cache),
            "torch": lambda: rope(q, k, pos, cache, impl="torch"),
        },
        "torch",
    )
    pool = 4 * t
    k_pool = torch.zeros(pool, hkv, d, dtype=dtype, device=dev)
    v_pool = torch.zeros(pool, hkv, d, dtype=dtype, device=dev)
    slots = torch.randperm(pool, device=dev)[:t]
    bench.run(
        "store_kv",
        f"T={t} Hkv={hkv} D={d} strided k/v {str(dtype)[6:]}",
        4 * t * hkv * d * el,
        {
            "dispatch": lambda: store_kv(k, v, k_pool, v_pool, slots),
            "torch": lambda: store_kv(k, v, k_pool, v_pool, slots, impl="torch"),
        },
        "torch",
    )


def bench_sampling(bench: Bench, quick: bool) -> None:
    dev = bench.device
    b, vocab = (64, 128256) if dev.type == "cuda" else (16, 128256)
    probs = torch.softmax(torch.randn(b, vocab, device=dev) * 4, -1)
    u = torch.rand(b, device=dev)
    settings = [("plain", 0, 1.0), ("top_k=50 top_p=0.9", 50, 0.9), ("top_p=0.9", 0, 0.9)]
    for name, k, p in settings[:2] if quick else settings:
        top_k = torch.full((b,), k, device=dev)
        top_p = torch.full((b,), p, device=dev)
        bench.run(
            "top_k_top_p_sample",
            f"B={b} V={vocab} {name}",
            probs.numel() * 4,
            {
                impl: partial(
                    top_k_top_p_sample, probs, top_k=top_k, top_p=top_p, uniforms=u, impl=mode
                )
                for impl, mode in (("dispatch", "auto"), ("torch", "torch"))
            },
            "torch",
        )


# SmolLM2-135M (the model): per layer, Q4_1 [N, K]; the tied embedding / LM head is Q8_0.
SMOL_LAYER = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
SMOL_HEAD = (49152, 576)
SMOL_LAYERS = 30


def gguf_like(n: int, k: int, bits: int, dev: torch.device) -> QuantWeight:
    """A random weight in GGUF's Q4_1 (bits=4) or Q8_0 (bits=8) form: fp16 d (and m)."""
    d = (torch.rand(n, k // 32) * 0.01 + 1e-3).half().float()
    if bits == 4:
        codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
        m = (-8 * d * (0.5 + torch.rand_like(d))).half().float()
        return QuantWeight.pack(codes=codes, scales=d, mins=m, group=32).to(dev)
    codes = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    return QuantWeight.pack(codes=codes, scales=d, group=32).to(dev)


def int4pack(w: QuantWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's CPU int4 layout for a Q4_1 weight: W = (q - 8) * scale + zero, bf16 scale and
    zero (so not exact for GGUF's fp16 d and m)."""
    codes, d, m = w.unpack()
    assert m is not None
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.int(), 1)
    sz = torch.stack([d, m + 8 * d], dim=-1).transpose(0, 1).contiguous().bfloat16()
    return packed, sz


def bench_quant(bench: Bench, quick: bool) -> None:
    """quant_linear on SmolLM2-135M's shapes against fp32 F.linear (and torch's int4 kernel on
    the CPU). Each case cycles through one weight per layer, as a decode step does, so weights
    come from memory rather than cache (M=512 is compute-bound: two copies). GB/s counts the
    quantized weight bytes. The last rows per thread count are the whole decode step's
    matmuls: 30 layers x (qkv, o, gate_up, down) + the LM head, at M=1."""
    dev = bench.device
    cpu = dev.type == "cpu"
    layers = 4 if quick else SMOL_LAYERS
    shapes = {**SMOL_LAYER, "lm_head": SMOL_HEAD}
    qw = {nm: [gguf_like(n, k, 4, dev) for _ in range(layers)] for nm, (n, k) in SMOL_LAYER.items()}
    qw["lm_head"] = [gguf_like(*SMOL_HEAD, 8, dev)]
    fw = {nm: [w.dequantize() for w in ws] for nm, ws in qw.items()}
    packs = {nm: [int4pack(w) for w in ws] for nm, ws in qw.items() if nm != "lm_head" and cpu}
    saved = torch.get_num_threads()
    for threads in (1, 2) if cpu else (saved,):
        torch.set_num_threads(threads)
        tag = f" threads={threads}" if cpu else ""
        for m in (1, 16) if quick else (1, 16, 512):
            for nm, (n, k) in shapes.items():
                if nm == "lm_head" and m == 512:
                    continue  # a prefill takes logits at its last positions only
                copies = len(qw[nm]) if m <= 16 else min(2, len(qw[nm]))
                x = torch.randn(m, k, device=dev)
                xb = x.bfloat16()
                ws, fs = qw[nm][:copies], fw[nm][:copies]
                impls: dict[str, Callable[[], object]] = {
                    "dispatch": lambda x=x, ws=ws: [quant_linear(x, w) for w in ws],
                    "fp32 F.linear": lambda x=x, fs=fs: [F.linear(x, f) for f in fs],
                }
                if nm in packs:
                    ps = packs[nm][:copies]
                    impls["torch int4pack bf16"] = lambda xb=xb, ps=ps: [
                        torch.ops.aten._weight_int4pack_mm_for_cpu(xb, p, 32, sz) for p, sz in ps
                    ]
                fmt = "Q8_0" if nm == "lm_head" else "Q4_1"
                case = f"{nm} {k}->{n} {fmt} M={m}{tag}"
                bench.run("quant_linear", case, ws[0].nbytes, impls, "fp32 F.linear", calls=copies)
        if not quick:
            bench_quant_model(bench, qw, fw, tag)
    torch.set_num_threads(saved)


def bench_quant_model(
    bench: Bench, qw: dict[str, list[QuantWeight]], fw: dict[str, list[torch.Tensor]], tag: str
) -> None:
    """One decode step's matmuls (M=1), layer by layer in model order."""
    dev = bench.device
    x = {576: torch.randn(1, 576, device=dev), 1536: torch.randn(1, 1536, device=dev)}
    seq = []
    for i in range(SMOL_LAYERS):
        for nm in SMOL_LAYER:
            w, f = qw[nm][i % len(qw[nm])], fw[nm][i % len(qw[nm])]
            seq.append((x[w.k], w, f))
    head = (x[576], qw["lm_head"][0], fw["lm_head"][0])
    nbytes = sum(w.nbytes for _, w, _ in seq) + head[1].nbytes
    impls: dict[str, Callable[[], object]] = {
        "dispatch": lambda: [quant_linear(a, w) for a, w, _ in (*seq, head)],
        "fp32 F.linear": lambda: [F.linear(a, f) for a, _, f in (*seq, head)],
    }
    case = f"SmolLM2-135M decode step: 30 layers + lm_head, M=1{tag}"
    bench.run("quant_linear model", case, nbytes, impls, "fp32 F.linear")


def table(rows: list[Row], cuda: bool) -> str:
    head = "| kernel | case | impl | median ms | GB/s |" + (" % peak |" if cuda else "")
    head += " speedup vs ref |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cells = [r.kernel, r.case, r.impl, f"{r.ms:.3f}", f"{r.gbps:.1f}"]
        if cuda:
            cells.append(f"{100 * r.peak_frac:.1f}%" if r.peak_frac is not None else "")
        cells.append(f"{r.speedup_vs_ref:.2f}x" if r.speedup_vs_ref is not None else "(ref)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run every kernel benchmark, print the table, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats and smaller sizes")
    ap.add_argument("--peak-gbps", type=float, default=4800.0, help="HBM peak (H200: 4800)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--only", default="", help="comma-separated suites, e.g. quant (default: all)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    repeats = args.repeats or (5 if args.quick else 25)
    bench = Bench(device, repeats, args.peak_gbps if cuda else None)
    suites = {
        "bitmask": bench_bitmask,
        "decode": bench_decode,
        "extend": bench_extend,
        "small": bench_small,
        "sampling": bench_sampling,
        "quant": bench_quant,
    }
    for name in args.only.split(",") if args.only else suites:
        suites[name](bench, args.quick)
    name = torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine()
    print(f"device: {device} ({name}), torch {torch.__version__}, threads {args.threads}\n")
    print(table(bench.rows, cuda))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "device": str(device),
        "device_name": name,
        "torch": torch.__version__,
        "threads": args.threads,
        "repeats": repeats,
        "quick": args.quick,
        "peak_gbps": args.peak_gbps if cuda else None,
    }
    payload = {"meta": meta, "rows": [asdict(r) for r in bench.rows]}
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()

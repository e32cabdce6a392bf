"""The C decode step's pieces (csrc/decode_step_cpu.c through plait.kernels._step_native)
against a float64 torch reference written here from the definitions: the four norm places
(pre, sandwich, post), q/k norms per head and over all heads, SiLU and tanh GELU, the attention
soft cap, per-layer windows and RoPE tables, the residual scale and biases. Two layers over a
paged pool holding earlier positions; weights int8 (the reference reads them dequantized)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from plait.kernels._step_native import DecodeStep, StepChoices, StepLayer, step_available
from plait.kernels.native_weight import NativeWeight
from plait.kernels.quant import native_form
from plait.kernels.quant_weight import quantize_weight

pytestmark = pytest.mark.skipif(not step_available(), reason="no C compiler")

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, SLOTS, POSITIONS = 64, 4, 2, 16, 96, 96, 40
SEQ_LENS = [1, 9, 23, 33]  # each token's request length, its own position the last
# Largest |C - reference| measured over these cases: 2.6e-4 on the outputs (RMSNorm'd, of mean
# magnitude 0.8) and 1.9e-4 on the K/V rows written: the matmuls quantize their input to int16
# per group (2^-15 of the group's largest), the reference does not. Stated: about 4x.
OUT_ATOL, KV_ATOL = 1e-3, 1e-3


@dataclasses.dataclass(frozen=True)
class Case:
    """Which pieces one case turns on (the rest as in Llama)."""

    layout: str = "pre"
    activation: str = "silu"
    qk_norm: str | None = None
    softcap: float | None = None
    windows: tuple[int | None, int | None] = (None, None)
    two_ropes: bool = False
    residual_scale: float = 1.0
    biases: bool = False


CASES = {
    "llama": Case(),
    "sandwich_gelu": Case(layout="sandwich", activation="gelu_tanh"),
    "post_full_qk_norm": Case(layout="post", qk_norm="full"),
    "qk_norm_per_head": Case(qk_norm="head"),
    "soft_cap": Case(softcap=0.8),
    "windows_and_ropes": Case(windows=(5, None), two_ropes=True),
    "residual_scale_and_biases": Case(residual_scale=0.3, biases=True),
    "gemma3": Case(
        layout="sandwich",
        activation="gelu_tanh",
        qk_norm="head",
        windows=(6, None),
        two_ropes=True,
    ),  # fmt: skip
    "gemma2": Case(layout="sandwich", activation="gelu_tanh", softcap=0.8, windows=(4, None)),
}
# the norms each layout has, by place: before attention, on its output, before the MLP, on its
PLACES = {"pre": (1, 0, 1, 0), "sandwich": (1, 1, 1, 1), "post": (0, 1, 0, 1)}


def rope_table(theta: float) -> torch.Tensor:
    inv = 1.0 / theta ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
    freqs = torch.outer(torch.arange(POSITIONS, dtype=torch.float64), inv)
    return torch.cat([freqs.cos(), freqs.sin()], -1).float()


def make_layer(case: Case, gen: torch.Generator, layer: int) -> dict[str, Any]:
    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    def norm(n: int) -> torch.Tensor:
        return 1.0 + rand(n, scale=0.2)

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    shapes = {"qkv": (q + 2 * kv, HIDDEN), "o": (HIDDEN, q), "gate_up": (2 * INTER, HIDDEN)}
    shapes["down"] = (HIDDEN, INTER)
    weights = {
        n: native_form(quantize_weight(rand(*s, scale=s[1] ** -0.5), bits=8))
        for n, s in shapes.items()
    }
    places = PLACES[case.layout]
    norms = [norm(HIDDEN) if there else None for there in places]
    whole = case.qk_norm == "full"
    qk = (norm(q if whole else HEAD_DIM), norm(kv if whole else HEAD_DIM)) if case.qk_norm else ()
    return {
        **weights,
        "biases": tuple(rand(s[0], scale=0.1) if case.biases else None for s in shapes.values()),
        "norms": norms,
        "qk": qk,
        "cos_sin": rope_table(1e4 if case.two_ropes and layer == 0 else 1e6),
        "window": case.windows[layer],
    }


class Pool:
    """The KV pool and table: request i on row i, its earlier positions filled at random
    slots, its new token's slot free."""

    def __init__(self, gen: torch.Generator) -> None:
        self.k = [torch.randn(SLOTS, KV_HEADS, HEAD_DIM, generator=gen) for _ in range(2)]
        self.v = [torch.randn(SLOTS, KV_HEADS, HEAD_DIM, generator=gen) for _ in range(2)]
        self.table = torch.zeros(len(SEQ_LENS), POSITIONS, dtype=torch.int32)
        order = torch.randperm(SLOTS, generator=gen)
        used = 0
        for i, n in enumerate(SEQ_LENS):
            self.table[i, :n] = order[used : used + n].int()
            used += n
        self.slots = torch.tensor([int(self.table[i, n - 1]) for i, n in enumerate(SEQ_LENS)])


def rms(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    if w is None:
        return x
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def rotate(x: torch.Tensor, cs: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of x [T, heads, d] with rows cs [T, d] (cos then sin)."""
    half = HEAD_DIM // 2
    cos, sin = cs[:, None, :half].double(), cs[:, None, half:].double()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def linear(x: torch.Tensor, w: NativeWeight, bias: torch.Tensor | None) -> torch.Tensor:
    out = x @ w.dequantize().double().T
    return out if bias is None else out + bias.double()


def attend(
    case: Case, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], pool: Pool, window: Any
) -> torch.Tensor:
    """q [T, heads, d] over each request's positions (the window's last) in k/v [S, kv, d]."""
    k, v = kv
    outs = []
    for t, n in enumerate(SEQ_LENS):
        first = max(0, n - window) if window else 0
        slots = pool.table[t, first:n].long()
        keys = k[slots].repeat_interleave(HEADS // KV_HEADS, 1)  # [span, heads, d]
        vals = v[slots].repeat_interleave(HEADS // KV_HEADS, 1)
        scores = torch.einsum("hd,nhd->hn", q[t], keys) * HEAD_DIM**-0.5
        if case.softcap is not None:
            scores = case.softcap * torch.tanh(scores / case.softcap)
        outs.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), vals).reshape(-1))
    return torch.stack(outs)


def reference(
    case: Case, layers: list[dict[str, Any]], pool: Pool, embed: torch.Tensor, final: torch.Tensor
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The step in float64: the final-normed outputs [T, hidden] and each layer's K/V pool."""
    eps, s = 1e-6, case.residual_scale
    r = embed.double()
    positions = torch.tensor(SEQ_LENS) - 1
    pools = []
    for layer in layers:
        in_norm, attn_out, mlp_norm, mlp_out = layer["norms"]
        qkv = linear(rms(r, in_norm, eps), layer["qkv"], layer["biases"][0])
        q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
        if case.qk_norm == "full":
            q, k = rms(q, layer["qk"][0], eps), rms(k, layer["qk"][1], eps)
        q, k, v = (x.reshape(len(SEQ_LENS), -1, HEAD_DIM) for x in (q, k, v))
        if case.qk_norm == "head":
            q, k = rms(q, layer["qk"][0], eps), rms(k, layer["qk"][1], eps)
        cs = layer["cos_sin"][positions]
        kp, vp = layer["k_pool"].double().clone(), layer["v_pool"].double().clone()
        kp[pool.slots], vp[pool.slots] = rotate(k, cs), v
        pools.append((kp, vp))
        attn = attend(case, rotate(q, cs), (kp, vp), pool, layer["window"])
        a = linear(attn, layer["o"], layer["biases"][1])
        r = r + s * rms(a, attn_out, eps)
        gate, up = linear(rms(r, mlp_norm, eps), layer["gate_up"], layer["biases"][2]).chunk(2, -1)
        act = F.silu(gate) if case.activation == "silu" else F.gelu(gate, approximate="tanh")
        r = r + s * rms(linear(act * up, layer["down"], layer["biases"][3]), mlp_out, eps)
    return rms(r, final, eps), pools


@dataclasses.dataclass
class Built:
    step: DecodeStep
    steps: list[StepLayer]  # what the step was given
    layers: list[dict[str, Any]]  # what the reference reads
    pool: Pool
    final: torch.Tensor


def build(case: Case, seed: int) -> Built:
    gen = torch.Generator().manual_seed(seed)
    pool = Pool(gen)
    layers = [make_layer(case, gen, i) for i in range(2)]
    steps = []
    for i, layer in enumerate(layers):
        layer["k_pool"], layer["v_pool"] = pool.k[i].clone(), pool.v[i].clone()
        places = ("in_norm", "attn_out_norm", "mlp_norm", "mlp_out_norm")
        norms = dict(zip(places, layer["norms"], strict=True))
        steps.append(
            StepLayer(
                qkv=layer["qkv"],
                o=layer["o"],
                gate_up=layer["gate_up"],
                down=layer["down"],
                biases=layer["biases"],
                **norms,
                q_norm=layer["qk"][0] if layer["qk"] else None,
                k_norm=layer["qk"][1] if layer["qk"] else None,
                cos_sin=layer["cos_sin"],
                window=layer["window"],
                k_pool=pool.k[i],
                v_pool=pool.v[i],
            )  # fmt: skip
        )
    final = 1.0 + torch.randn(HIDDEN, generator=gen) * 0.2
    choices = StepChoices(
        heads=HEADS, eps=1e-6, scale=HEAD_DIM**-0.5, softcap=case.softcap,
        activation=case.activation, qk_norm=case.qk_norm, residual_scale=case.residual_scale,
    )  # fmt: skip
    return Built(DecodeStep(steps, final_norm=final, choices=choices), steps, layers, pool, final)


def run(step: DecodeStep, pool: Pool, embed: torch.Tensor, threads: int = 1) -> torch.Tensor:
    seq = torch.tensor(SEQ_LENS)
    return step.run(
        embed, positions=seq - 1, out_slots=pool.slots, rows=torch.arange(len(SEQ_LENS)),
        seq_lens=seq, req_to_token=pool.table, logit_indices=torch.arange(len(SEQ_LENS)),
        threads=threads,
    ).clone()  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_step_matches_the_reference(name: str) -> None:
    case = CASES[name]
    built = build(case, seed=len(name))
    pool = built.pool
    embed = torch.randn(len(SEQ_LENS), HIDDEN, generator=torch.Generator().manual_seed(9))
    want, pools = reference(case, built.layers, pool, embed, built.final)
    got = run(built.step, pool, embed)
    torch.testing.assert_close(got.double(), want, atol=OUT_ATOL, rtol=0)
    for i, (kp, vp) in enumerate(pools):
        torch.testing.assert_close(pool.k[i].double(), kp, atol=KV_ATOL, rtol=0)
        torch.testing.assert_close(pool.v[i].double(), vp, atol=KV_ATOL, rtol=0)
    assert torch.equal(run(built.step, pool, embed, threads=3), got)  # threads change nothing


def test_choices_and_tensors_are_checked() -> None:
    built = build(CASES["qk_norm_per_head"], seed=1)
    steps, final, choices = built.steps, built.final, built.step.choices
    with pytest.raises(ValueError, match="activation"):
        StepChoices(heads=HEADS, eps=1e-6, scale=1.0, activation="relu")
    with pytest.raises(ValueError, match="softcap"):
        StepChoices(heads=HEADS, eps=1e-6, scale=1.0, softcap=0.0)
    whole = [dataclasses.replace(s, q_norm=torch.ones(HEADS * HEAD_DIM)) for s in steps]
    with pytest.raises(ValueError, match="q_norm must be"):  # a whole-q norm given per head
        DecodeStep(whole, final_norm=final, choices=choices)
    with pytest.raises(ValueError, match="q_norm and k_norm"):
        DecodeStep(steps, final_norm=final, choices=dataclasses.replace(choices, qk_norm=None))
    short = dataclasses.replace(steps[1], cos_sin=steps[1].cos_sin[:10])
    with pytest.raises(ValueError, match="cos_sin"):  # every layer's table as long as the first
        DecodeStep([steps[0], short], final_norm=final, choices=choices)

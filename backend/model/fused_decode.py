"""The fused CPU decode step: every decoder layer of a decode-only batch in one C call.

`FusedDecode.build(model, pool)` describes a loaded model and its KV pool to the C step
(`plait.kernels._step_native.DecodeStep`) once; `ModelRunner.run` then takes it for every batch
it `applies` to (every token a decode query, the same pool) and the model's layers otherwise
(prefills, mixed batches). It applies to CPU models with fp32 activations and pool whose linear
layers are all quantized (`QuantLinear`); the embedding (with its scale) and the LM head (with
the logit scale and soft cap) stay the model's. `EngineConfig.fused_decode=False` turns it off.

What the C step does not compute is stated once (`uncovered`): today only mixture-of-experts
layers; it takes every dense family's layers (`StepChoices` and `StepLayer` carry the norm
layout, the activation, q/k norms, each layer's window and RoPE table, the attention scale and
soft cap, the residual scale, biases). A model that needs anything else runs layer by layer,
and the runner reports which feature (`ModelRunner.fused_decode`), never skipping one silently.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from plait.backend.cache.kv_pool import TokenToKVPool
from plait.backend.model.config import ModelConfig
from plait.backend.model.forward_batch import ForwardBatch
from plait.backend.model.layers import MLP, CausalLM, DecoderLayer
from plait.backend.model.quantized import QuantLinear
from plait.backend.parallel.comm import TPComm
from plait.kernels._step_native import DecodeStep, StepChoices, StepLayer, step_available
from plait.kernels.native_weight import NativeWeight


class FusedDecode:
    """A model's decoder layers as one C call for decode-only batches over one KV pool."""

    def __init__(self, step: DecodeStep, pool: TokenToKVPool) -> None:
        self.step = step
        self.pool = pool

    @classmethod
    def build(
        cls, model: CausalLM, pool: TokenToKVPool, *, comm: TPComm | None = None
    ) -> FusedDecode | str:
        """The fused step for `model` over `pool`, or why it cannot run (a sentence). With
        `comm` (tensor parallelism) the model is one rank's slice and the step all-reduces
        each layer's attention and MLP outputs through it."""
        reason = _unsupported(model, pool)
        if reason:
            return reason
        cfg = model.cfg
        choices = StepChoices(
            heads=cfg.num_heads,
            eps=cfg.rms_norm_eps,
            scale=cfg.scale,
            softcap=cfg.attn_softcap,
            activation=cfg.activation,
            qk_norm=cfg.qk_norm,
            residual_scale=cfg.residual_scale,
        )
        layers = [_step_layer(model, layer, pool) for layer in _layers(model)]
        step = DecodeStep(
            layers,
            final_norm=model.norm.weight,
            choices=choices,
            reduce=None if comm is None else comm.reduce_callback(lambda: step.reduce_buffer()),
        )
        return cls(step, pool)

    def applies(self, batch: ForwardBatch, pool: TokenToKVPool) -> bool:
        """Whether this batch takes the fused step: every token a decode query, this pool
        (and, with the portable C matmul, a small batch)."""
        most = self.step.max_tokens
        tokens = batch.num_tokens
        fits = tokens > 0 and (most is None or tokens <= most)
        return batch.num_extend_reqs == 0 and fits and pool is self.pool

    def __call__(self, hidden: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """The final-normed hidden states of the tokens `batch.logit_indices` [N, hidden]
        from the embeddings `hidden` [T, hidden] (a view of scratch memory: use it before
        the next step)."""
        return self.step.run(
            hidden,
            positions=batch.positions,
            out_slots=batch.out_slots,
            rows=batch.decode_rows,
            seq_lens=batch.decode_seq_lens,
            req_to_token=batch.req_to_token,
            logit_indices=batch.logit_indices,
        )


def _step_layer(model: CausalLM, layer: DecoderLayer, pool: TokenToKVPool) -> StepLayer:
    """A layer of `model` as the C step reads it: its projections, norms by place, q/k norms,
    RoPE table and window, and its part of the pool."""
    linears = _linears(layer)
    attn = layer.self_attn
    i = attn.layer
    in_norm, attn_out_norm, mlp_norm, mlp_out_norm = (
        None if n is None else n.weight for n in layer.placed_norms()
    )
    qk_norms = (attn.q_norm.weight, attn.k_norm.weight) if model.cfg.qk_norm else (None, None)
    return StepLayer(
        qkv=cast(NativeWeight, linears[0].qweight),
        o=cast(NativeWeight, linears[1].qweight),
        gate_up=cast(NativeWeight, linears[2].qweight),
        down=cast(NativeWeight, linears[3].qweight),
        biases=tuple(m.bias for m in linears),
        in_norm=in_norm,
        attn_out_norm=attn_out_norm,
        mlp_norm=mlp_norm,
        mlp_out_norm=mlp_out_norm,
        q_norm=qk_norms[0],
        k_norm=qk_norms[1],
        cos_sin=model.rope_tables[attn.rope_index],
        window=attn.window,
        k_pool=pool.k[i],
        v_pool=pool.v[i],
    )


def _layers(model: CausalLM) -> list[DecoderLayer]:
    return [cast(DecoderLayer, layer) for layer in model.layers]


def _linears(layer: DecoderLayer) -> list[QuantLinear]:
    """The layer's qkv, o, gate_up and down projections (quantized: checked before)."""
    return [cast(QuantLinear, _unwrap(m)) for m in _projections(layer)]


def _native(module: nn.Module) -> bool:
    return isinstance(module, QuantLinear) and isinstance(module.qweight, NativeWeight)


def _projections(layer: DecoderLayer) -> tuple[nn.Module, ...]:
    """qkv, o, gate_up and down (a dense MLP: experts are refused by `uncovered` first)."""
    attn, mlp = layer.self_attn, cast(MLP, layer.mlp)
    return attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj


def _unwrap(module: nn.Module) -> nn.Module:
    """The projection inside a tensor-parallel wrapper (`RowParallel.inner`), else itself."""
    inner = getattr(module, "inner", None)
    return inner if isinstance(inner, nn.Module) else module


def _unsupported(model: CausalLM, pool: TokenToKVPool) -> str | None:
    """Why the fused step cannot serve `model` over `pool`, or None when it can."""
    missing = uncovered(model.cfg)
    if missing:
        return f"the C step does not cover {', '.join(missing)}"
    if not step_available():
        return "the C kernels cannot be built here"
    if pool.device.type != "cpu" or pool.k.dtype != torch.float32:
        return "it runs on the CPU with an fp32 KV pool"
    if not all(p.dtype == torch.float32 and p.is_cpu for p in model.parameters()):
        return "it needs fp32 parameters on the CPU"
    for layer in _layers(model):
        if not all(_native(_unwrap(m)) for m in _projections(layer)):
            return "every linear layer of the decoder must be quantized in the native CPU layout"
    return None


def uncovered(cfg: ModelConfig) -> list[str]:
    """The features of `cfg`'s family the C decode step does not compute (empty: it covers
    the model). It computes every dense layer plait has (any norm layout, SiLU or tanh GELU,
    q/k norms per head or whole, windows and RoPE tables per layer, the attention scale and
    soft cap, scaled residual branches, biases); experts are left to the layers."""
    checks = {"mixture-of-experts layers": cfg.num_experts > 0}
    return [feature for feature, missing in checks.items() if missing]

"""The fused CPU decode step: every decoder layer of a decode-only batch in one C call.

`FusedDecode.build(model, pool)` describes a loaded model and its KV pool to the C step
(`plait.kernels._step_native.DecodeStep`) once; `ModelRunner.run` then takes it for every batch
it `applies` to (every token a decode query, the same pool) and the model's layers otherwise
(prefills, mixed batches). It applies to CPU models with fp32 activations and pool whose linear
layers are all quantized (`QuantLinear`); the embedding (with its scale) and the LM head (with
the logit scale and soft cap) stay the model's. `EngineConfig.fused_decode=False` turns it off.

What the C step computes is stated once (`uncovered`): norms before attention and the MLP, SiLU,
no q/k norms, one window and one RoPE table for every layer, no attention soft cap and
unscaled residual branches. A model that needs anything else runs layer by layer, and the
runner reports which feature (`ModelRunner.fused_decode`), never skipping one silently.
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
from plait.kernels._step_native import DecodeStep, StepLayer, step_available
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
        layers = []
        for i, layer in enumerate(_layers(model)):
            qkv, o, gate_up, down = linears = _linears(layer)
            layers.append(
                StepLayer(
                    qkv=cast(NativeWeight, qkv.qweight),
                    o=cast(NativeWeight, o.qweight),
                    gate_up=cast(NativeWeight, gate_up.qweight),
                    down=cast(NativeWeight, down.qweight),
                    biases=tuple(m.bias for m in linears),
                    input_norm=layer.norm("input_layernorm").weight,
                    post_norm=layer.norm("post_attention_layernorm").weight,
                    k_pool=pool.k[i],
                    v_pool=pool.v[i],
                )
            )
        step = DecodeStep(
            layers,
            final_norm=model.norm.weight,
            cos_sin=model.rope_tables[0],
            heads=cfg.num_heads,
            eps=cfg.rms_norm_eps,
            scale=cfg.scale,
            window=cfg.window(0),
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
    the model)."""
    windows = {cfg.window(i) for i in range(cfg.num_layers)}
    checks = {
        f"{cfg.norm_layout} norms": cfg.norm_layout != "pre",
        f"the {cfg.activation} activation": cfg.activation != "silu",
        "q/k norms": cfg.qk_norm is not None,
        "per-layer attention windows": len(windows) > 1,
        "per-layer RoPE": len(cfg.ropes()) > 1,
        "an attention soft cap": cfg.attn_softcap is not None,
        "scaled residual branches": cfg.residual_scale != 1.0,
        "mixture-of-experts layers": cfg.num_experts > 0,
    }
    return [feature for feature, missing in checks.items() if missing]

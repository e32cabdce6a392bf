"""The fused CPU decode step: every decoder layer of a decode-only batch in one C call.

`FusedDecode.build(model, pool)` describes a loaded model and its KV pool to the C step
(`plait.kernels._step_native.DecodeStep`) once; `LlamaForCausalLM.forward` then takes it for
every batch it `applies` to (every token a decode query, the same pool) and the layer-by-layer
path otherwise (prefills, mixed batches). It applies to CPU models with fp32 activations and
pool whose linear layers are all quantized (`QuantLinear`); the embedding and the LM head stay
modules of the model. `EngineConfig.fused_decode=False` turns it off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from plait.backend.forward_batch import ForwardBatch
from plait.backend.kv_pool import TokenToKVPool
from plait.backend.model import DecoderLayer, LlamaForCausalLM
from plait.backend.quantized import QuantLinear
from plait.kernels._step_native import DecodeStep, StepLayer, step_available

if TYPE_CHECKING:
    from plait.backend.parallel.comm import TPComm


class FusedDecode:
    """A model's decoder layers as one C call for decode-only batches over one KV pool."""

    def __init__(self, step: DecodeStep, pool: TokenToKVPool) -> None:
        self.step = step
        self.pool = pool

    @classmethod
    def build(
        cls, model: LlamaForCausalLM, pool: TokenToKVPool, *, comm: TPComm | None = None
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
                    qkv=qkv.qweight,
                    o=o.qweight,
                    gate_up=gate_up.qweight,
                    down=down.qweight,
                    biases=tuple(m.bias for m in linears),
                    input_norm=layer.input_layernorm.weight,
                    post_norm=layer.post_attention_layernorm.weight,
                    k_pool=pool.k[i],
                    v_pool=pool.v[i],
                )
            )
        step = DecodeStep(
            layers,
            final_norm=model.norm.weight,
            cos_sin=cast(torch.Tensor, model.cos_sin),
            heads=cfg.num_heads,
            eps=cfg.rms_norm_eps,
            scale=cfg.head_dim**-0.5,
            window=cfg.sliding_window,
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


def _layers(model: LlamaForCausalLM) -> list[DecoderLayer]:
    return [cast(DecoderLayer, layer) for layer in model.layers]


def _linears(layer: DecoderLayer) -> list[QuantLinear]:
    """The layer's qkv, o, gate_up and down projections (quantized: checked before)."""
    attn, mlp = layer.self_attn, layer.mlp
    mods = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    return [cast(QuantLinear, _unwrap(m)) for m in mods]


def _unwrap(module: nn.Module) -> nn.Module:
    """The projection inside a tensor-parallel wrapper (`RowParallel.inner`), else itself."""
    inner = getattr(module, "inner", None)
    return inner if isinstance(inner, nn.Module) else module


def _unsupported(model: LlamaForCausalLM, pool: TokenToKVPool) -> str | None:
    """Why the fused step cannot serve `model` over `pool`, or None when it can."""
    if not step_available():
        return "the C kernels cannot be built here"
    if pool.device.type != "cpu" or pool.k.dtype != torch.float32:
        return "it runs on the CPU with an fp32 KV pool"
    if not all(p.dtype == torch.float32 and p.is_cpu for p in model.parameters()):
        return "it needs fp32 parameters on the CPU"
    for layer in _layers(model):
        attn, mlp = layer.self_attn, layer.mlp
        mods = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        if not all(isinstance(_unwrap(m), QuantLinear) for m in mods):
            return "every linear layer of the decoder must be quantized"
    return None

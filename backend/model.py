"""plait's own Llama-family model (Llama 2/3, Qwen2/2.5, Mistral) over the paged KV pool.

Weights use the merged layout: `qkv_proj` stacks q, k and v; `gate_up_proj` stacks gate and
up. The loader (loader.py) fills them from Hugging Face safetensors. Attention reads and writes
K/V through `plait.kernels`, which run Triton on CUDA tensors and vectorized torch on CPU. A
decode-only batch on the CPU takes the fused C step instead when one is attached
(`fused_decode`, decode_step.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from plait.backend.forward_batch import ForwardBatch
from plait.backend.kv_pool import TokenToKVPool
from plait.backend.model_config import ModelConfig
from plait.kernels import extend_attention, paged_decode_attention, rmsnorm, rope, store_kv

if TYPE_CHECKING:
    from plait.backend.decode_step import FusedDecode


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (normed, new residual); with no residual, x itself is the residual."""
        if residual is None:
            out = rmsnorm(x, self.weight, eps=self.eps)
            assert isinstance(out, torch.Tensor)
            return out, x
        pair = rmsnorm(x, self.weight, eps=self.eps, residual=residual)
        assert isinstance(pair, tuple)
        return pair


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.cfg, self.layer = cfg, layer
        qkv = cfg.q_size + 2 * cfg.kv_size
        self.qkv_proj: nn.Module = nn.Linear(cfg.hidden_size, qkv, bias=cfg.qkv_bias)
        self.o_proj: nn.Module = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        self.scale = cfg.head_dim**-0.5

    def forward(
        self, x: torch.Tensor, batch: ForwardBatch, pool: TokenToKVPool, cos_sin: torch.Tensor
    ) -> torch.Tensor:
        cfg = self.cfg
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.reshape(-1, cfg.num_heads, cfg.head_dim)
        k = k.reshape(-1, cfg.num_kv_heads, cfg.head_dim)
        v = v.reshape(-1, cfg.num_kv_heads, cfg.head_dim)
        q, k = rope(q, k, batch.positions, cos_sin)
        k_pool, v_pool = pool.k[self.layer], pool.v[self.layer]
        store_kv(k, v, k_pool, v_pool, batch.out_slots)
        out = self._attend(q, batch, k_pool, v_pool)
        return self.o_proj(out.reshape(-1, cfg.q_size))

    def _attend(
        self, q: torch.Tensor, batch: ForwardBatch, k_pool: torch.Tensor, v_pool: torch.Tensor
    ) -> torch.Tensor:
        table = batch.req_to_token
        ne, nt = batch.num_extend_reqs, batch.num_extend_tokens
        window = self.cfg.sliding_window
        parts = []
        if ne:
            parts.append(
                extend_attention(
                    q[:nt],
                    k_pool,
                    v_pool,
                    table,
                    batch.req_rows[:ne],
                    batch.prefix_lens[:ne],
                    batch.extend_lens[:ne],
                    scale=self.scale,
                    sliding_window=window,
                )
            )
        if nt < q.shape[0]:
            parts.append(
                paged_decode_attention(
                    q[nt:],
                    k_pool,
                    v_pool,
                    table,
                    batch.decode_rows,
                    batch.decode_seq_lens,
                    scale=self.scale,
                    sliding_window=window,
                    shared_prefix_len=batch.decode_shared_prefix,
                )
            )
        return parts[0] if len(parts) == 1 else torch.cat(parts)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.gate_up_proj: nn.Module = gate_up
        self.down_proj: nn.Module = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        batch: ForwardBatch,
        pool: TokenToKVPool,
        cos_sin: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.input_layernorm(h, residual)
        h = self.self_attn(x, batch, pool, cos_sin)
        x, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(x), residual


class LlamaForCausalLM(nn.Module):
    """Decoder-only transformer; `forward` returns logits for `batch.logit_indices` only.

    `fused_decode` (set by the model runner, None by default) runs a decode-only batch's
    layers in one C call; every other batch goes layer by layer."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens: nn.Module = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head: nn.Module = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.requires_grad_(False)
        self.register_buffer("cos_sin", cfg.cos_sin_cache(), persistent=False)
        self.fused_decode: FusedDecode | None = None

    def forward(self, batch: ForwardBatch, pool: TokenToKVPool) -> torch.Tensor:
        """Run all layers over the batch's tokens; returns float32 logits [N, vocab]."""
        h = self.embed_tokens(batch.input_ids)
        fused = self.fused_decode
        if fused is not None and fused.applies(batch, pool):
            h = fused(h, batch)  # only the rows of logit_indices
        else:
            h = self.decoder(h, batch, pool)[batch.logit_indices]
        return self.lm_head(h).float()

    def decoder(self, h: torch.Tensor, batch: ForwardBatch, pool: TokenToKVPool) -> torch.Tensor:
        """The layers and the final norm, layer by layer: hidden states [T, hidden]."""
        residual: torch.Tensor | None = None
        cos_sin: torch.Tensor = self.cos_sin  # type: ignore[assignment]
        for layer in self.layers:
            h, residual = layer(h, residual, batch, pool, cos_sin)
        h, _ = self.norm(h, residual)
        return h


def empty_model(
    cfg: ModelConfig,
    *,
    dtype: torch.dtype,
    device: torch.device,
    modules: Mapping[str, nn.Module] | None = None,
) -> LlamaForCausalLM:
    """The model with uninitialized weights on `device` (no random init: a loader fills
    every parameter); `modules` (by name, e.g. quantized layers holding their own weights)
    replace the model's own before anything is allocated; tied embeddings shared (an LM
    head tied to a replaced embedding is the loader's to set), the RoPE table computed."""
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(cfg)
    for name, module in (modules or {}).items():
        skeleton.set_submodule(name, module)
    model = skeleton.to_empty(device=device).to(dtype)
    tied = isinstance(model.lm_head, nn.Linear) and isinstance(model.embed_tokens, nn.Embedding)
    if cfg.tie_word_embeddings and tied:
        model.lm_head.weight = model.embed_tokens.weight
    model.cos_sin = cfg.cos_sin_cache().to(device=device, dtype=torch.float32)
    return model

"""The decoder every family shares, over the paged KV pool; the family's choices come from its
`ModelConfig` (config.py).

Weights use the merged layout of weights.py: `qkv_proj` stacks q, k and v; `gate_up_proj`
stacks gate and up. Attention reads and writes K/V through `plait.kernels`, which run Triton on
CUDA tensors and vectorized torch on CPU. The model runner sends a decode-only batch on the CPU
through the fused C step instead (fused_decode.py) when that step covers the model.

A layer's norms sit where the family puts them (`norm_layout`): `pre` (Llama: before attention
and before the MLP), `sandwich` (Gemma 2/3: also on each branch's output), `post` (OLMo 2:
only on each branch's output). The residual stream is carried beside the branch output so the
next norm adds and normalizes in one kernel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from plait.backend.cache.kv_pool import TokenToKVPool
from plait.backend.model.config import ModelConfig
from plait.backend.model.forward_batch import ForwardBatch
from plait.kernels import extend_attention, paged_decode_attention, rmsnorm, rope, store_kv


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
            return self.plain(x), x
        pair = rmsnorm(x, self.weight, eps=self.eps, residual=residual)
        assert isinstance(pair, tuple)
        return pair

    def plain(self, x: torch.Tensor) -> torch.Tensor:
        """The norm of x [T, size] alone (no residual)."""
        out = rmsnorm(x, self.weight, eps=self.eps)
        assert isinstance(out, torch.Tensor)
        return out


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.cfg, self.layer = cfg, layer
        qkv = cfg.q_size + 2 * cfg.kv_size
        self.qkv_proj: nn.Module = nn.Linear(cfg.hidden_size, qkv, bias=cfg.qkv_bias)
        self.o_proj: nn.Module = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        if cfg.qk_norm is not None:
            head = cfg.qk_norm == "head"
            self.q_norm = RMSNorm(cfg.head_dim if head else cfg.q_size, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim if head else cfg.kv_size, cfg.rms_norm_eps)
        self.window = cfg.window(layer)
        self.rope_index = cfg.rope_index(layer)

    def forward(
        self,
        x: torch.Tensor,
        batch: ForwardBatch,
        pool: TokenToKVPool,
        tables: Sequence[torch.Tensor],
    ) -> torch.Tensor:
        cfg = self.cfg
        q, k, v = self.qkv_proj(x).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q, k = self._normed(q, k)
        q = q.reshape(-1, cfg.num_heads, cfg.head_dim)
        k = k.reshape(-1, cfg.num_kv_heads, cfg.head_dim)
        v = v.reshape(-1, cfg.num_kv_heads, cfg.head_dim)
        q, k = rope(q, k, batch.positions, tables[self.rope_index])
        k_pool, v_pool = pool.k[self.layer], pool.v[self.layer]
        store_kv(k, v, k_pool, v_pool, batch.out_slots)
        out = self._attend(q, batch, k_pool, v_pool)
        return self.o_proj(out.reshape(-1, cfg.q_size))

    def _normed(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k through the family's q/k norms (per head, or over all heads)."""
        if self.cfg.qk_norm is None:
            return q, k
        d = self.cfg.head_dim if self.cfg.qk_norm == "head" else None
        qn = self.q_norm.plain(q.reshape(-1, d or q.shape[-1]).contiguous())
        kn = self.k_norm.plain(k.reshape(-1, d or k.shape[-1]).contiguous())
        return qn.reshape(q.shape), kn.reshape(k.shape)

    def _attend(
        self, q: torch.Tensor, batch: ForwardBatch, k_pool: torch.Tensor, v_pool: torch.Tensor
    ) -> torch.Tensor:
        table = batch.req_to_token
        ne, nt = batch.num_extend_reqs, batch.num_extend_tokens
        scale, window = self.cfg.scale, self.window
        parts = []
        if ne:
            parts.append(
                extend_attention(
                    q[:nt], k_pool, v_pool, table,
                    batch.req_rows[:ne], batch.prefix_lens[:ne], batch.extend_lens[:ne],
                    scale=scale, sliding_window=window, softcap=self.cfg.attn_softcap,
                )
            )  # fmt: skip
        if nt < q.shape[0]:
            parts.append(
                paged_decode_attention(
                    q[nt:], k_pool, v_pool, table, batch.decode_rows, batch.decode_seq_lens,
                    scale=scale, sliding_window=window, softcap=self.cfg.attn_softcap,
                    shared_prefix_len=batch.decode_shared_prefix,
                )
            )  # fmt: skip
        return parts[0] if len(parts) == 1 else torch.cat(parts)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, *, intermediate: int | None = None) -> None:
        super().__init__()
        inter = intermediate or cfg.intermediate_size
        self.gate_up_proj: nn.Module = nn.Linear(cfg.hidden_size, 2 * inter, bias=False)
        self.down_proj: nn.Module = nn.Linear(inter, cfg.hidden_size, bias=False)
        self.activation = cfg.activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # views of a fresh output
        if self.activation == "silu":  # in place: a long prompt's [T, inter] allocated once
            act = F.silu(gate, inplace=True)
        else:
            act = F.gelu(gate, approximate="tanh")
        out: torch.Tensor = self.down_proj(act.mul_(up))
        return out


class MoE(nn.Module):
    """A mixture of experts in place of the MLP (Qwen3-MoE, Mixtral): a router (`gate`)
    scores the experts per token, the `experts_per_token` best run (their softmax weights
    renormalized to sum 1 where the family says so) and their outputs add up, weighted, in
    expert order as transformers adds them."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate: nn.Module = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        inter = cfg.moe_intermediate_size
        self.experts = nn.ModuleList(MLP(cfg, intermediate=inter) for _ in range(cfg.num_experts))
        self.top_k, self.renormalize = cfg.experts_per_token, cfg.norm_topk_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        out = torch.zeros_like(x)
        for expert in torch.unique(chosen).tolist():
            rows, slot = torch.where(chosen == expert)
            part = self.experts[expert](x[rows]) * weights[rows, slot, None]
            out.index_add_(0, rows, part)
        return out


# A layer's norms by layout, by where each sits: (before attention, on attention's output,
# before the MLP, on the MLP's output); None: no norm there (the branch reads the residual
# stream itself, or its output joins it as it is).
NORM_PLACES: Mapping[str, tuple[str | None, str | None, str | None, str | None]] = {
    "pre": ("input_layernorm", None, "post_attention_layernorm", None),
    "sandwich": (
        "input_layernorm",
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
    ),
    "post": (None, "post_attention_layernorm", None, "post_feedforward_layernorm"),
}


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layout = cfg.norm_layout
        self.scale = cfg.residual_scale
        for name in NORM_PLACES[cfg.norm_layout]:
            if name is not None:
                self.add_module(name, RMSNorm(cfg.hidden_size, cfg.rms_norm_eps))
        self.self_attn = Attention(cfg, layer)
        self.mlp: nn.Module = MoE(cfg) if cfg.is_moe(layer) else MLP(cfg)

    def norm(self, name: str) -> RMSNorm:
        module = self.get_submodule(name)
        assert isinstance(module, RMSNorm)
        return module

    def placed_norms(self) -> tuple[RMSNorm | None, ...]:
        """The layer's norms by where they sit (`NORM_PLACES`): before attention, on its
        output, before the MLP, on its output (None where the layout has none)."""
        return tuple(None if n is None else self.norm(n) for n in NORM_PLACES[self.layout])

    def forward(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        batch: ForwardBatch,
        pool: TokenToKVPool,
        tables: Sequence[torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's MLP output, the residual stream before it is added): `h` is the
        previous layer's MLP output (or the embeddings) and `residual` the stream before it."""
        if self.layout == "post":
            r = h if residual is None else h + residual
            a = self.norm("post_attention_layernorm").plain(self.self_attn(r, batch, pool, tables))
            r = r + self._scaled(a)
            return self._scaled(self.norm("post_feedforward_layernorm").plain(self.mlp(r))), r
        x, residual = self.norm("input_layernorm")(h, residual)
        a = self.self_attn(x, batch, pool, tables)
        if self.layout == "pre":
            x, residual = self.norm("post_attention_layernorm")(self._scaled(a), residual)
            return self._scaled(self.mlp(x)), residual
        a = self.norm("post_attention_layernorm").plain(a)
        x, residual = self.norm("pre_feedforward_layernorm")(self._scaled(a), residual)
        out = self.norm("post_feedforward_layernorm").plain(self.mlp(x))
        return self._scaled(out), residual

    def _scaled(self, branch: torch.Tensor) -> torch.Tensor:
        return branch if self.scale == 1.0 else branch * self.scale


class CausalLM(nn.Module):
    """A decoder-only transformer of any family; `forward` returns logits for
    `batch.logit_indices` only.

    Its three parts are separate for the model runner, which replaces `decoder` by the fused
    C decode step for the batches that step applies to: `embed`, `decoder`, `logits`."""

    def __init__(self, cfg: ModelConfig, *, rope_tables: list[torch.Tensor] | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens: nn.Module = _embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head: nn.Module = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.requires_grad_(False)
        self.rope_tables = cfg.cos_sin_tables() if rope_tables is None else rope_tables

    def forward(self, batch: ForwardBatch, pool: TokenToKVPool) -> torch.Tensor:
        """Run all layers over the batch's tokens; returns float32 logits [N, vocab]."""
        h = self.decoder(self.embed(batch), batch, pool)
        return self.logits(h[batch.logit_indices])

    def embed(self, batch: ForwardBatch) -> torch.Tensor:
        """The batch's token embeddings [T, hidden], times the family's embedding scale (in
        the model's dtype, as transformers multiplies)."""
        out: torch.Tensor = self.embed_tokens(batch.input_ids)
        scale = self.cfg.embedding_scale
        return out if scale == 1.0 else out * torch.tensor(scale, dtype=out.dtype)

    def decoder(self, h: torch.Tensor, batch: ForwardBatch, pool: TokenToKVPool) -> torch.Tensor:
        """The layers and the final norm, layer by layer: hidden states [T, hidden]."""
        residual: torch.Tensor | None = None
        for layer in self.layers:
            h, residual = layer(h, residual, batch, pool, self.rope_tables)
        h, _ = self.norm(h, residual)
        return h

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits [N, vocab] of final-normed hidden states [N, hidden]: the LM head,
        then the family's logit scale and final soft cap."""
        out: torch.Tensor = self.lm_head(hidden).float()
        cfg = self.cfg
        if cfg.logit_scale != 1.0:
            out = out * cfg.logit_scale
        if cfg.final_softcap is not None:
            out = torch.tanh(out / cfg.final_softcap) * cfg.final_softcap
        return out


def _embedding(vocab: int, hidden: int) -> nn.Embedding:
    """nn.Embedding, randomly initialized except on the meta device (`empty_model`): its
    normal_ there goes through torch's reference ops, whose import of torch._dynamo costs
    about a second of start-up."""
    if not torch.empty(0).is_meta:  # the device context in force, found without a real table
        return nn.Embedding(vocab, hidden)
    return nn.Embedding(vocab, hidden, _weight=torch.empty(vocab, hidden))


def _materialized(model: CausalLM, device: torch.device) -> CausalLM:
    """`model.to_empty(device=device)` without its reference ops (whose imports of torch.fx
    take half a second): each meta parameter and buffer replaced by an empty tensor on
    `device`, a real one elsewhere (a packed layer's bias) moved there; a parameter shared by
    two modules stays shared."""
    made: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is None or (not t.is_meta and t.device.type == device.type):
                    continue
                if id(t) not in made:
                    moved = (
                        torch.empty(t.shape, dtype=t.dtype, device=device)
                        if t.is_meta
                        else t.detach().to(device)
                    )
                    made[id(t)] = (
                        nn.Parameter(moved, requires_grad=False)
                        if isinstance(t, nn.Parameter)
                        else moved
                    )
                table[name] = made[id(t)]  # type: ignore[assignment]
    return model


def empty_model(
    cfg: ModelConfig,
    *,
    dtype: torch.dtype,
    device: torch.device,
    modules: Mapping[str, nn.Module] | None = None,
) -> CausalLM:
    """The model with uninitialized weights on `device` (no random init: a loader fills
    every parameter); `modules` (by name, e.g. quantized layers holding their own weights)
    replace the model's own before anything is allocated; tied embeddings shared (an LM
    head tied to a replaced embedding is the loader's to set), the RoPE tables computed."""
    tables = [t.to(device=device) for t in cfg.cos_sin_tables()]  # not on meta: see below
    with torch.device("meta"):  # an op computed there imports torch._dynamo (a second)
        skeleton = CausalLM(cfg, rope_tables=tables)
    for name, module in (modules or {}).items():
        skeleton.set_submodule(name, module)
    model = _materialized(skeleton, device).to(dtype)
    tied = isinstance(model.lm_head, nn.Linear) and isinstance(model.embed_tokens, nn.Embedding)
    if cfg.tie_word_embeddings and tied:
        model.lm_head.weight = model.embed_tokens.weight
    model.rope_tables = tables
    return model

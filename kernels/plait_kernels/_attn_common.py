"""Argument checks shared by the paged attention kernels."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import FLOAT_DTYPES, INDEX_DTYPES, check_same_dtype, check_tensor


def check_paged_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    req_to_token: torch.Tensor,
    per_request: dict[str, torch.Tensor],
    *,
    scale: float,
    sliding_window: int | None,
    softcap: float | None = None,
) -> int:
    """Validate the shared arguments of the paged attention kernels; return the batch size.

    ``per_request`` maps names to the [B] integer tensors (req_slots, seq_lens, ...).
    """
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES, last_contiguous=True)
    dev = q.device
    _, hq, d = q.shape
    check_tensor("k_pool", k_pool, ndim=3, device=dev, contiguous=True)
    check_same_dtype("k_pool", k_pool, "q", q)
    if k_pool.shape[2] != d:
        raise ValueError(f"k_pool head dim must equal q's ({d}), got shape {tuple(k_pool.shape)}")
    hkv = k_pool.shape[1]
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(
            f"k_pool kv heads ({hkv}) must divide q's heads ({hq}) for grouped-query attention"
        )
    check_tensor("v_pool", v_pool, shape=tuple(k_pool.shape), device=dev, contiguous=True)
    check_same_dtype("v_pool", v_pool, "q", q)
    check_tensor("req_to_token", req_to_token, ndim=2, dtypes=INDEX_DTYPES, device=dev)
    check_tensor("req_to_token", req_to_token, ndim=2, last_contiguous=True)
    batch = None
    for name, t in per_request.items():
        check_tensor(name, t, ndim=1, dtypes=INDEX_DTYPES, device=dev)
        if batch is None:
            batch = t.shape[0]
        elif t.shape[0] != batch:
            first = next(iter(per_request))
            raise ValueError(f"{name} must have shape [{batch}] like {first}, got {tuple(t.shape)}")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise ValueError(f"scale must be a float, got {scale!r}")
    if sliding_window is not None and (
        not isinstance(sliding_window, int)
        or isinstance(sliding_window, bool)
        or sliding_window < 1
    ):
        raise ValueError(f"sliding_window must be a positive int or None, got {sliding_window!r}")
    if softcap is not None and (
        not isinstance(softcap, (int, float)) or isinstance(softcap, bool) or not softcap > 0
    ):
        raise ValueError(f"softcap must be a positive float or None, got {softcap!r}")
    return int(batch or 0)


def soft_capped(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """``softcap * tanh(scores / softcap)`` in place (Gemma 2's attention soft cap); the
    scores themselves without a cap."""
    if softcap is None:
        return scores
    return scores.div_(softcap).tanh_().mul_(softcap)


@triton.jit
def tl_soft_cap(s: tl.tensor, softcap: tl.tensor) -> tl.tensor:
    """``softcap * tanh(s / softcap)``, tanh from exp(-2|x|) (no overflow)."""
    x = s / softcap
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return softcap * tl.where(x >= 0, t, -t)


def gather_slots(
    req_to_token: torch.Tensor, req_slots: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """KV slots [B, N] of positions ``pos`` [B, N] of requests ``req_slots`` [B]; invalid
    positions point at slot 0 (the pool's dummy slot)."""
    cols = pos.clamp(min=0, max=req_to_token.shape[1] - 1)
    slots = req_to_token[req_slots.long().unsqueeze(1), cols]
    return torch.where(valid, slots, 0).long()

"""store_kv: Triton (interpreter) vs torch path vs a plain loop."""

from __future__ import annotations

import pytest
import torch

from plait.kernels import store_kv

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def loop_reference(k, v, k_pool, v_pool, slots):
    for i, s in enumerate(slots.tolist()):
        k_pool[s] = k[i]
        v_pool[s] = v[i]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("t", "hkv", "d"), [(1, 1, 64), (37, 8, 128), (130, 2, 64), (5, 3, 80)])
@pytest.mark.parametrize("strided", [False, True])
def test_store_kv_impls_agree(dtype: torch.dtype, t: int, hkv: int, d: int, strided: bool) -> None:
    g = torch.Generator().manual_seed(t * 7 + hkv)
    s = 300
    if strided:  # k and v sliced out of a fused qkv projection
        qkv = torch.randn(t, 4 + 2 * hkv, d, generator=g).to(dtype)
        k, v = qkv[:, 4 : 4 + hkv], qkv[:, 4 + hkv :]
    else:
        k = torch.randn(t, hkv, d, generator=g).to(dtype)
        v = torch.randn(t, hkv, d, generator=g).to(dtype)
    slots = torch.randperm(s, generator=g)[:t]
    pools = {}
    for impl in ("torch", "triton", "loop"):
        k_pool = torch.zeros(s, hkv, d, dtype=dtype)
        v_pool = torch.zeros(s, hkv, d, dtype=dtype)
        if impl == "loop":
            loop_reference(k, v, k_pool, v_pool, slots)
        else:
            store_kv(k, v, k_pool, v_pool, slots.int() if impl == "triton" else slots, impl=impl)
        pools[impl] = (k_pool, v_pool)
    for impl in ("torch", "triton"):
        assert torch.equal(pools[impl][0], pools["loop"][0]), impl
        assert torch.equal(pools[impl][1], pools["loop"][1]), impl


def test_store_kv_empty() -> None:
    k_pool = torch.zeros(4, 2, 8)
    for impl in ("torch", "triton"):
        empty = torch.zeros(0, 2, 8)
        store_kv(empty, empty, k_pool, k_pool.clone(), torch.zeros(0, dtype=torch.int64), impl=impl)
    assert not k_pool.any()


def test_store_kv_input_checks() -> None:
    k = torch.zeros(3, 2, 8)
    pool = torch.zeros(10, 2, 8)
    slots = torch.arange(3)
    with pytest.raises(ValueError, match="k must be 3-D"):
        store_kv(torch.zeros(3, 16), k, pool, pool, slots)
    with pytest.raises(ValueError, match="v must have shape"):
        store_kv(k, torch.zeros(3, 2, 4), pool, pool, slots)
    with pytest.raises(ValueError, match="k_pool must have shape"):
        store_kv(k, k, torch.zeros(10, 4, 8), pool, slots)
    with pytest.raises(ValueError, match="v_pool"):
        store_kv(k, k, pool, torch.zeros(10, 2, 8, dtype=torch.bfloat16), slots)
    with pytest.raises(ValueError, match="k_pool must be contiguous"):
        store_kv(k, k, torch.zeros(10, 8, 2).transpose(1, 2), pool, slots)
    with pytest.raises(ValueError, match="slots"):
        store_kv(k, k, pool, pool, slots.float())
    with pytest.raises(ValueError, match="slots"):
        store_kv(k, k, pool, pool, torch.arange(2))
    with pytest.raises(ValueError, match="slots must lie"):
        store_kv(k, k, pool, pool, torch.tensor([0, 1, 10]))

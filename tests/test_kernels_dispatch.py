"""Dispatch rules, public exports, and an ahead-of-time compile of every kernel for sm_90."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import plait.kernels
from plait.kernels._dispatch import check_tensor, choose_impl, next_pow2

CPU = torch.device("cpu")


def test_exports() -> None:
    assert sorted(plait.kernels.__all__) == [
        "apply_token_bitmask",
        "extend_attention",
        "paged_decode_attention",
        "rmsnorm",
        "rope",
        "store_kv",
        "top_k_top_p_sample",
    ]
    for name in plait.kernels.__all__:
        assert callable(getattr(plait.kernels, name))
        assert getattr(plait.kernels, name).__doc__


def test_choose_impl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PLAIT_FORCE_TRITON", raising=False)
    assert choose_impl("auto", CPU) == "torch"
    assert choose_impl("torch", CPU) == "torch"
    assert choose_impl("triton", CPU) == "triton"  # the interpreter is on in tests
    assert choose_impl("auto", torch.device("cuda", 0)) == "triton"
    monkeypatch.setenv("PLAIT_FORCE_TRITON", "1")
    assert choose_impl("auto", CPU) == "triton"
    assert choose_impl("torch", CPU) == "torch"
    with pytest.raises(ValueError, match="impl must be one of"):
        choose_impl("numpy", CPU)
    monkeypatch.setattr("plait.kernels._dispatch._INTERPRETED", False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        choose_impl("triton", CPU)


def test_forced_triton_runs_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    # (``import plait.kernels.rmsnorm as m`` would bind the re-exported function, not the module.)
    mod = importlib.import_module("plait.kernels.rmsnorm")
    real = mod.rmsnorm_triton
    monkeypatch.setattr(mod, "rmsnorm_triton", lambda *a, **k: calls.append("t") or real(*a, **k))
    monkeypatch.setenv("PLAIT_FORCE_TRITON", "1")
    plait.kernels.rmsnorm(torch.ones(2, 8), torch.ones(8), eps=1e-6)
    assert calls == ["t"]


def test_check_tensor_messages() -> None:
    with pytest.raises(ValueError, match="foo must be a torch.Tensor"):
        check_tensor("foo", [1, 2])
    with pytest.raises(ValueError, match=r"foo must have shape \[\*, 3\]"):
        check_tensor("foo", torch.zeros(2, 4), shape=(None, 3))
    assert next_pow2(0) == 1 and next_pow2(5) == 8 and next_pow2(64) == 64


COMPILE_SCRIPT = textwrap.dedent(
    """
    import importlib
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    import triton

    def mod(name):
        return importlib.import_module("plait.kernels." + name)

    def build(fn, ptrs, **consts):
        sig = {}
        for n in fn.arg_names:
            if n in consts:
                sig[n] = "constexpr"
            elif n in ptrs:
                sig[n] = ptrs[n]
            else:
                sig[n] = "fp32" if n in ("scale", "eps") else "i32"
        triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32))

    for dt in ("*bf16",):
        up = dict(DOT_PRECISION="tf32" if dt == "*bf16" else "ieee", UPCAST=False)
        build(mod("bitmask")._bitmask_kernel,
              dict(logits_ptr=dt, bitmask_ptr="*i32", rows_ptr="*i64"), HAS_ROWS=True, BLOCK_W=128)
        build(mod("kv_store")._store_kv_kernel,
              dict(k_ptr=dt, v_ptr=dt, k_pool_ptr=dt, v_pool_ptr=dt, slots_ptr="*i64"),
              BLOCK_H=8, BLOCK_D=128)
        build(mod("decode_attention")._decode_split_kernel,
              dict(q_ptr=dt, k_ptr=dt, v_ptr=dt, r2t_ptr="*i32", req_slots_ptr="*i64",
                   seq_lens_ptr="*i64", mid_o_ptr="*fp32", mid_lse_ptr="*fp32"),
              GROUP=4, HEAD_DIM=128, NUM_SPLITS=2, HAS_WINDOW=True, BLOCK_H=16, BLOCK_D=128,
              BLOCK_N=64, **up)
        build(mod("decode_attention")._decode_merge_kernel,
              dict(mid_o_ptr="*fp32", mid_lse_ptr="*fp32", out_ptr=dt),
              HEAD_DIM=128, NUM_SPLITS=2, BLOCK_S=2, BLOCK_D=128)
        build(mod("extend_attention")._extend_kernel,
              dict(q_ptr=dt, k_ptr=dt, v_ptr=dt, out_ptr=dt, r2t_ptr="*i32",
                   req_slots_ptr="*i64", prefix_lens_ptr="*i64", extend_lens_ptr="*i64",
                   q_start_ptr="*i64"),
              GROUP=4, HEAD_DIM=128, HAS_WINDOW=True, BLOCK_M=64, BLOCK_N=64, BLOCK_D=128, **up)
        build(mod("rmsnorm")._rmsnorm_kernel,
              dict(x_ptr=dt, res_ptr=dt, w_ptr=dt, out_ptr=dt, res_out_ptr=dt),
              HAS_RESIDUAL=True, ROWS=1, BLOCK=4096)
        build(mod("rope")._rope_kernel, dict(q_ptr=dt, k_ptr=dt, pos_ptr="*i64", cache_ptr="*fp32"),
              HALF=64, BLOCK_H=16, BLOCK_HALF=64)
    build(mod("sampling")._sample_kernel,
          dict(probs_ptr="*fp32", top_k_ptr="*i64", top_p_ptr="*fp32", min_p_ptr="*fp32",
               uniforms_ptr="*fp32", out_ptr="*i64"), HAS_MIN_P=True, BLOCK=4096)
    print("compiled")
    """
)


def test_kernels_compile_for_sm90() -> None:
    """Lower every kernel through ttir/ttgir/llir/ptx/cubin for an H100/H200 (no GPU needed)."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", COMPILE_SCRIPT], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr:
        pytest.skip("no ptxas in this Triton install")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "compiled" in proc.stdout

"""The C decode step (``csrc/decode_step_cpu.c``) through ctypes: every decoder layer of a
decode-only batch in one call.

:class:`DecodeStep` describes the model once (packed weights, norm weights, the KV pool, the
cos/sin tables and the addresses of the other C kernels it calls: ``plait_qmm_f32``,
``plait_decode_f32``, ``plait_pool_run``), validates every tensor the C code will read, and
keeps them alive. :meth:`DecodeStep.run` then costs one ctypes call per step; the batch's
indices are checked in C before anything is read or written.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ._native import load_native
from ._quant_native import ISAS, native_isa, pool_function
from .native_weight import NativeWeight, descriptor
from .quant import GENERIC_MAX_M

_i64, _ptr, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
_ERRORS = {
    -10: "positions must lie in [0, {max_pos}) (rows of the cos/sin tables)",
    -11: "out_slots must lie in [0, {slots}) (the KV pool)",
    -12: "decode rows must lie in [0, {rows}) (rows of req_to_token)",
    -13: "decode seq_lens must lie in [0, {width}] (columns of req_to_token)",
    -14: "req_to_token holds a KV slot outside the pool (size {slots})",
    -2: "req_to_token holds a KV slot outside the pool (size {slots})",
    -3: "the quantized matmul rejected a weight",
    -15: "logit_indices must lie in [0, {tokens})",
    -20: "the all-reduce between ranks failed",
}


class _Layer(ctypes.Structure):
    _fields_ = [(n, _ptr) for n in ("qkv", "o", "gate_up", "down")]
    _fields_ += [(f"{n}_bias", _ptr) for n in ("qkv", "o", "gate_up", "down")]
    _fields_ += [(n, _ptr) for n in ("in_norm", "attn_out_norm", "mlp_norm", "mlp_out_norm")]
    _fields_ += [(n, _ptr) for n in ("q_norm", "k_norm", "cos_sin", "k_pool", "v_pool")]
    _fields_ += [("window", _i64)]


class _Model(ctypes.Structure):
    _fields_ = [(n, _i64) for n in ("num_layers", "hidden", "heads", "kv_heads", "head_dim")]
    _fields_ += [(n, _i64) for n in ("inter", "num_slots", "max_pos", "isa", "act", "qk_whole")]
    _fields_ += [(n, _f32) for n in ("eps", "scale", "softcap", "resid_scale")]
    _fields_ += [(n, _ptr) for n in ("final_norm", "layers", "qmm", "attend", "pool")]
    _fields_ += [("reduce", _ptr), ("reduce_ctx", _ptr)]


# Tensor parallelism: the all-reduce the step calls on each row-parallel output (ctx, buf, n).
REDUCE_FN = ctypes.CFUNCTYPE(ctypes.c_int, _ptr, _ptr, _i64)


class _Batch(ctypes.Structure):
    _fields_ = [(n, _i64) for n in ("tokens", "table_rows", "table_width", "table_stride")]
    _fields_ += [("num_logits", _i64)]
    _fields_ += [(n, _ptr) for n in ("positions", "slots", "rows", "seq", "logits", "table")]
    _fields_ += [("embed", _ptr), ("start", _ptr)]
    _fields_ += [(n, _ptr) for n in ("work", "resid", "x", "qkv", "q", "attn", "lse", "y")]
    _fields_ += [(n, _ptr) for n in ("gu", "act")]


# The MLP activations the C step computes, in the order of its ACT_* codes.
ACTIVATIONS = ("silu", "gelu_tanh")
# q/k norms: over each head's q and k ("head"), or over all of q and all of k ("full").
QK_NORMS = ("head", "full")


@dataclass(frozen=True, kw_only=True)
class StepLayer:
    """One decoder layer as the C step reads it (fp32 tensors on the CPU). Each of the four
    norms [hidden] is there or not as the family puts it: `in_norm` before attention and
    `mlp_norm` before the MLP (None: the branch reads the residual stream itself),
    `attn_out_norm` and `mlp_out_norm` on each branch's output before it joins the residual."""

    qkv: NativeWeight
    o: NativeWeight
    gate_up: NativeWeight
    down: NativeWeight
    biases: tuple[torch.Tensor | None, ...]  # of qkv, o, gate_up, down
    in_norm: torch.Tensor | None
    mlp_norm: torch.Tensor | None
    attn_out_norm: torch.Tensor | None = None
    mlp_out_norm: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None  # [head_dim] per head, or [q size] over all heads
    k_norm: torch.Tensor | None = None
    cos_sin: torch.Tensor  # [positions, head_dim]: this layer's RoPE table
    window: int | None = None  # the last `window` positions (None: all)
    k_pool: torch.Tensor  # [slots, kv_heads, head_dim]
    v_pool: torch.Tensor


@dataclass(frozen=True, kw_only=True)
class StepChoices:
    """What every layer of the model computes alike: query heads, the norms' epsilon, the
    attention scores' scale and soft cap (None: none), the MLP activation (`ACTIVATIONS`),
    the q/k norms (`QK_NORMS`, None: none) and the residual branches' scale."""

    heads: int
    eps: float
    scale: float
    softcap: float | None = None
    activation: str = "silu"
    qk_norm: str | None = None
    residual_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"decode step: activation must be one of {ACTIVATIONS}")
        if self.qk_norm is not None and self.qk_norm not in QK_NORMS:
            raise ValueError(f"decode step: qk_norm must be one of {QK_NORMS} or None")
        if self.softcap is not None and not self.softcap > 0:
            raise ValueError(f"decode step: softcap must be positive, got {self.softcap}")


def _library() -> ctypes.CDLL | None:
    """The step library, or None when it or a kernel it calls cannot be built."""
    if native_isa() is None or load_native("decode_attention_cpu") is None:
        return None
    lib = load_native("decode_step_cpu")
    if lib is not None:
        lib.plait_decode_step.argtypes = [_ptr, _ptr, ctypes.c_int]
        lib.plait_decode_step.restype = ctypes.c_int
    return lib


def step_available() -> bool:
    """Whether the C decode step can run here (a C compiler built every kernel it needs)."""
    return _library() is not None


def _address(lib_name: str, symbol: str) -> int:
    lib = load_native(lib_name)
    assert lib is not None
    value = ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value
    assert value is not None
    return value


def _check(name: str, t: torch.Tensor | None, shape: tuple[int, ...]) -> int:
    """The address of an fp32 contiguous CPU tensor of `shape` (0 for None); else ValueError."""
    if t is None:
        return 0
    ok = t.dtype == torch.float32 and t.is_cpu and t.is_contiguous() and tuple(t.shape) == shape
    if not ok:
        raise ValueError(f"decode step: {name} must be a contiguous fp32 CPU tensor {list(shape)}")
    return int(t.data_ptr())


class DecodeStep:
    """Every layer of a dense decoder for a decode-only batch, in C (see the module
    docstring). Built once per model and KV pool; `run` per step. Raises ValueError at
    construction when a tensor is not what the C code reads (shape, dtype, contiguity)."""

    def __init__(
        self,
        layers: Sequence[StepLayer],
        *,
        final_norm: torch.Tensor,
        choices: StepChoices,
        reduce: Callable[[int], int] | None = None,
    ) -> None:
        """`reduce(n)` (tensor parallelism): sum the first n floats of `reduce_buffer()` over
        the ranks in place, returning 0 or a negative code; called after each layer's
        attention and MLP output projections."""
        lib = _library()
        if lib is None:
            raise RuntimeError("decode step: the C kernels cannot be built here")
        self._lib, self._layers, self.choices = lib, tuple(layers), choices
        first, heads = self._layers[0], choices.heads
        slots, kv_heads, head_dim = first.k_pool.shape
        hidden, inter = first.qkv.k, first.down.k
        if heads % kv_heads or head_dim % 2 or first.qkv.n != (heads + 2 * kv_heads) * head_dim:
            raise ValueError(
                f"decode step: {heads} heads do not fit a pool of {kv_heads} x {head_dim}"
            )
        self.dims = (hidden, heads, kv_heads, head_dim, inter, int(slots))
        self.max_pos = int(first.cos_sin.shape[0])
        self._structs = (_Layer * len(self._layers))(*map(self._layer, self._layers))
        self._keep = final_norm
        self.model = _Model(
            len(self._layers), hidden, heads, kv_heads, head_dim, inter, slots, self.max_pos,
            ISAS.index(native_isa() or "generic"), ACTIVATIONS.index(choices.activation),
            int(choices.qk_norm == "full"), choices.eps, choices.scale, choices.softcap or 0.0,
            choices.residual_scale, _check("final_norm", final_norm, (hidden,)),
            ctypes.addressof(self._structs), _address("quant_matmul_cpu", "plait_qmm_f32"),
            _address("decode_attention_cpu", "plait_decode_f32"), pool_function() or 0,
        )  # fmt: skip
        if reduce is not None:
            self._reduce = REDUCE_FN(lambda _ctx, _buf, n: reduce(n))
            self.model.reduce = ctypes.cast(self._reduce, ctypes.c_void_p).value
        self._capacity = 0
        self._batch = _Batch()
        # The portable C matmul (no AVX2) loses to dequantize + GEMM from this many tokens on.
        self.max_tokens = GENERIC_MAX_M - 1 if native_isa() == "generic" else None

    def _layer(self, layer: StepLayer) -> _Layer:
        hidden, heads, kv_heads, head_dim, inter, slots = self.dims
        q_size = heads * head_dim
        shapes = {
            "qkv": (layer.qkv, q_size + 2 * kv_heads * head_dim, hidden),
            "o": (layer.o, hidden, q_size),
            "gate_up": (layer.gate_up, 2 * inter, hidden),
            "down": (layer.down, hidden, inter),
        }
        for name, (w, n, k) in shapes.items():
            if not isinstance(w, NativeWeight) or (w.n, w.k) != (n, k):
                raise ValueError(f"decode step: {name} must be a NativeWeight [{n}, {k}]")
        named = zip(shapes, layer.biases, strict=True)
        biases = [_check(f"{nm} bias", b, (shapes[nm][1],)) for nm, b in named]
        norms = ("in_norm", "attn_out_norm", "mlp_norm", "mlp_out_norm")
        pool = (slots, kv_heads, head_dim)
        return _Layer(
            *(descriptor(w) for w, _, _ in shapes.values()),
            *biases,
            *(_check(name, getattr(layer, name), (hidden,)) for name in norms),
            *self._qk_norms(layer),
            _check("cos_sin", layer.cos_sin, (self.max_pos, head_dim)),
            _check("k_pool", layer.k_pool, pool),
            _check("v_pool", layer.v_pool, pool),
            layer.window or 0,
        )

    def _qk_norms(self, layer: StepLayer) -> tuple[int, int]:
        """The addresses of a layer's q and k norm weights, checked against `choices`."""
        _, heads, kv_heads, head_dim, _, _ = self.dims
        kind = self.choices.qk_norm
        if (layer.q_norm is None, layer.k_norm is None) != (kind is None, kind is None):
            raise ValueError(f"decode step: q_norm and k_norm must be given with qk_norm={kind}")
        whole = kind == "full"
        return (
            _check("q_norm", layer.q_norm, (heads * head_dim if whole else head_dim,)),
            _check("k_norm", layer.k_norm, (kv_heads * head_dim if whole else head_dim,)),
        )

    def _reserve(self, tokens: int) -> None:
        """Scratch for `tokens` tokens, grown to a power of two (never shrunk, so a step
        allocates nothing once the batch size has been seen)."""
        if tokens <= self._capacity:
            return
        cap = 1 << (tokens - 1).bit_length()
        hidden, heads, kv_heads, head_dim, inter, _ = self.dims
        q, qkv = heads * head_dim, (heads + 2 * kv_heads) * head_dim
        sizes = {"resid": hidden, "x": hidden, "qkv": qkv, "q": q, "attn": q, "lse": heads}
        sizes |= {"y": hidden, "gu": 2 * inter, "act": inter}
        floats = torch.empty(cap * sum(sizes.values()), dtype=torch.float32)
        ints = torch.empty(2 * cap + 1, dtype=torch.int64)
        self._scratch, self._capacity = (floats, ints), cap
        views, at = {}, 0
        for name, width in sizes.items():
            views[name] = floats[at : at + cap * width].view(cap, width)
            setattr(self._batch, name, views[name].data_ptr())
            at += cap * width
        self._x, self._y = views["x"], views["y"]
        self._batch.start, self._batch.work = ints.data_ptr(), ints[cap:].data_ptr()

    def reduce_buffer(self) -> torch.Tensor:
        """The scratch the row-parallel outputs are written to (what `reduce` sums)."""
        return self._y

    def run(
        self,
        hidden: torch.Tensor,
        *,
        positions: torch.Tensor,
        out_slots: torch.Tensor,
        rows: torch.Tensor,
        seq_lens: torch.Tensor,
        req_to_token: torch.Tensor,
        logit_indices: torch.Tensor,
        threads: int | None = None,
    ) -> torch.Tensor:
        """The final hidden states (after the final norm) [N, hidden] of tokens
        `logit_indices` [N] of the T tokens whose embeddings are `hidden` [T, hidden]. Token t
        sits at `positions[t]`, writes its K/V to slot `out_slots[t]` and attends to positions
        [0, seq_lens[t]) (the last `window` of them) of table row `rows[t]`. The result is a
        view of scratch memory, valid until the next call. Raises ValueError (nothing
        written) when an index is out of range."""
        t, n = hidden.shape[0], logit_indices.numel()
        if (
            hidden.shape != (t, self.dims[0])
            or hidden.dtype != torch.float32
            or n > t
            or not hidden.is_cpu
        ):
            raise ValueError(f"decode step: hidden must be fp32 [T, {self.dims[0]}], N <= T")
        hidden = hidden.contiguous()
        table = req_to_token
        if table.dtype != torch.int32 or table.dim() != 2 or table.stride(1) != 1:
            raise ValueError("decode step: req_to_token must be a 2-D int32 table, rows strided")
        named = _named(positions, out_slots, rows, seq_lens)
        idx = [_index(name, v, t) for name, v in named] + [_index("logits", logit_indices, n)]
        self._reserve(max(t, 1))
        b = self._batch
        b.embed = hidden.data_ptr()
        b.tokens, b.table_rows, b.table_width, b.table_stride = t, *table.shape, table.stride(0)
        b.num_logits = n
        b.positions, b.slots, b.rows, b.seq, b.logits = (i.data_ptr() for i in idx)
        b.table = table.data_ptr()
        status = self._lib.plait_decode_step(
            ctypes.addressof(self.model), ctypes.addressof(b), threads or torch.get_num_threads()
        )
        if status == -1:
            raise MemoryError("decode step: cannot allocate scratch memory")
        if status == -20:
            raise RuntimeError("decode step: " + _ERRORS[status])
        if status:
            sizes = {"max_pos": self.max_pos, "slots": self.dims[5]}
            sizes |= {"rows": table.shape[0], "width": table.shape[1], "tokens": t}
            raise ValueError("decode step: " + _ERRORS[status].format(**sizes))
        return self._x[:n]


def _named(*tensors: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    return list(zip(("positions", "out_slots", "rows", "seq_lens"), tensors, strict=True))


def _index(name: str, t: torch.Tensor, n: int) -> torch.Tensor:
    """`t` as a contiguous int64 CPU tensor of n entries (converted only when it is not)."""
    if t.dtype != torch.int64 or not t.is_contiguous() or not t.is_cpu:
        t = t.to("cpu", torch.int64).contiguous()
    if t.shape != (n,):
        raise ValueError(f"decode step: {name} must have {n} entries, got {tuple(t.shape)}")
    return t

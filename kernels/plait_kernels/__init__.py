"""plait.kernels: Triton kernels for the hot paths, each beside its plain-torch reference.

Every function takes ``impl="auto" | "torch" | "triton"``: "auto" runs Triton on CUDA tensors and
the vectorized torch path on CPU tensors (``PLAIT_FORCE_TRITON=1`` makes "auto" pick Triton on CPU
too, through ``TRITON_INTERPRET=1``).
"""

from .bitmask import apply_token_bitmask
from .decode_attention import paged_decode_attention
from .extend_attention import extend_attention
from .kv_store import store_kv
from .rmsnorm import rmsnorm
from .rope import rope
from .sampling import top_k_top_p_sample

__all__ = [
    "apply_token_bitmask",
    "extend_attention",
    "paged_decode_attention",
    "rmsnorm",
    "rope",
    "store_kv",
    "top_k_top_p_sample",
]

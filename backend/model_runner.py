"""Owns the device: the model's weights, the KV pool, and one forward per step."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from plait.backend.builtin_models import resolve_model_path
from plait.backend.config import EngineConfig
from plait.backend.decode_step import FusedDecode
from plait.backend.forward_batch import ForwardBatch
from plait.backend.kv_manager import KVManager
from plait.backend.kv_pool import ReqToTokenPool, TokenToKVPool
from plait.backend.loader import load_model
from plait.backend.radix_cache import RadixCache

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
REQ_ROWS_HEADROOM = 8


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)} or 'auto', got {name!r}")
    return DTYPES[name]


class ModelRunner:
    """Loads weights from a local directory and runs `forward(ForwardBatch) -> logits`."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = pick_device(config.device)
        self.dtype = pick_dtype(config.dtype, self.device)
        self.model_path: Path = resolve_model_path(config.model)
        self.model = load_model(
            self.model_path,
            dtype=self.dtype,
            device=self.device,
            quantization=config.quantization,
        )
        cfg = self.model.cfg
        self.model_config = cfg
        self.vocab_size = cfg.vocab_size
        self.context_len = min(
            config.context_length or cfg.max_position_embeddings, cfg.max_position_embeddings
        )
        self.eos_ids = frozenset(cfg.eos_token_ids)
        self.kv_pool = TokenToKVPool(
            num_tokens=self._kv_tokens(),
            page_size=config.page_size,
            num_layers=cfg.num_layers,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        self.req_pool = ReqToTokenPool(
            max_reqs=config.max_running_requests + REQ_ROWS_HEADROOM,
            max_len=self.context_len + config.page_size,
            device=self.device,
        )
        self.fused_decode = self._attach_fused_decode()

    def _attach_fused_decode(self) -> str:
        """Give the model the fused CPU decode step when the config asks for it and the model
        allows it; returns "on" or why it is off."""
        if not self.config.fused_decode:
            return "off (fused_decode=False)"
        built = FusedDecode.build(self.model, self.kv_pool)
        if isinstance(built, str):
            return f"off ({built})"
        self.model.fused_decode = built
        return "on"

    def kv_manager(self, *, disable_radix_cache: bool) -> KVManager:
        tree = RadixCache(pool=self.kv_pool, disabled=disable_radix_cache)
        return KVManager(req_pool=self.req_pool, kv_pool=self.kv_pool, tree=tree)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """float32 logits [len(batch.logit_indices), vocab] on the device."""
        if self.device.type != "cpu":
            batch = batch.to(self.device)
        return self.model(batch, self.kv_pool)

    def _kv_tokens(self) -> int:
        cfg, conf = self.model.cfg, self.config
        if conf.kv_tokens is not None:
            return conf.kv_tokens
        per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * self.dtype.itemsize
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return max(conf.page_size, int(free * conf.mem_fraction) // per_token)
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return max(conf.page_size, min(conf.max_kv_tokens_cpu, int(avail * 0.25) // per_token))

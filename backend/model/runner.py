"""Owns the device: the model's weights, the KV pool, and one forward per step."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from plait.backend.cache.kv_manager import KVManager
from plait.backend.cache.kv_pool import ReqToTokenPool, TokenToKVPool
from plait.backend.cache.radix_cache import RadixCache
from plait.backend.config import EngineConfig
from plait.backend.devices import pick_device, pick_dtype
from plait.backend.model.builtin import resolve_model_path
from plait.backend.model.forward_batch import ForwardBatch
from plait.backend.model.fused_decode import FusedDecode
from plait.backend.model.loader import load_model
from plait.backend.model.quantized import set_activation_bits
from plait.backend.parallel.launch import TensorParallel, rank_device
from plait.backend.parallel.plan import plan_shards
from plait.backend.parallel.shard import inter_align, shard_model
from plait.backend.parallel.wire import send_batch, send_stop

REQ_ROWS_HEADROOM = 8
log = logging.getLogger("plait.runner")


class ModelRunner:
    """Loads weights from a local directory and runs `forward(ForwardBatch) -> logits`.

    With `config.tp > 1` this is one rank's slice of the model (`parallel`: rank 0 starts
    the other ranks of its machine when none is given) and rank 0's `forward` broadcasts
    each batch to the others (docs/scale.md)."""

    def __init__(self, config: EngineConfig, *, parallel: TensorParallel | None = None) -> None:
        self.config = config
        started = parallel is None and config.tp > 1
        if started:
            parallel = TensorParallel.start(config)
        self.parallel = parallel
        self._started = started
        try:
            self._load(config, parallel)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Setup failed: kill the ranks this runner started and leave the group, so a later
        engine in this process can form one."""
        if self._started and self.parallel is not None:
            self.parallel.abort()

    def _load(self, config: EngineConfig, parallel: TensorParallel | None) -> None:
        """Load (and under `--tp` shard) the model, size the pools, build the fused step."""
        self.device = pick_device(config.device)
        if parallel is not None:
            self.device = rank_device(config, parallel.rank)
        self.dtype = pick_dtype(config.dtype, self.device)
        self.model_path: Path = resolve_model_path(config.model)
        self.model = load_model(
            self.model_path,
            dtype=self.dtype,
            device=self.device,
            quantization=config.quantization,
        )
        set_activation_bits(self.model, config.activation_bits)
        full_cfg = self.model.cfg
        if parallel is not None:
            plan = plan_shards(
                full_cfg, rank=parallel.rank, world=config.tp, inter_align=inter_align(self.model)
            )
            shard_model(self.model, plan=plan, comm=parallel.comm)
        cfg = self.model.cfg
        self.model_config = cfg
        self.vocab_size = cfg.vocab_size
        self.context_len = min(
            config.context_length or cfg.max_position_embeddings, cfg.max_position_embeddings
        )
        self.eos_ids = frozenset(cfg.eos_token_ids)
        self.kv_pool = TokenToKVPool(
            num_tokens=self._agreed_kv_tokens(),
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
        self.fused: FusedDecode | None = None
        self.fused_decode = self._build_fused_decode()

    def _build_fused_decode(self) -> str:
        """Build the fused CPU decode step (`self.fused`) when the config asks for it and the
        model allows it; returns "on" or why it is off."""
        if not self.config.fused_decode:
            return "off (fused_decode=False)"
        built = FusedDecode.build(
            self.model, self.kv_pool, comm=None if self.parallel is None else self.parallel.comm
        )
        if isinstance(built, str):
            return f"off ({built})"
        self.fused = built
        return "on"

    def kv_manager(self, *, disable_radix_cache: bool) -> KVManager:
        tree = RadixCache(pool=self.kv_pool, disabled=disable_radix_cache)
        return KVManager(req_pool=self.req_pool, kv_pool=self.kv_pool, tree=tree)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """float32 logits [len(batch.logit_indices), vocab] on the device."""
        if self.parallel is not None:
            return self._parallel_forward(batch)
        return self.run(batch)

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """This rank's forward of `batch` (moved to the device): the fused decode step's
        layers where it applies, else the model's layer by layer."""
        if self.device.type != "cpu":
            batch = batch.to(self.device)
        fused = self.fused
        if fused is not None and fused.applies(batch, self.kv_pool):
            return self.model.logits(fused(self.model.embed(batch), batch))
        return self.model(batch, self.kv_pool)

    def _parallel_forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Rank 0 under `--tp`: every rank runs the batch; any error leaves the ranks out
        of step, so it is fatal (`TensorParallel.fail`)."""
        parallel = self.parallel
        assert parallel is not None
        if parallel.failure is not None:
            raise RuntimeError(f"tensor parallelism failed: {parallel.failure}")
        try:
            return self.run(send_batch(parallel.comm, batch))
        except Exception as exc:
            parallel.fail(f"a forward failed on rank 0: {exc!r}")
            raise

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (rank 0; nothing without `--tp`)."""
        if self.parallel is not None and self.parallel.rank == 0:
            comm = self.parallel.comm
            self.parallel.close(lambda: send_stop(comm))

    def _agreed_kv_tokens(self) -> int:
        """The KV pool's size: rank 0's, on every rank (slots are rank 0's to hand out)."""
        if self.parallel is None:
            return self._kv_tokens()
        mine = self._kv_tokens() if self.parallel.rank == 0 else 0
        return int(self.parallel.comm.broadcast_object(mine))  # type: ignore[call-overload]

    def _kv_tokens(self) -> int:
        """The pool's size in tokens, logged with what decided it."""
        cfg, conf = self.model.cfg, self.config
        per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * self.dtype.itemsize
        if conf.kv_tokens is not None:
            tokens, why = conf.kv_tokens, "kv_tokens"
        elif conf.kv_memory_mib is not None:
            tokens, why = conf.kv_memory_mib * 2**20 // per_token, "kv_memory_mib"
        else:
            fraction = conf.memory_fraction(self.device.type)
            if self.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.device)
                tokens, why = int(free * fraction) // per_token, f"{fraction} of free GPU memory"
            else:
                avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
                tokens = min(conf.max_kv_tokens_cpu, int(avail * fraction) // per_token)
                why = f"{fraction} of available RAM, at most {conf.max_kv_tokens_cpu} tokens"
        tokens = max(conf.page_size, tokens)
        log.info(
            "KV pool: %d tokens x %.1f KiB = %.1f MiB (%s, %s)",
            tokens, per_token / 1024, tokens * per_token / 2**20, self.dtype, why,
        )  # fmt: skip
        return tokens

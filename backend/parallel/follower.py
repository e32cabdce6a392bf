"""A tensor-parallel rank other than 0: load its slice, then run every batch rank 0 sends.

`python -m plait.backend.parallel.follower` with the engine config, the rank and the
rendezvous address in the environment (`launch.spawn_rank`). It exits 0 when rank 0 says
stop and 1 on any error (a lost peer included), which rank 0 notices.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys

import torch

from plait.backend.config import EngineConfig
from plait.backend.host import set_process_name
from plait.backend.model.runner import ModelRunner
from plait.backend.parallel.comm import TPComm
from plait.backend.parallel.launch import (
    ENV_CONFIG,
    ENV_INIT,
    ENV_RANK,
    TensorParallel,
    rank_device,
)
from plait.backend.parallel.wire import recv_batch

log = logging.getLogger("plait.parallel")


def follow(runner: ModelRunner) -> None:
    """Run rank 0's batches through this rank's model until told to stop."""
    assert runner.parallel is not None
    comm = runner.parallel.comm
    with torch.inference_mode():
        while (batch := recv_batch(comm)) is not None:
            runner.run(batch)


def main() -> int:
    """The follower process: join the group, load, follow; the exit code."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rank = int(os.environ[ENV_RANK])
    set_process_name(f"plait-tp{rank}")
    logging.basicConfig(level=logging.INFO, format=f"[plait tp{rank}] %(levelname)s %(message)s")
    config = EngineConfig(**json.loads(os.environ[ENV_CONFIG]))
    torch.set_num_threads(config.num_threads)
    device = rank_device(config, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    comm = TPComm.init(
        rank=rank, world=config.tp, init_method=f"tcp://{os.environ[ENV_INIT]}", device=device
    )
    try:
        runner = ModelRunner(config, parallel=TensorParallel(comm=comm, procs=[]))
        follow(runner)
    except Exception:  # noqa: BLE001 - rank 0 notices the exit code / the broken group
        log.exception("rank %d failed", rank)
        return 1
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

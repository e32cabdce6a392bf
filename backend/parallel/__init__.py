"""Tensor parallelism over torch.distributed (`plait serve --tp N`, `Engine(tp=N)`).

Rank 0 runs the scheduler and broadcasts each step's batch (`wire.py`); the other ranks run
`follower.py`'s loop. Every rank holds a slice of each layer (`plan.py` says which, `shard.py`
cuts it, `layers.py` adds the collectives); `comm.py` is the process group handle and
`launch.py` starts and watches the ranks. docs/scale.md describes the whole.
"""

from plait.backend.parallel.comm import TPComm
from plait.backend.parallel.plan import ShardPlan, plan_shards

__all__ = ["ShardPlan", "TPComm", "plan_shards"]

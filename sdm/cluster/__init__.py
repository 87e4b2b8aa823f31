"""A store sharded across Ray workers: plan, build, serve (docs/cluster.md).

Modules, one concern each: :mod:`~sdm.cluster.planner` (the cost model, the sharding types
and the search, ``plan`` and the versioned ``Plan``), :mod:`~sdm.cluster.build` (per-worker
store directories cut from a store), :mod:`~sdm.cluster.sharded` (``ShardedStore``: split,
fan out, merge, fail cleanly), :mod:`~sdm.cluster.actor` (the Ray actor) and
:mod:`~sdm.cluster.errors`. Ray is needed only to serve (``pip install 'sdm[cluster]'``);
planning and building work without it.
"""

from sdm.cluster.build import build
from sdm.cluster.errors import CapacityError, PlanError, ShardUnavailableError
from sdm.cluster.planner import SHARDING_TYPES, CostModel, Plan, Shard, TablePlan, WorkerSpec, plan
from sdm.cluster.sharded import ShardedStore

__all__ = ["plan", "Plan", "TablePlan", "Shard", "WorkerSpec", "CostModel", "SHARDING_TYPES", "build",
           "ShardedStore", "PlanError", "CapacityError", "ShardUnavailableError"]

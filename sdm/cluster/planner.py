"""The sharding planner: which worker serves which rows and columns of which table.

A plan cuts every table into shards by one of four sharding types (TorchRec's names):

* ``table-wise``: one shard, the whole table, on one worker;
* ``row-wise``: the rows cut into one range of ``ceil(rows / N)`` per worker, ids remapped to
  the range;
* ``table-row-wise``: the rows cut into one range per worker of a single host
  (``workers_per_host`` workers);
* ``column-wise``: the columns cut into near-equal blocks on distinct workers. fp32 and fp16
  only: an int8 row carries one scale and bias for all its columns, so a block of it is no
  int8 row, and re-quantizing blocks would change the bits.

**Cost model.** A shard's cost is the time one batch of ``batch_size`` samples spends on it
(:meth:`CostModel.shard_cost_ns`), from quantities measured on a trace (or assumed uniform):
the rows the shard reads per batch (pooling x batch size x the share of distinct rows per
batch x the shard's share of the table's reads), the DRAM bytes of those served at the hit
rate, the device reads of the misses, and the bytes it returns over the network (pooled
``(B, width)`` float32 for table-wise and column-wise shards; the raw rows themselves for
row ranges, which the caller pools). A worker's cost is its shards' plus one Ray call per
batch. The hit rate is what a static cache of the table's hottest rows gets at the
cluster's DRAM fraction (``num_workers * dram_bytes / table bytes``): the trace's top rows'
share of its reads, or that fraction itself without a trace.

**Search.** Tables are sorted by table-wise cost; proposal ``m`` splits the ``m`` costliest
(each by the cheaper of row-wise and column-wise) and keeps the rest whole. Each proposal is
placed by TorchRec's greedy (the costliest shard first, onto the least-loaded worker that has
room and holds no other shard of its table). A plan is scored by its most loaded worker;
``search="greedy"`` keeps the best greedy placement. ``"refine"`` (the default) refines the
three best by moves and swaps of shards off the most loaded worker while that lowers it,
then splits whole tables off the most loaded worker while that lowers it; it starts from
the greedy's placements and only accepts what lowers the score, so it is never worse.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from functools import cached_property

import numpy as np

import sdm
from sdm.cluster.errors import CapacityError, PlanError

__all__ = ["SHARDING_TYPES", "PLAN_FORMAT", "PLAN_VERSION", "RAY_CALL_US", "WorkerSpec", "CostModel",
           "Shard", "TablePlan", "Plan", "plan", "shard_table_name"]

SHARDING_TYPES = ("table-wise", "row-wise", "table-row-wise", "column-wise")
PLAN_FORMAT = "sdm-shard-plan"
PLAN_VERSION = 1
#: Round trip of one Ray actor call carrying 1 KiB, p50, measured by ``bench/bench_cluster.py``
#: (its "Ray call" line: 1,467 and 1,473 us in two runs) on the 2-core AMD EPYC dev VM, Ray 2.60.
RAY_CALL_US = 1470.0
_DEFAULT_BATCH = 512  # TorchRec's planner default
_SPLIT_EPS = 0.05  # proposals stop splitting tables cheaper than this share of a worker's mean cost


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker holds. Every worker of a plan is alike.

    ``dram_bytes``: the DRAM row cache (sets the hit rate, never a capacity limit);
    ``scm_bytes`` / ``disk_bytes``: the SCM row files and the LMDB copy, each of which holds
    every row of the worker's shards; None means no limit (no SCM tier, or a disk that is
    large enough). A worker's shards must fit the smaller of the two.
    """

    dram_bytes: int = 64 << 20  # the DRAM cache of the sdm-nand / sdm-3dxp presets
    scm_bytes: int | None = None
    disk_bytes: int | None = None

    def __post_init__(self):
        for name in ("dram_bytes", "scm_bytes", "disk_bytes"):
            value = getattr(self, name)
            if value is None and name != "dram_bytes":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise PlanError(f"worker {name} must be an integer >= 0"
                                f"{'' if name == 'dram_bytes' else ' or None'}, got {value!r}")
            object.__setattr__(self, name, int(value))

    @property
    def capacity_bytes(self) -> float:
        """Row bytes one worker can hold (``inf`` without a limit)."""
        limits = [v for v in (self.scm_bytes, self.disk_bytes) if v is not None]
        return float(min(limits)) if limits else math.inf


@dataclass(frozen=True)
class CostModel:
    """The constants a shard's cost is computed from; units in the names.

    ``dram_gbps``: DRAM read bandwidth (``sdm.DEVICES["dram"]``, 51 GB/s, TorchRec's DDR
    figure too); ``network_gbps``: bytes back to the caller (TorchRec's cross-node 12.5 GB/s);
    ``ray_call_us``: one actor call per worker per batch (:data:`RAY_CALL_US`, measured);
    ``miss_device``: the ``sdm.DEVICES`` device under the DRAM cache, read ``queue_depth``
    at a time (16, as the hierarchy presets do).
    """

    dram_gbps: float = sdm.DEVICES["dram"].read_bandwidth_gbps
    network_gbps: float = 12.5
    ray_call_us: float = RAY_CALL_US
    miss_device: str = "nand-p4500"
    queue_depth: int = 16

    def __post_init__(self):
        for name in ("dram_gbps", "network_gbps", "ray_call_us"):
            value = getattr(self, name)
            positive = name != "ray_call_us"
            if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                    or value < 0 or (positive and value == 0)):
                raise PlanError(f"cost model {name} must be a finite number {'> 0' if positive else '>= 0'}, "
                                f"got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.miss_device not in sdm.DEVICES:
            raise PlanError(f"cost model miss_device {self.miss_device!r} is not one of {sorted(sdm.DEVICES)}")
        q = self.queue_depth
        if isinstance(q, bool) or not isinstance(q, int) or not 1 <= q <= 1024:
            raise PlanError(f"cost model queue_depth must be an integer in [1, 1024], got {q!r}")

    @cached_property
    def _miss(self) -> tuple[int, float]:
        """``miss_device``'s block bytes and time per block read at ``queue_depth``, ns."""
        device = sdm.DEVICES[self.miss_device]
        return device.access_bytes, 1e9 / device.iops(self.queue_depth)

    def shard_cost_ns(self, *, rows_read: float, row_bytes: int, hit_rate: float, out_bytes: float) -> float:
        """Time one batch spends on a shard: ``rows_read`` distinct rows of ``row_bytes``
        each, a ``hit_rate`` share served from DRAM and the rest read from ``miss_device``
        (every block a row spans), then ``out_bytes`` returned over the network."""
        block_bytes, read_ns = self._miss
        hits_ns = rows_read * hit_rate * row_bytes / self.dram_gbps
        reads_ns = rows_read * (1.0 - hit_rate) * -(-row_bytes // block_bytes) * read_ns
        return hits_ns + reads_ns + out_bytes / self.network_gbps


@dataclass(frozen=True)
class Shard:
    """Rows ``[rows[0], rows[1])`` and columns ``[columns[0], columns[1])`` of ``table``,
    served by ``worker``; ``cost_ns`` per batch and ``bytes`` held, as estimated."""

    table: str
    worker: int
    rows: tuple[int, int]
    columns: tuple[int, int]
    cost_ns: float
    bytes: int


@dataclass(frozen=True)
class TablePlan:
    """A table, its sharding type and its shards (in row or column order)."""

    spec: sdm.TableSpec
    sharding: str
    shards: tuple[Shard, ...]


def shard_table_name(index: int) -> str:
    """The name a shard's rows have in its worker's store: ``s<index>``, ``index`` its
    position in :attr:`Plan.shards`."""
    return f"s{index}"


@dataclass(frozen=True)
class Plan:
    """Where every shard of every table lives, with the estimates that chose it.

    ``greedy_score_ns`` is the TorchRec-style greedy's score on the same input (equal to
    :attr:`score_ns` for ``search="greedy"``).
    """

    tables: tuple[TablePlan, ...]
    num_workers: int
    worker: WorkerSpec
    cost_model: CostModel
    batch_size: int
    workers_per_host: int
    search: str
    greedy_score_ns: float

    @property
    def shards(self) -> tuple[Shard, ...]:
        """Every shard, tables in order and each table's shards in order (plan order)."""
        return tuple(s for t in self.tables for s in t.shards)

    def table(self, name: str) -> TablePlan:
        for t in self.tables:
            if t.spec.name == name:
                return t
        raise sdm.errors.UnknownTableError(f"table {name!r} is not in the plan; tables: "
                                           f"{[t.spec.name for t in self.tables]}")

    @property
    def worker_cost_ns(self) -> np.ndarray:
        """``(num_workers,) float64``: each worker's estimated time per batch, its Ray call
        included when it holds a shard."""
        cost = np.zeros(self.num_workers)
        for s in self.shards:
            cost[s.worker] += s.cost_ns
        return cost + np.where(self.worker_bytes > 0, self.cost_model.ray_call_us * 1e3, 0.0)

    @property
    def worker_bytes(self) -> np.ndarray:
        """``(num_workers,) int64``: row bytes each worker holds."""
        held = np.zeros(self.num_workers, dtype=np.int64)
        for s in self.shards:
            held[s.worker] += s.bytes
        return held

    @property
    def score_ns(self) -> float:
        """The most loaded worker's cost: what a batch waits for."""
        return float(self.worker_cost_ns.max())

    @property
    def balance(self) -> float:
        """Most loaded over mean worker cost (1.0 is perfect)."""
        cost = self.worker_cost_ns
        return float(cost.max() / cost.mean()) if cost.mean() > 0 else 1.0

    # -- JSON ------------------------------------------------------------------------

    def to_json(self) -> dict:
        """The plan as a JSON-ready dict, versioned (``format``, ``version``): per table its
        sharding type and shards (worker, row range, column range, cost, bytes), per worker
        its estimated cost and bytes."""
        cost, held = self.worker_cost_ns, self.worker_bytes
        return {
            "format": PLAN_FORMAT, "version": PLAN_VERSION,
            "num_workers": self.num_workers, "workers_per_host": self.workers_per_host,
            "batch_size": self.batch_size, "search": self.search,
            "worker": asdict(self.worker), "cost_model": asdict(self.cost_model),
            "score_ns": self.score_ns, "greedy_score_ns": self.greedy_score_ns, "balance": self.balance,
            "tables": [{"name": t.spec.name, "num_rows": t.spec.num_rows, "dim": t.spec.dim,
                        "fmt": t.spec.fmt, "sharding": t.sharding,
                        "shards": [{"worker": s.worker, "rows": list(s.rows), "columns": list(s.columns),
                                    "cost_ns": s.cost_ns, "bytes": s.bytes} for s in t.shards]}
                       for t in self.tables],
            "workers": [{"worker": w, "cost_ns": float(cost[w]), "bytes": int(held[w]),
                         "shards": sum(s.worker == w for s in self.shards)} for w in range(self.num_workers)],
        }

    @classmethod
    def from_json(cls, data) -> "Plan":
        """Rebuild a plan from :meth:`to_json`'s dict, checking it whole (PlanError naming
        the field otherwise). Derived figures (``workers``, ``score_ns``) are recomputed."""
        if not isinstance(data, Mapping) or data.get("format") != PLAN_FORMAT:
            raise PlanError(f"not an sdm shard plan (format {PLAN_FORMAT!r} expected)")
        if data.get("version") != PLAN_VERSION:
            raise PlanError(f"plan version {data.get('version')!r} is not supported; this sdm reads "
                            f"version {PLAN_VERSION}")
        try:
            num_workers = _count(data["num_workers"], "num_workers")
            per_host = _count(data["workers_per_host"], "workers_per_host")
            batch_size = _count(data["batch_size"], "batch_size")
            worker = WorkerSpec(**_fields(WorkerSpec, data["worker"], "worker"))
            model = CostModel(**_fields(CostModel, data["cost_model"], "cost_model"))
            search = data["search"]
            greedy = float(data["greedy_score_ns"])
            tables = tuple(_table_from_json(t, num_workers) for t in data["tables"])
        except KeyError as exc:
            raise PlanError(f"plan has no {exc.args[0]!r} field") from None
        except (TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, PlanError):
                raise
            raise PlanError(f"plan field of the wrong kind: {exc}") from None
        if search not in ("greedy", "refine"):
            raise PlanError(f"plan search {search!r} is not 'greedy' or 'refine'")
        if num_workers % per_host:
            raise PlanError(f"plan workers_per_host {per_host} does not divide num_workers {num_workers}")
        names = [t.spec.name for t in tables]
        if not tables or len(set(names)) != len(names):
            raise PlanError(f"plan tables must be a non-empty list of distinct tables, got {names}")
        return cls(tables, num_workers, worker, model, batch_size, per_host, search, greedy)

    def save(self, path) -> str:
        """Write the plan as JSON to ``path`` (a temporary file renamed into place)."""
        path = os.path.abspath(os.fspath(path))
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path) -> "Plan":
        """Read a plan :meth:`save` wrote (PlanError when it is missing, damaged or foreign)."""
        if not isinstance(path, (str, os.PathLike)):
            raise PlanError(f"plan path must be a str or os.PathLike, got {type(path).__name__}")
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise PlanError(f"cannot read a plan from {os.fspath(path)!r}: {exc}") from None
        return cls.from_json(data)


def _count(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise PlanError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def _fields(cls, data, what: str) -> dict:
    names = {f.name for f in fields(cls)}
    if not isinstance(data, Mapping) or set(data) != names:
        raise PlanError(f"plan {what} must hold exactly {sorted(names)}, got {data!r}")
    return dict(data)


def _table_from_json(data, num_workers: int) -> TablePlan:
    spec = sdm.TableSpec(data["name"], data["num_rows"], data["dim"], data["fmt"])
    sharding = data["sharding"]
    if sharding not in SHARDING_TYPES:
        raise PlanError(f"table {spec.name!r}: sharding {sharding!r} is not one of {SHARDING_TYPES}")
    shards = []
    for s in data["shards"]:
        rows, cols = tuple(s["rows"]), tuple(s["columns"])
        worker = s["worker"]
        if isinstance(worker, bool) or not isinstance(worker, int) or not 0 <= worker < num_workers:
            raise PlanError(f"table {spec.name!r}: shard worker {worker!r} is not in [0, {num_workers})")
        shards.append(Shard(spec.name, worker, (int(rows[0]), int(rows[1])), (int(cols[0]), int(cols[1])),
                            float(s["cost_ns"]), int(s["bytes"])))
    _check_cover(spec, sharding, shards)
    return TablePlan(spec, sharding, tuple(shards))


def _check_cover(spec: sdm.TableSpec, sharding: str, shards) -> None:
    """PlanError unless ``shards`` cut the table exactly as ``sharding`` says."""
    if not shards:
        raise PlanError(f"table {spec.name!r} has no shards")
    if len({s.worker for s in shards}) != len(shards):
        raise PlanError(f"table {spec.name!r}: two shards on one worker")
    by_rows = sharding != "column-wise"
    if sharding == "table-wise" and len(shards) != 1:
        raise PlanError(f"table {spec.name!r}: a table-wise table has one shard, got {len(shards)}")
    if sharding == "column-wise" and spec.fmt == "int8":
        raise PlanError(f"table {spec.name!r}: int8 tables cannot be sharded column-wise")
    cut, whole = ("rows", "columns") if by_rows else ("columns", "rows")
    size = {"rows": spec.num_rows, "columns": spec.dim}
    edge = 0
    for s in shards:
        lo, hi = getattr(s, cut)
        if lo != edge or hi <= lo:
            raise PlanError(f"table {spec.name!r}: shard {cut} {[lo, hi]} do not continue from {edge}")
        if getattr(s, whole) != (0, size[whole]):
            raise PlanError(f"table {spec.name!r}: a {sharding} shard spans all {whole} "
                            f"[0, {size[whole]}), got {list(getattr(s, whole))}")
        edge = hi
    if edge != size[cut]:
        raise PlanError(f"table {spec.name!r}: shards cover {cut} [0, {edge}) of [0, {size[cut]})")


# -- profiles --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Profile:
    """How one table is read per batch: ``pooling`` lookups per bag, ``unique`` the share of
    a batch's lookups that are distinct rows, ``hit_rate`` of those; ``ids`` (sorted) and
    ``cumulative`` (``len(ids) + 1``, per-batch-distinct reads) locate reads by row, None
    for uniform access."""

    pooling: float
    unique: float
    hit_rate: float
    ids: np.ndarray | None = None
    cumulative: np.ndarray | None = None

    def share(self, start: int, stop: int, num_rows: int) -> float:
        """The share of the table's reads that fall in rows ``[start, stop)``."""
        if self.ids is None:
            return (stop - start) / num_rows
        lo, hi = np.searchsorted(self.ids, (start, stop))
        return float(self.cumulative[hi] - self.cumulative[lo]) / max(1.0, float(self.cumulative[-1]))


def _profiles(specs, trace, pooling, cache_fraction: float, max_batches: int) -> tuple[list, int | None]:
    """One :class:`_Profile` per table, and the trace's batch size (None without a trace)."""
    names = [s.name for s in specs]
    pooling = dict(pooling or {})
    for name, value in pooling.items():
        if name not in names:
            raise PlanError(f"pooling names table {name!r}, which is not among the tables {names}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise PlanError(f"pooling of table {name!r} must be a number > 0, got {value!r}")
    if trace is None:
        return [_Profile(float(pooling.get(s.name, 1.0)), 1.0, cache_fraction) for s in specs], None
    trace = sdm.trace.load(trace) if isinstance(trace, (str, os.PathLike)) else trace
    sizes = np.asarray(getattr(trace, "table_sizes", None))
    if sizes.shape != (len(specs),) or not (sizes == [s.num_rows for s in specs]).all():
        raise PlanError(f"the trace's table sizes {sizes.tolist()} do not match the tables' rows "
                        f"{[s.num_rows for s in specs]}; trace table t is table t")
    seen = [[] for _ in specs]
    lookups = np.zeros(len(specs))
    bags = 0
    batch_size = None
    for i, batch in enumerate(trace):
        if i == max_batches:
            break
        batch_size = batch_size or batch.batch_size
        bags += batch.batch_size
        for t, ids in enumerate(batch.indices):
            lookups[t] += len(ids)
            seen[t].append(np.unique(ids))
    if not bags:
        raise PlanError("the trace holds no samples to profile")
    out = []
    for t, spec in enumerate(specs):
        ids, reads = np.unique(np.concatenate(seen[t]), return_counts=True)
        cumulative = np.concatenate(([0], np.cumsum(reads)))
        top = np.sort(reads)[::-1]
        cached = min(len(top), int(cache_fraction * spec.num_rows))
        hit = float(top[:cached].sum()) / max(1, int(top.sum()))
        out.append(_Profile(float(pooling.get(spec.name, lookups[t] / bags)),
                            float(cumulative[-1]) / max(1.0, lookups[t]), hit, ids, cumulative))
    return out, batch_size


# -- the planner -----------------------------------------------------------------------


def plan(tables, num_workers: int, *, trace=None, pooling: Mapping | None = None,
         batch_size: int | None = None, worker: WorkerSpec | None = None,
         cost_model: CostModel | None = None, workers_per_host: int | None = None,
         sharding: Mapping | None = None, search: str = "refine", max_batches: int = 64) -> Plan:
    """Plan how ``tables`` are sharded over ``num_workers`` workers (see the module doc).

    Args:
        tables: a list of :class:`sdm.TableSpec`, or the path of a store (its tables).
        num_workers: workers (Ray actors) to spread the tables over.
        trace: optional trace (path or :func:`sdm.trace.load` result) whose table ``t`` is
            ``tables[t]``: pooling, distinct rows, hit rate and where in a table reads fall
            are measured on its first ``max_batches`` batches.
        pooling: lookups per bag by table name (default: the trace's, else 1).
        batch_size: samples per batch (default: the trace's first batch, else 512).
        worker: each worker's capacities (default :class:`WorkerSpec`).
        cost_model: the constants of the cost model (default :class:`CostModel`).
        workers_per_host: workers per host for ``table-row-wise`` (default all on one host).
        sharding: sharding type by table name, forced (default: chosen by cost among
            table-wise, row-wise and column-wise; ``table-row-wise`` only when asked, since
            this cost model tells it from row-wise by nothing but its host).
        search: ``"refine"`` (default) or ``"greedy"`` (TorchRec-style, no refinement).

    Returns:
        A :class:`Plan`.

    Raises:
        PlanError: bad input (names the value and the limit).
        CapacityError: the tables cannot fit the workers; names the shortfall in bytes.
    """
    specs = _table_specs(tables)
    n = _count(num_workers, "num_workers")
    per_host = n if workers_per_host is None else _count(workers_per_host, "workers_per_host")
    if n % per_host:
        raise PlanError(f"workers_per_host {per_host} must divide num_workers {n}")
    worker = WorkerSpec() if worker is None else worker
    cost_model = CostModel() if cost_model is None else cost_model
    if not isinstance(worker, WorkerSpec) or not isinstance(cost_model, CostModel):
        raise PlanError("worker must be a sdm.cluster.WorkerSpec and cost_model a sdm.cluster.CostModel")
    if search not in ("greedy", "refine"):
        raise PlanError(f"search {search!r} is not 'greedy' or 'refine'")
    max_batches = _count(max_batches, "max_batches")
    forced = _forced(sharding, specs, n, per_host)
    total_bytes = sum(s.num_rows * s.row_bytes for s in specs)
    cache_fraction = min(1.0, n * worker.dram_bytes / total_bytes)
    profiles, trace_batch = _profiles(specs, trace, pooling, cache_fraction, max_batches)
    batch = _count(batch_size, "batch_size") if batch_size is not None else trace_batch or _DEFAULT_BATCH
    cap = worker.capacity_bytes
    if total_bytes > n * cap:
        raise CapacityError(f"the tables hold {total_bytes:,} bytes but {n} workers hold {int(n * cap):,} "
                            f"(short by {int(total_bytes - n * cap):,} bytes)",
                            shortfall_bytes=total_bytes - n * cap)

    options = [_options(spec, prof, n, per_host, batch, cost_model) for spec, prof in zip(specs, profiles)]
    kinds, pieces, assign, greedy_score = _search(specs, options, forced, n, per_host, cap, search)
    by_table = [[] for _ in specs]
    for (t, (rows, cols, cost, nbytes)), w in zip(pieces, assign):
        by_table[t].append(Shard(specs[t].name, int(w), rows, cols, float(cost), int(nbytes)))
    plans = tuple(TablePlan(spec, kinds[t], tuple(by_table[t])) for t, spec in enumerate(specs))
    return Plan(plans, n, worker, cost_model, batch, per_host, search, greedy_score + cost_model.ray_call_us * 1e3)


class _NoRoom(Exception):
    """A shard found no worker with room: ``(table, piece, most free bytes)``."""


def _search(specs, options, forced, n: int, per_host: int, cap: float, search: str):
    """Choose every table's sharding type and every shard's worker (the module doc's
    search). Returns ``(kinds, pieces, workers, greedy score)``: a type per table, the
    ``(table, (rows, cols, cost, bytes))`` shards, a ``(P,)`` worker per shard, and the best
    greedy placement's score without the Ray call."""
    whole = np.array([opt["table-wise"][0][2] for opt in options])
    choices = []  # per table: (its type in proposals that keep it whole, its type when split)
    for t in range(len(specs)):
        if t in forced:
            choices.append((forced[t], forced[t]))
            continue
        splits = [k for k in ("row-wise", "column-wise") if k in options[t]] or ["table-wise"]
        split = min(splits, key=lambda k: (sum(p[2] for p in options[t][k]), -len(options[t][k])))
        choices.append(("table-wise" if options[t]["table-wise"][0][3] <= cap else split, split))
    order = [t for t in np.argsort(-whole, kind="stable") if t not in forced and choices[t][0] == "table-wise"]
    proposals = []
    for m in _proposal_sizes(len(order)):
        if 0 < m < len(order) and whole[order[m - 1]] <= _SPLIT_EPS * whole.sum() / n:
            continue  # splitting tables this cheap buys no balance
        split = set(order[:m])
        proposals.append([choices[t][1] if t in split else choices[t][0] for t in range(len(specs))])

    failures = []

    def place(kinds, refine):
        pieces = [(t, p) for t, k in enumerate(kinds) for p in options[t][k]]
        try:
            assign = _greedy(pieces, n, per_host, cap, kinds)
        except _NoRoom as exc:
            failures.append(exc.args)
            return None
        if refine:
            assign = _refine(pieces, assign, n, per_host, cap, kinds)
        return _score(pieces, assign, n), kinds, pieces, assign

    placed = sorted(filter(None, (place(kinds, False) for kinds in proposals)), key=lambda x: x[0])
    if not placed:
        t, p, free = failures[-1]
        raise CapacityError(f"table {specs[t].name!r}: a shard of rows {list(p[0])} columns {list(p[1])} "
                            f"needs {p[3]:,} bytes but no worker it may go to has more than {int(free):,} "
                            f"free (short by {int(p[3] - free):,} bytes)",
                            shortfall_bytes=p[3] - free, table=specs[t].name)
    best = placed[0]
    if search == "refine":
        best = min((place(x[1], True) for x in placed[:3]), key=lambda x: x[0])
        while True:  # split whole tables off the most loaded worker while that lowers it
            trials = filter(None, (place(kinds, True) for kinds in _bottleneck_splits(best, choices, n)[:2]))
            better = next((x for x in trials if x[0] < best[0]), None)
            if better is None:
                break
            best = better
    _, kinds, pieces, assign = best
    return kinds, pieces, assign, placed[0][0]


def _table_specs(tables) -> list:
    if isinstance(tables, (str, os.PathLike)):
        with sdm.Store.open(tables, config="ssd", readonly=True) as store:
            return list(store.tables.values())
    if isinstance(tables, Mapping) or not hasattr(tables, "__iter__"):
        raise PlanError(f"tables must be a list of sdm.TableSpec or a store path, got {type(tables).__name__}")
    specs = list(tables)
    if not specs or not all(isinstance(s, sdm.TableSpec) for s in specs):
        raise PlanError("tables must be a non-empty list of sdm.TableSpec")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise PlanError(f"table names must be distinct, got {names}")
    return specs


def _forced(sharding, specs, n: int, per_host: int) -> dict:
    """Table index -> the sharding type the caller asked for."""
    out = {}
    index = {s.name: i for i, s in enumerate(specs)}
    for name, kind in dict(sharding or {}).items():
        if name not in index:
            raise PlanError(f"sharding names table {name!r}, which is not among the tables {list(index)}")
        if kind not in SHARDING_TYPES:
            raise PlanError(f"sharding of table {name!r}: {kind!r} is not one of {SHARDING_TYPES}")
        spec = specs[index[name]]
        if kind == "column-wise" and spec.fmt == "int8":
            raise PlanError(f"table {name!r} is int8, which cannot be sharded column-wise: its rows "
                            f"carry one scale and bias for all columns (use row-wise)")
        if kind == "column-wise" and (spec.dim < 2 or n < 2):
            raise PlanError(f"table {name!r}: column-wise needs dim >= 2 and 2+ workers, "
                            f"got dim {spec.dim} on {n} workers")
        if kind in ("row-wise", "table-row-wise") and (spec.num_rows < 2 or n < 2):
            raise PlanError(f"table {name!r}: {kind} needs 2+ rows and 2+ workers")
        if kind == "table-row-wise" and per_host < 2:
            raise PlanError(f"table {name!r}: table-row-wise needs 2+ workers per host, got {per_host}")
        out[index[name]] = kind
    return out


def _options(spec, prof: _Profile, n: int, per_host: int, batch: int, model: CostModel) -> dict:
    """Sharding type -> its shards as ``(rows, cols, cost_ns, bytes)``, for each type the
    table can take."""
    whole_rb = spec.row_bytes

    def piece(rows, cols, raw_rows):
        width = cols[1] - cols[0]
        rb = whole_rb if width == spec.dim else sdm.row_bytes(spec.fmt, width)
        share = prof.share(*rows, spec.num_rows) if raw_rows else 1.0
        read = batch * prof.pooling * prof.unique * share
        out = read * rb if raw_rows else batch * width * 4
        cost = model.shard_cost_ns(rows_read=read, row_bytes=rb, hit_rate=prof.hit_rate, out_bytes=out)
        return rows, cols, cost, (rows[1] - rows[0]) * rb

    everything = ((0, spec.num_rows), (0, spec.dim))
    out = {"table-wise": [piece(*everything, False)]}
    if n >= 2 and spec.num_rows >= 2:
        for kind, k in (("row-wise", n), ("table-row-wise", per_host)):
            if k >= 2:
                step = -(-spec.num_rows // k)
                out[kind] = [piece((a, min(a + step, spec.num_rows)), everything[1], True)
                             for a in range(0, spec.num_rows, step)]
    k = min(n, spec.dim)
    if spec.fmt != "int8" and k >= 2:
        edges = [round(j * spec.dim / k) for j in range(k + 1)]
        out["column-wise"] = [piece(everything[0], (a, b), False) for a, b in zip(edges, edges[1:])]
    return out


def _proposal_sizes(count: int) -> list[int]:
    """How many of the costliest tables each proposal splits: 0, 1, 2, 3, 4, 6, 8, 11, ...
    (about x1.4 apart, so a few dozen proposals cover 128 tables)."""
    sizes, m = [0], 1
    while m < count:
        sizes.append(m)
        m = max(m + 1, int(m * 1.4))
    return sizes + [count] if count else sizes


def _greedy(pieces, n: int, per_host: int, cap: float, kinds):
    """TorchRec's greedy partitioner: costliest shard first onto the least-loaded worker that
    has room and holds no other shard of its table (and, for table-row-wise, is on the same
    host as the table's first shard). Returns ``(P,) int64`` workers; raises _NoRoom for
    the first shard that finds no room."""
    load = [0.0] * n
    used = [0.0] * n
    taken = {t: [False] * n for t, _ in pieces}
    host_of: dict[int, int] = {}
    assign = np.empty(len(pieces), dtype=np.int64)
    for i in sorted(range(len(pieces)), key=lambda i: (-pieces[i][1][2], -pieces[i][1][3], i)):
        t, (_, _, cost, size) = pieces[i]
        mine, host = taken[t], host_of.get(t)
        allowed = [w for w in range(n) if not mine[w] and (host is None or w // per_host == host)]
        fits = [w for w in allowed if used[w] + size <= cap]
        if not fits:
            raise _NoRoom(t, pieces[i][1], max((cap - used[w] for w in allowed), default=0.0))
        w = min(fits, key=load.__getitem__)
        assign[i] = w
        load[w] += cost
        used[w] += size
        mine[w] = True
        if kinds[t] == "table-row-wise":
            host_of[t] = w // per_host
    return assign


def _refine(pieces, assign, n: int, per_host: int, cap: float, kinds) -> np.ndarray:
    """Lower the most loaded worker by the best single move or swap of a shard, while one
    lowers it (every step lowers the sum of squared loads, so this ends); the constraints of
    :func:`_greedy` hold throughout."""
    assign = assign.copy()
    table = np.array([t for t, _ in pieces])
    cost = np.array([p[2] for _, p in pieces])
    size = np.array([p[3] for _, p in pieces], dtype=float)
    locked = np.array([kinds[t] == "table-row-wise" for t in table])
    hosts = np.arange(n) // per_host
    load = np.bincount(assign, weights=cost, minlength=n)
    used = np.bincount(assign, weights=size, minlength=n)
    holds = np.zeros((table.max() + 1, n), dtype=bool)
    holds[table, assign] = True
    for _ in range(20 * len(pieces)):
        m = int(np.argmax(load))
        top = load[m]
        a = np.flatnonzero(assign == m)
        # moves: piece a[i] -> worker w
        ok = ~holds[table[a]] & (used[None, :] + size[a, None] <= cap)
        ok &= ~locked[a, None] | (hosts[None, :] == hosts[m])
        ok[:, m] = False
        after = np.where(ok, np.maximum(load[None, :] + cost[a, None], top - cost[a, None]), np.inf)
        i, w = np.unravel_index(np.argmin(after), after.shape)
        best, step = after[i, w], ("move", a[i], w)
        # swaps: piece a[i] on m <-> piece b on another worker, b cheaper
        wb = assign[None, :]
        same = table[None, :] == table[a, None]
        ok = (wb != m) & (cost[None, :] < cost[a, None])
        ok &= (~holds[table[a]][:, assign] | same) & (~holds[table, m][None, :] | same)
        ok &= used[wb] - size[None, :] + size[a, None] <= cap
        ok &= used[m] - size[a, None] + size[None, :] <= cap
        ok &= ~(locked[a, None] | locked[None, :]) | (hosts[wb] == hosts[m])
        after = np.where(ok, np.maximum(load[wb] - cost[None, :] + cost[a, None],
                                        top - cost[a, None] + cost[None, :]), np.inf)
        i, j = np.unravel_index(np.argmin(after), after.shape)
        if after[i, j] < best:
            best, step = after[i, j], ("swap", a[i], j)
        if not best < top * (1 - 1e-12):
            break
        moves = [(step[1], step[2])] if step[0] == "move" else [(step[1], assign[step[2]]), (step[2], m)]
        for p, w in moves:
            old = assign[p]
            load[old] -= cost[p]
            used[old] -= size[p]
            holds[table[p], old] = False
        for p, w in moves:
            assign[p] = w
            load[w] += cost[p]
            used[w] += size[p]
            holds[table[p], w] = True
    return assign


def _bottleneck_splits(placed, choices, n: int) -> list:
    """Proposals that split one table kept whole on the most loaded worker, costliest first."""
    _, kinds, pieces, assign = placed
    load = np.bincount(assign, weights=[p[2] for _, p in pieces], minlength=n)
    top = int(np.argmax(load))
    whole = sorted(((p[2], t) for (t, p), w in zip(pieces, assign)
                    if w == top and kinds[t] == "table-wise" and choices[t][1] != "table-wise"), reverse=True)
    return [[choices[t][1] if i == t else k for i, k in enumerate(kinds)] for _, t in whole]


def _score(pieces, assign, n: int) -> float:
    """The most loaded worker's shard cost (without the Ray call every worker pays)."""
    return float(np.bincount(assign, weights=[p[2] for _, p in pieces], minlength=n).max())

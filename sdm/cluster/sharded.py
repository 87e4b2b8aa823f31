"""``ShardedStore``: a store whose tables are sharded over Ray actors, one per worker.

Each batch is split by the plan into one call per worker holding any of its rows, all
submitted at once, and the answers are merged:

* table-wise: the owner pools its bags; the result is taken as it comes;
* column-wise: every block's owner pools the same bags over its columns; the blocks are
  concatenated (a column's sum never depends on the other columns, so this is bitwise);
* row-wise and table-row-wise: each owner returns the raw rows of the batch's distinct ids in
  its range; they are gathered in id order and pooled here with :func:`sdm.embedding_bag`,
  bag by bag in the caller's order, which is how one host pools them, so the result is
  bitwise equal. (No partial-sum mode is offered: sums of per-shard partial sums are added
  in another order and are not bitwise.)

A call returns the complete result or raises :class:`ShardUnavailableError` naming the
shards that did not answer by its deadline; it never returns partial or zero-filled rows.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping

import numpy as np

import sdm
from sdm.cluster.build import PLAN_FILE, build, check_plan, worker_dir
from sdm.cluster.errors import PlanError, ShardUnavailableError
from sdm.cluster.planner import Plan, shard_table_name
from sdm.kernels.pooling import check_weights

__all__ = ["ShardedStore"]

_BY_ROWS = ("row-wise", "table-row-wise")
# Bag sizes a warm-up pools: one lookup (the serial kernels) and enough for the parallel ones.
_WARM_LOOKUPS = (1, 4096)


def _ray():
    try:
        import ray
    except ImportError:
        raise ImportError("sdm.cluster.ShardedStore needs Ray: pip install 'sdm[cluster]' "
                          "(ray==2.60.0)") from None
    return ray


class ShardedStore:
    """A store sharded over Ray actors, with the batch API of :class:`sdm.Store`.

    Make one with :meth:`launch`; use it as a context manager or call :meth:`close`.
    ``actors`` lists the actor handles in plan order (worker number), one per worker that
    holds a shard; ``workers`` their worker numbers.
    """

    def __init__(self, plan: Plan, workers: list[int], actors: list, *, timeout_s: float,
                 shard_dir: str, owned_dir: bool, owned_ray: bool):
        self.plan = plan
        self.workers = workers
        self.actors = actors
        self.timeout_s = timeout_s
        self.shard_dir = shard_dir
        self._owned_dir = owned_dir
        self._owned_ray = owned_ray
        self._actor = dict(zip(workers, actors))
        self._routes = {}
        index = 0
        for t in plan.tables:
            self._routes[t.spec.name] = (t, [(shard_table_name(index + i), s) for i, s in enumerate(t.shards)])
            index += len(t.shards)
        self._batches = 0
        self._closed = False

    @classmethod
    def launch(cls, store_path, plan, *, shards=None, config=None, num_cpus: int = 2,
               address: str | None = None, timeout_s: float = 10.0, max_restarts: int = -1,
               threads: int = 1, start_timeout_s: float = 300.0) -> "ShardedStore":
        """Start one actor per worker of ``plan`` over the shards of the store at
        ``store_path``.

        Args:
            store_path: the single-host store the shards are cut from.
            plan: a :class:`~sdm.cluster.planner.Plan` or the path of a plan file.
            shards: a shard directory (:func:`sdm.cluster.build.build`): used when it exists
                (it must have been built by this plan), built there when not. Default: built
                in a temporary directory removed by :meth:`close`.
            config: the hierarchy every actor opens its store with (preset name, TOML path or
                a :class:`HierarchyConfig`), as for :meth:`sdm.Store.open`.
            num_cpus: CPUs of the local Ray cluster started when none is running (and no
                ``address`` is given); :meth:`close` stops a cluster it started.
            address: an existing Ray cluster to connect to instead (its nodes must see the
                shard directory at the same path).
            timeout_s: the deadline of every call, seconds (each call may pass its own).
            max_restarts: restarts Ray allows each actor (-1: no limit).
            threads: Numba threads each actor pools with (default 1: the actors, which
                reserve no Ray CPU, are the parallelism; more for one actor per node).
            start_timeout_s: how long the actors may take to open their stores.

        Raises:
            PlanError: the plan does not match the store, or ``shards`` holds another plan.
            ShardUnavailableError: an actor did not start within ``start_timeout_s``.
        """
        ray = _ray()
        plan = plan if isinstance(plan, Plan) else Plan.load(plan)
        timeout_s = _seconds(timeout_s, "timeout_s")
        start_timeout_s = _seconds(start_timeout_s, "start_timeout_s")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < -1:
            raise sdm.errors.InvalidArgumentError(f"max_restarts must be an integer >= -1, got {max_restarts!r}")
        for name, value in (("threads", threads), ("num_cpus", num_cpus)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise sdm.errors.InvalidArgumentError(f"{name} must be an integer >= 1, got {value!r}")
        with sdm.Store.open(store_path, config="ssd", readonly=True) as src:
            check_plan(plan, src.tables)
        owned_dir = shards is None
        shard_dir = (os.path.join(tempfile.mkdtemp(prefix="sdm-shards-"), "shards") if owned_dir
                     else os.path.abspath(os.fspath(shards)))
        try:
            if not os.path.exists(shard_dir):
                build(store_path, plan, shard_dir)
            elif Plan.load(os.path.join(shard_dir, PLAN_FILE)).to_json() != plan.to_json():
                raise PlanError(f"shard directory {shard_dir} was built for another plan")
            owned_ray = not ray.is_initialized()
            if owned_ray:
                if address is None:
                    ray.init(num_cpus=num_cpus, include_dashboard=False)
                else:
                    ray.init(address=address)
        except BaseException:
            if owned_dir:
                shutil.rmtree(os.path.dirname(shard_dir), ignore_errors=True)
            raise
        from sdm.cluster.actor import ShardActor

        workers = sorted({s.worker for s in plan.shards})
        options = dict(max_restarts=max_restarts, max_task_retries=0, num_cpus=0,
                       runtime_env={"env_vars": {"NUMBA_NUM_THREADS": str(threads)}})
        actors = [ShardActor.options(**options).remote(w, worker_dir(shard_dir, w), config) for w in workers]
        store = cls(plan, workers, actors, timeout_s=timeout_s, shard_dir=shard_dir,
                    owned_dir=owned_dir, owned_ray=owned_ray)
        try:
            store._warm(start_timeout_s)
        except BaseException:
            store.close()
            raise
        return store

    def _warm(self, timeout_s: float) -> None:
        """Serve small and large, plain and weighted bags of every table once, on every
        actor and in the merge here, so no batch with a deadline waits for Numba to compile
        (or load) a kernel. One actor goes first: when Numba's cache is cold (after any edit
        to sdm) it compiles the kernels once and the others load them."""
        bags = [(np.zeros(n, dtype=np.int64), np.array([0, n])) + weights
                for n in _WARM_LOOKUPS for weights in ((), (np.ones(n, dtype=np.float32),))]
        for group in (self.workers[:1], self.workers[1:]):
            self._call({w: ("warm", (bags,)) for w in group}, timeout_s)
        for fmt in {t.spec.fmt for t in self.plan.tables if t.sharding in _BY_ROWS}:
            table = _typed(np.zeros((1, sdm.row_bytes(fmt, 1)), dtype=np.uint8), fmt)
            for ids, offsets, *weights in bags:
                sdm.embedding_bag(table, ids, offsets, fmt=fmt, dim=1, per_sample_weights=next(iter(weights), None))

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Stop the actors, remove a temporary shard directory, stop a Ray cluster that
        :meth:`launch` started. Further calls raise StoreError."""
        if self._closed:
            return
        self._closed = True
        ray = _ray()
        if ray.is_initialized():
            for actor in self.actors:
                ray.kill(actor, no_restart=True)
        if self._owned_ray:
            ray.shutdown()
        if self._owned_dir:
            shutil.rmtree(os.path.dirname(self.shard_dir), ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"ShardedStore(tables={list(self.tables)}, workers={self.workers})"

    @property
    def tables(self) -> dict[str, sdm.TableSpec]:
        """Table specs by name, in plan order."""
        return {t.spec.name: t.spec for t in self.plan.tables}

    # -- lookups ---------------------------------------------------------------------

    def lookup(self, name: str, ids, *, timeout_s: float | None = None) -> np.ndarray:
        """Rows ``ids`` of table ``name``, ``(n,)`` ints -> ``(n, dim) float32``, as
        :meth:`sdm.Store.lookup`."""
        table, routes = self._route(name)
        ids = _check_ids(ids, table.spec.num_rows, f"id of table {name!r}")
        unique, inverse = np.unique(ids, return_inverse=True)
        work = {}
        parts = self._cut_rows(table, routes, unique, work)
        answers = self._call({w: ("serve", ({}, rows, "sum")) for w, rows in work.items()}, timeout_s)
        spec = table.spec
        if table.sharding == "column-wise":
            blocks = [sdm.dequantize_rows(answers[s.worker][1][key], spec.fmt, s.columns[1] - s.columns[0])
                      for key, s in routes]
            return np.concatenate(blocks, axis=1)[inverse]
        return sdm.dequantize_rows(self._gather_rows(spec, parts, answers), spec.fmt, spec.dim)[inverse]

    def embedding_bag(self, name: str, indices, offsets, *, mode: str = "sum", per_sample_weights=None,
                      timeout_s: float | None = None) -> np.ndarray:
        """Pool rows of table ``name`` per bag, as :meth:`sdm.Store.embedding_bag`:
        ``(nnz,)`` indices, ``(B + 1,)`` offsets -> ``(B, dim) float32``."""
        request = (indices, offsets) if per_sample_weights is None else (indices, offsets, per_sample_weights)
        return self.embedding_bags({name: request}, mode=mode, timeout_s=timeout_s)[name]

    def embedding_bags(self, requests: Mapping[str, tuple], *, mode: str = "sum",
                       timeout_s: float | None = None) -> dict[str, np.ndarray]:
        """Pool one batch over several tables, as :meth:`sdm.Store.embedding_bags`:
        ``{name: (indices, offsets[, per_sample_weights])}`` -> ``{name: (B, dim) float32}``,
        bitwise equal to one host's answer. Every request is validated before any is sent;
        every worker gets one call.

        Raises:
            UnknownTableError, IdOutOfRangeError, InvalidOffsetsError, InvalidArgumentError:
                bad requests (nothing is sent).
            ShardUnavailableError: shards that did not answer by the deadline.
        """
        if mode not in ("sum", "mean"):
            raise sdm.errors.InvalidArgumentError(f"mode {mode!r} is not one of ('sum', 'mean')")
        checked = self._check_requests(requests)
        work: dict[int, tuple[dict, dict]] = {}
        merges = []
        for name, (table, routes), indices, offsets, weights in checked:
            if table.sharding in _BY_ROWS:
                unique, inverse = np.unique(indices, return_inverse=True)
                rows = {}
                parts = self._cut_rows(table, routes, unique, rows)
                for w, request in rows.items():
                    work.setdefault(w, ({}, {}))[1].update(request)
                merges.append((name, table, routes, parts, (inverse, offsets, weights)))
                continue
            request = (indices, offsets) if weights is None else (indices, offsets, weights)
            for key, s in routes:
                work.setdefault(s.worker, ({}, {}))[0][key] = request
            merges.append((name, table, routes, None, None))
        answers = self._call({w: ("serve", (bags, rows, mode)) for w, (bags, rows) in work.items()}, timeout_s)
        self._batches += 1
        out = {}
        for name, table, routes, parts, bag in merges:
            if parts is None:
                blocks = [answers[s.worker][0][key] for key, s in routes]
                out[name] = blocks[0].copy() if len(blocks) == 1 else np.concatenate(blocks, axis=1)
                continue
            spec = table.spec
            raw = self._gather_rows(spec, parts, answers)
            inverse, offsets, weights = bag
            out[name] = sdm.embedding_bag(_typed(raw, spec.fmt), inverse, offsets, fmt=spec.fmt, dim=spec.dim,
                                          mode=mode, per_sample_weights=weights)
        return out

    # -- writes ------------------------------------------------------------------------

    def update_rows(self, name: str, ids, rows, *, timeout_s: float | None = None) -> dict[int, int]:
        """Replace rows ``ids`` (``(n,)`` distinct) of table ``name`` with ``rows`` (``(n,
        dim)`` floats), on the shards that own them: each shard applies its part atomically
        (:meth:`sdm.Store.update_rows`). Writes are not retried.

        Returns:
            ``{worker: version}``: the new version of every shard written.

        Raises:
            The errors of :meth:`sdm.Store.update_rows` for bad input (checked here before
            any shard is written), and ShardUnavailableError when a shard fails or does not
            answer: its ``workers`` did not confirm the update (each applied all of its part
            or none); the other shards applied theirs.
        """
        table, routes = self._route(name)
        spec = table.spec
        ids = _check_ids(ids, spec.num_rows, f"id of table {name!r}")
        try:
            rows = np.asarray(rows)
        except (ValueError, TypeError) as exc:
            raise sdm.errors.InvalidArgumentError(f"rows of table {name!r} are not a 2-D array: {exc}") from None
        if rows.ndim != 2 or rows.shape != (len(ids), spec.dim):
            raise sdm.errors.InvalidArgumentError(
                f"update of table {name!r}: rows must have shape ({len(ids)}, {spec.dim}), got {rows.shape}")
        if len(np.unique(ids)) != len(ids):
            raise sdm.errors.InvalidArgumentError(f"update of table {name!r}: an id is given more than once")
        sdm.quantize_rows(rows, spec.fmt)  # refuses what the shards would (NaN, out of range)
        rows = rows.astype(np.float32)
        work = {}
        for key, s in routes:
            mine = (ids >= s.rows[0]) & (ids < s.rows[1])
            if mine.any():
                work[s.worker] = {key: (ids[mine] - s.rows[0], rows[mine, s.columns[0]:s.columns[1]])}
        return self._call({w: ("update", (u,)) for w, u in work.items()}, timeout_s)

    def stats(self, *, timeout_s: float | None = None) -> dict:
        """Counters of every shard and their sum.

        ``shards``: one dict per worker in plan order, its store's :meth:`sdm.Store.stats`
        (``version``, ``lookups``, ``tiers``...) with ``worker``, ``path`` and ``restarted``;
        ``versions``: ``{worker: version}``; ``lookups``: the shards' total; ``batches``:
        batches this client served; ``tiers``: per tier (fast to slow) the shards' numeric
        counters summed. A shard's counters include the warm-up bags :meth:`launch` served."""
        answers = self._call({w: ("stats", ()) for w in self.workers}, timeout_s)
        shards = [answers[w] for w in self.workers]
        return {"workers": len(shards), "batches": self._batches,
                "lookups": sum(s["lookups"] for s in shards),
                "versions": {s["worker"]: s["version"] for s in shards},
                "tiers": _sum_tiers([s["tiers"] for s in shards]), "shards": shards}

    # -- routing -----------------------------------------------------------------------

    def _route(self, name):
        if self._closed:
            raise sdm.errors.StoreError("this sharded store is closed")
        route = self._routes.get(name) if isinstance(name, str) else None
        if route is None:
            raise sdm.errors.UnknownTableError(f"table {name!r} is not in the store; tables: {list(self.tables)}")
        return route

    def _check_requests(self, requests) -> list:
        if not isinstance(requests, Mapping):
            raise sdm.errors.InvalidArgumentError(
                f"requests must be a mapping of table name to (indices, offsets), got {type(requests).__name__}")
        checked = []
        for name, request in requests.items():
            route = self._route(name)
            if not isinstance(request, (tuple, list)) or len(request) not in (2, 3):
                raise sdm.errors.InvalidArgumentError(
                    f"request for table {name!r} must be (indices, offsets) or (indices, offsets, per_sample_weights)")
            indices = _check_ids(request[0], route[0].spec.num_rows, f"index of table {name!r}")
            offsets = _check_offsets(request[1], len(indices))
            weights = _check_weights(request[2] if len(request) == 3 else None, len(indices))
            checked.append((name, route, indices, offsets, weights))
        return checked

    @staticmethod
    def _cut_rows(table, routes, unique, work) -> list:
        """Ask every shard holding some of the sorted distinct ids ``unique`` for them (in
        its own numbering): ``work[worker][key] = ids``. Returns ``(key, worker)`` of the
        shards asked, in id order (every shard, with all ids, for column blocks)."""
        if table.sharding not in _BY_ROWS:
            for key, s in routes:
                work.setdefault(s.worker, {})[key] = unique
            return [(key, s.worker) for key, s in routes]
        parts = []
        cuts = np.searchsorted(unique, [s.rows[0] for _, s in routes] + [table.spec.num_rows])
        for (key, s), lo, hi in zip(routes, cuts, cuts[1:]):
            if hi > lo:
                work.setdefault(s.worker, {})[key] = unique[lo:hi] - s.rows[0]
                parts.append((key, s.worker))
        return parts

    @staticmethod
    def _gather_rows(spec, parts, answers) -> np.ndarray:
        """The raw rows of every part, concatenated in id order: ``(n, row_bytes) uint8``."""
        if not parts:
            return np.empty((0, spec.row_bytes), dtype=np.uint8)
        return np.concatenate([answers[w][1][key] for key, w in parts])

    def _call(self, calls: dict, timeout_s) -> dict:
        """Run ``{worker: (method, args)}`` on the actors at once; ``{worker: result}`` once
        every one answered, else ShardUnavailableError naming the rest by the deadline."""
        if self._closed:
            raise sdm.errors.StoreError("this sharded store is closed")
        if not calls:
            return {}
        ray = _ray()
        timeout_s = self.timeout_s if timeout_s is None else _seconds(timeout_s, "timeout_s")
        refs = {w: getattr(self._actor[w], method).remote(*args) for w, (method, args) in calls.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        ready = set(ready)
        out, failed = {}, {}
        for w, ref in refs.items():
            if ref not in ready:
                failed[w] = f"no answer within {timeout_s:g} s"
                continue
            try:
                out[w] = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                failed[w] = f"actor gone ({type(exc).__name__})"
            except ray.exceptions.RayTaskError as exc:
                if isinstance(exc.cause, sdm.errors.SdmError):
                    raise exc.cause from None
                raise
        if failed:
            names = ", ".join(f"worker {w} ({why})" for w, why in sorted(failed.items()))
            done = f"; workers {sorted(out)} answered" if out else ""
            raise ShardUnavailableError(f"shards unavailable: {names}{done}", workers=sorted(failed),
                                        reasons=failed)
        return out


def _typed(raw: np.ndarray, fmt: str) -> np.ndarray:
    """Raw ``(n, row_bytes) uint8`` rows as the table :func:`sdm.embedding_bag` takes."""
    return raw.view(np.float32) if fmt == "fp32" else raw.view(np.float16) if fmt == "fp16" else raw


def _sum_tiers(per_shard: list) -> list:
    """Per tier position (fast to slow): the shards' counters summed, read amplification
    recomputed from the sums; names and settings (``queue_depth``) from the first shard."""
    out = []
    for tiers in zip(*per_shard):
        merged = {}
        for key, value in tiers[0].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "queue_depth":
                merged[key] = sum(t.get(key, 0) for t in tiers)
            elif not isinstance(value, (list, dict)):  # lists (damage) stay in each shard's stats
                merged[key] = value
        if "read_amplification" in merged:
            useful = merged.get("useful_bytes", 0)
            merged["read_amplification"] = merged.get("bytes_read", 0) / useful if useful else 0.0
        out.append(merged)
    return out


def _seconds(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise sdm.errors.InvalidArgumentError(f"{what} must be a number of seconds > 0, got {value!r}")
    return float(value)


def _array(values, what: str, error) -> np.ndarray:
    try:
        return np.asarray(values)
    except (ValueError, TypeError) as exc:
        raise error(f"{what} must be a 1-D array, got a ragged {type(values).__name__}: {exc}") from None


def _check_ids(ids, num_rows: int, what: str) -> np.ndarray:
    """``(n,)`` int64 ids in ``[0, num_rows)``, else the typed error Store raises."""
    ids = _array(ids, what, sdm.errors.InvalidArgumentError)
    if ids.ndim != 1:
        raise sdm.errors.InvalidArgumentError(f"{what} must be 1-D, got shape {ids.shape}")
    if ids.size == 0 and ids.dtype == np.float64:  # np.asarray([])
        return np.empty(0, dtype=np.int64)
    if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
        raise sdm.errors.InvalidArgumentError(f"{what} must have an integer dtype, got {ids.dtype}")
    if ids.size:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= num_rows:
            bad = lo if lo < 0 else hi
            raise sdm.errors.IdOutOfRangeError(f"{what} {bad} is out of range for a table of {num_rows} rows "
                                               f"(valid: [0, {num_rows}))")
    return ids.astype(np.int64, copy=False)


def _check_offsets(offsets, nnz: int) -> np.ndarray:
    """``(B + 1,)`` int64 CSR offsets over ``nnz`` indices, else InvalidOffsetsError."""
    error = sdm.errors.InvalidOffsetsError
    offsets = _array(offsets, "offsets", error)
    if offsets.ndim != 1 or offsets.size == 0:
        raise error(f"offsets must be 1-D with B + 1 >= 1 entries, got shape {offsets.shape}")
    if offsets.dtype == np.bool_ or not np.issubdtype(offsets.dtype, np.integer):
        raise error(f"offsets must have an integer dtype, got {offsets.dtype}")
    offsets = offsets.astype(np.int64)
    if offsets[0] != 0 or offsets[-1] != nnz:
        raise error(f"offsets must start at 0 and end at len(indices) = {nnz}, "
                    f"got {int(offsets[0])} .. {int(offsets[-1])}")
    if (np.diff(offsets) < 0).any():
        raise error("offsets must be non-decreasing")
    return offsets


def _check_weights(weights, nnz: int) -> np.ndarray | None:
    if weights is None:
        return None
    weights = _array(weights, "per_sample_weights", sdm.errors.InvalidArgumentError)
    if weights.shape != (nnz,) or not np.issubdtype(weights.dtype, np.floating):
        raise sdm.errors.InvalidArgumentError(
            f"per_sample_weights must be a ({nnz},) float array like indices, got {weights.shape} {weights.dtype}")
    return check_weights(weights, nnz)  # finite, as one host's store requires

"""The DRAM cache tier: a policy-driven cache of rows in front of a slower tier.

The directory (which key sits in which slot) is a :class:`sdm.policies.Cache`, the same
Numba kernels ``sdm.simulate`` runs; the rows sit in a slot buffer this tier owns. A batch
is served in a fixed number of Numba and numpy calls whatever its size: dedup, probe (every
hit, miss, admission and eviction decided in one kernel), one read of all misses from the
tier below (its device model counts the blocks), one scatter into the slots, one pooled
gather straight from the slots.

Cache keys are ``table_id << 48 | row id``, so one cache (and one policy) spans all tables.

Two ways rows enter besides demand misses, both pinning their slots so no policy decision
can evict them: :meth:`pin_rows` (hot rows a placement keeps resident for good) and
:meth:`prefetch` (rows of an upcoming batch, pinned until :meth:`release` after that batch
was served — the eviction-before-use bug class of lookahead prefetchers cannot happen).
"""

from __future__ import annotations

import threading

import numpy as np

from sdm.errors import ConfigError
from sdm.formats import typed_rows
from sdm.kernels.dedup import unique_inverse
from sdm.kernels.serve import (C_HITS, C_MISSES, C_PREFETCH_USED, C_PREFETCH_WASTED, C_REJECTED,
                               N_COUNTERS, TABLE_SHIFT, fill_rows, probe_batch)
from sdm.tiers.manifest import TableLayout
from sdm.policies import Cache
from sdm.policies.cache import _no_admission
from sdm.kernels.pooling import pool
from sdm.tiers.base import CacheTier, Tier

__all__ = ["DramCacheTier"]

_MIN_SCRATCH = 1024
_LINE = 64  # slots start on cache lines, so a row costs exactly ceil(row_bytes / 64) lines


class DramCacheTier(CacheTier):
    """Up to ``capacity_rows`` rows of any tables, each in a slot of ``slot_bytes`` bytes.

    Args:
        lower: the tier misses are read from (usually a :class:`~sdm.tiers.metered.Metered`).
        capacity_rows: cache slots, >= 1.
        slot_bytes: bytes per slot: the widest row of the store (rounded up to 64 here).
        policy: a name of ``sdm.POLICIES`` (not ``belady``, which needs the future).
        admission: None, ``"threshold"``, ``"tinylfu"`` or an :class:`sdm.policies.Admission`.

    Thread-safe: one batch at a time holds the cache (the kernels inside run on all cores).
    """

    def __init__(self, lower: Tier, capacity_rows: int, slot_bytes: int, *, policy: str = "lru",
                 admission=None, name: str = "cache", seed: int = 0):
        if isinstance(slot_bytes, bool) or not isinstance(slot_bytes, int) or slot_bytes < 1:
            raise ConfigError(f"cache slot_bytes must be an integer >= 1, got {slot_bytes!r}")
        if policy == "belady":
            raise ConfigError("policy 'belady' needs the future of the key stream; it exists in "
                              "sdm.simulate only, not in a live cache")
        self.name = name
        self.lower = lower
        self.directory = Cache(capacity_rows, policy, admission=admission, seed=seed)
        self.capacity = self.directory.capacity
        self.slot_bytes = -(-slot_bytes // _LINE) * _LINE
        # np.empty: slots never filled cost address space, not RAM.
        self._slots = np.empty((self.capacity + _MIN_SCRATCH, self.slot_bytes), dtype=np.uint8)
        self._slot_epoch = np.full(self.capacity, -1, dtype=np.int64)
        self._slot_owner = np.zeros(self.capacity, dtype=np.int64)
        self._slot_flag = np.zeros(self.capacity, dtype=np.uint8)
        self._epoch = 0
        self._counters = np.zeros(N_COUNTERS, dtype=np.int64)  # demand batches
        self._prefetch_counters = np.zeros(N_COUNTERS, dtype=np.int64)
        self._prefetched = 0  # rows read from below by prefetches
        self._pinned: dict[int, np.ndarray] = {}  # table id -> ids pinned by pin_rows
        self._bypass = _no_admission()  # pins and prefetches are decided, not filtered
        self._lock = threading.Lock()

    @property
    def policy(self) -> str:
        return self.directory.policy

    # -- the batch path ----------------------------------------------------------------

    def _probe(self, layout: TableLayout, unique: np.ndarray, *, prefetch: bool = False):
        """Probe distinct ascending ``unique`` and plan their rows (:func:`probe_batch`);
        returns ``(ptr, is_miss)``. Caller holds the lock."""
        u = unique.shape[0]
        if self._slots.shape[0] - self.capacity < u:  # rare: grow scratch geometrically
            grown = np.empty((self.capacity + max(u, 2 * (self._slots.shape[0] - self.capacity)),
                              self.slot_bytes), dtype=np.uint8)
            grown[: self.capacity] = self._slots[: self.capacity]
            self._slots = grown
        self._epoch += 1
        ptr = np.empty(u, dtype=np.int64)
        is_miss = np.empty(u, dtype=np.bool_)
        probe_batch(unique, np.int64(layout.table_id) << TABLE_SHIFT, self.directory._state,
                    self._bypass if prefetch else self.directory._adm, self._slots, self.capacity,
                    self._slot_epoch, self._slot_owner, self._epoch, self._slot_flag, prefetch,
                    ptr, is_miss, self._prefetch_counters if prefetch else self._counters)
        return ptr, is_miss

    def _fill(self, layout: TableLayout, unique: np.ndarray, ptr: np.ndarray, missing: np.ndarray) -> None:
        """Read rows ``unique[missing]`` from the tier below into their planned slots."""
        if missing.size:
            fetched = np.empty((missing.size, layout.spec.row_bytes), dtype=np.uint8)
            self.lower.read_rows(layout, unique[missing], fetched)
            fill_rows(self._slots, ptr[missing], fetched)

    def _serve(self, layout: TableLayout, unique: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Make every row of ``unique`` present in ``self._slots`` for this batch; returns
        ``(ptr, is_miss)``. Caller holds the lock until it has read the rows."""
        ptr, is_miss = self._probe(layout, unique)
        self._fill(layout, unique, ptr, np.flatnonzero(is_miss))
        return ptr, is_miss

    def _view(self, layout: TableLayout) -> np.ndarray:
        raw = self._slots if layout.spec.row_bytes == self.slot_bytes else self._slots[:, : layout.spec.row_bytes]
        return typed_rows(raw, layout.spec.fmt)

    def pool_bags(self, layout: TableLayout, indices, offsets, weights, mean: bool, out) -> int:
        """Pool bags of validated ``indices``/``offsets`` into ``out`` ``(B, dim) float32``
        straight from the cache's slots; returns the number of distinct rows that hit."""
        unique, inverse = unique_inverse(indices)
        with self._lock:
            ptr, is_miss = self._serve(layout, unique)
            pool(self._view(layout), ptr[inverse], offsets, weights, mean, layout.spec.fmt, out)
        return int(unique.shape[0] - np.count_nonzero(is_miss))

    def read_rows(self, layout, ids, out):
        with self._lock:
            ptr, is_miss = self._serve(layout, ids)
            np.take(self._slots[:, : layout.spec.row_bytes], ptr, axis=0, out=out)
        return ~is_miss

    # -- pins and prefetch -------------------------------------------------------------

    def pin_rows(self, layout: TableLayout, ids: np.ndarray, *, source: Tier | None = None) -> None:
        """Load rows ``ids`` (sorted, unique int64) from ``source`` (default the tier below)
        and pin them for good (a placement's hot rows). They count against the capacity;
        demand counters are not touched. Rows of the table pinned earlier stay pinned.

        Raises:
            ConfigError: the pins would leave no slot for the rest of the traffic.
        """
        with self._lock:
            before = self._pinned.get(layout.table_id)
            ids = ids if before is None else np.setdiff1d(ids, before, assume_unique=True)
            total = sum(len(v) for v in self._pinned.values()) + len(ids)
            if total >= self.capacity:
                raise ConfigError(
                    f"cache {self.name!r}: pinning {total} rows leaves no slot of its "
                    f"{self.capacity} for other rows; pin fewer or give the cache more capacity")
            self._pinned[layout.table_id] = ids if before is None else np.union1d(before, ids)
            scratch = np.zeros(N_COUNTERS, dtype=np.int64)
            self._epoch += 1
            ptr = np.empty(len(ids), dtype=np.int64)
            is_miss = np.empty(len(ids), dtype=np.bool_)
            probe_batch(ids, np.int64(layout.table_id) << TABLE_SHIFT, self.directory._state,
                        self._bypass, self._slots, self.capacity, self._slot_epoch, self._slot_owner,
                        self._epoch, self._slot_flag, True, ptr, is_miss, scratch)
            missing = np.flatnonzero(is_miss)
            if missing.size:
                fetched = np.empty((missing.size, layout.spec.row_bytes), dtype=np.uint8)
                (source or self.lower).read_rows(layout, ids[missing], fetched)
                fill_rows(self._slots, ptr[missing], fetched)
            self._slot_flag[ptr[ptr < self.capacity]] = 0  # pinned for good, not a prefetch

    def prefetch(self, layout: TableLayout, ids: np.ndarray) -> int:
        """Bring rows ``ids`` (sorted, unique int64) of an upcoming batch into the cache and
        pin them until :meth:`release`; rows already cached are pinned too. Returns the rows
        read from the tier below. Rows that find no unpinned slot are skipped (counted as
        not admitted)."""
        with self._lock:
            ptr, is_miss = self._probe(layout, ids, prefetch=True)
            missing = np.flatnonzero(is_miss & (ptr < self.capacity))
            self._fill(layout, ids, ptr, missing)
            self._prefetched += int(missing.size)
            return int(missing.size)

    def release(self, layout: TableLayout, ids: np.ndarray) -> None:
        """Unpin rows ``ids`` pinned by :meth:`prefetch` (their batch has been served)."""
        with self._lock:
            slots = self.directory.lookup((np.int64(layout.table_id) << TABLE_SHIFT) | ids)
            self.directory.unpin(slots[slots >= 0])

    # -- the rest of the tier contract --------------------------------------------------

    def row_offsets(self, layout, ids):
        slots = self.directory.lookup((np.int64(layout.table_id) << TABLE_SHIFT) | np.asarray(ids, np.int64))
        return np.where(slots >= 0, slots, 0) * self.slot_bytes

    def rows_changed(self, layout, ids):
        """Drop the changed rows; changed rows pinned by :meth:`pin_rows` are loaded again
        (pinned afresh) from the tier below, which serves the new ones."""
        with self._lock:
            freed = self.directory.remove((np.int64(layout.table_id) << TABLE_SHIFT) | ids)
            self._slot_flag[freed[freed >= 0]] = 0
            pinned = self._pinned.get(layout.table_id)
        if pinned is not None:
            again = np.intersect1d(pinned, ids, assume_unique=True)
            if len(again):
                with self._lock:
                    self._pinned[layout.table_id] = np.setdiff1d(pinned, again, assume_unique=True)
                self.pin_rows(layout, again)

    def invalidate(self, layout):
        """Drop the table's rows, pinned ones included (their owner pins the new ones)."""
        with self._lock:
            keys = self.directory.slot_keys()
            mine = keys[(keys >= 0) & ((keys >> TABLE_SHIFT) == layout.table_id)]
            freed = self.directory.remove(mine)
            self._slot_flag[freed[freed >= 0]] = 0
            self._pinned.pop(layout.table_id, None)

    def stats(self):
        c, p = self._counters, self._prefetch_counters
        hits, misses, rejected = int(c[C_HITS]), int(c[C_MISSES]), int(c[C_REJECTED])
        used = int(c[C_PREFETCH_USED])
        out = {"hits": hits, "misses": misses, "not_admitted": rejected,
               "capacity_rows": self.capacity, "cached_rows": len(self.directory),
               "pinned_rows": sum(len(v) for v in self._pinned.values()),
               "policy": self.policy,
               "admission": None if self.directory.admission is None else self.directory.admission.kind}
        if self._prefetched or p[C_HITS] or p[C_MISSES]:
            out.update({
                "prefetched": self._prefetched, "prefetch_already_cached": int(p[C_HITS]),
                "prefetch_skipped": int(p[C_REJECTED]), "prefetch_used": used,
                "prefetch_wasted": int(c[C_PREFETCH_WASTED] + p[C_PREFETCH_WASTED]),
                # of the rows the demand path needed from below, the share prefetch had read
                "prefetch_coverage": used / (used + misses) if used + misses else 0.0,
                # of the rows prefetch read, the share a demand batch used
                "prefetch_accuracy": used / self._prefetched if self._prefetched else 0.0})
        return out

    def check_invariants(self) -> None:
        """Raise AssertionError if the directory is inconsistent (tests)."""
        self.directory.check_invariants()

    def close(self):
        with self._lock:
            self._slots = np.empty((0, self.slot_bytes), dtype=np.uint8)

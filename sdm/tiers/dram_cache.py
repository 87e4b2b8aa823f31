"""The DRAM cache tier: a policy-driven cache of rows in front of a slower tier.

The directory (which key sits in which slot) is a :class:`sdm.policies.Cache`, the same
Numba kernels ``sdm.simulate`` runs; the rows sit in a slot buffer this tier owns. A batch
is served in a fixed number of Numba and numpy calls whatever its size: dedup, probe (every
hit, miss, admission and eviction decided in one kernel), one read of all misses from the
tier below (its device model counts the blocks), one scatter into the slots, one pooled
gather straight from the slots.

Cache keys are ``table_id << 48 | row id``, so one cache (and one policy) spans all tables.
"""

from __future__ import annotations

import threading

import numpy as np

from sdm.errors import ConfigError
from sdm.kernels.dedup import unique_inverse
from sdm.kernels.serve import fill_rows, probe_batch
from sdm.manifest import TableLayout
from sdm.policies import Cache
from sdm.pooling import pool
from sdm.tiers.base import Tier

__all__ = ["DramCacheTier", "TABLE_SHIFT"]

TABLE_SHIFT = 48  # row ids are < 2**48 (TableSpec's limit)
_MIN_SCRATCH = 1024


class DramCacheTier(Tier):
    """Up to ``capacity_rows`` rows of any tables, each in a slot of ``slot_bytes`` bytes.

    Args:
        lower: the tier misses are read from (usually a :class:`~sdm.tiers.metered.Metered`).
        capacity_rows: cache slots, >= 1.
        slot_bytes: bytes per slot: the widest row of the store.
        policy: a name of ``sdm.POLICIES`` (not ``belady``, which needs the future).
        admission: None, ``"threshold"``, ``"tinylfu"`` or an :class:`sdm.policies.Admission`.

    Thread-safe: one batch at a time holds the cache (the kernels inside run on all cores).
    """

    holds_all_rows = False

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
        self.slot_bytes = slot_bytes
        # np.empty: slots never filled cost address space, not RAM.
        self._slots = np.empty((self.capacity + _MIN_SCRATCH, slot_bytes), dtype=np.uint8)
        self._slot_epoch = np.full(self.capacity, -1, dtype=np.int64)
        self._slot_owner = np.zeros(self.capacity, dtype=np.int64)
        self._epoch = 0
        self._counters = np.zeros(3, dtype=np.int64)  # hits, misses, not admitted
        self._lock = threading.Lock()

    @property
    def policy(self) -> str:
        return self.directory.policy

    # -- the batch path ----------------------------------------------------------------

    def _serve(self, layout: TableLayout, unique: np.ndarray) -> np.ndarray:
        """Make every row of ``unique`` (sorted distinct ids) present in ``self._slots`` for
        this batch; returns ``ptr``, the row of the slot buffer holding each. Caller holds
        the lock until it has read the rows."""
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
                    self.directory._adm, self._slots, self.capacity, self._slot_epoch,
                    self._slot_owner, self._epoch, ptr, is_miss, self._counters)
        missing = np.flatnonzero(is_miss)
        if missing.size:
            fetched = np.empty((missing.size, layout.spec.row_bytes), dtype=np.uint8)
            self.lower.read_rows(layout, unique[missing], fetched)
            fill_rows(self._slots, ptr[missing], fetched)
        return ptr

    def _view(self, layout: TableLayout) -> np.ndarray:
        raw = self._slots if layout.spec.row_bytes == self.slot_bytes else self._slots[:, : layout.spec.row_bytes]
        if layout.spec.fmt == "fp32":
            return raw.view(np.float32)
        if layout.spec.fmt == "fp16":
            return raw.view(np.float16)
        return raw

    def pool_bags(self, layout: TableLayout, indices, offsets, weights, mean: bool, out) -> np.ndarray:
        """Pool bags of validated ``indices``/``offsets`` straight from the cache's slots."""
        unique, inverse = unique_inverse(indices)
        with self._lock:
            ptr = self._serve(layout, unique)
            return pool(self._view(layout), ptr[inverse], offsets, weights, mean, layout.spec.fmt, out)

    def read_rows(self, layout, ids, out):
        with self._lock:
            ptr = self._serve(layout, ids)
            np.take(self._slots[:, : layout.spec.row_bytes], ptr, axis=0, out=out)

    def row_offsets(self, layout, ids):
        slots = self.directory.lookup((np.int64(layout.table_id) << TABLE_SHIFT) | np.asarray(ids, np.int64))
        return np.where(slots >= 0, slots, 0) * self.slot_bytes

    def invalidate(self, layout):
        with self._lock:
            keys = self.directory.slot_keys()
            mine = keys[(keys >= 0) & ((keys >> TABLE_SHIFT) == layout.table_id)]
            self.directory.remove(mine)

    def stats(self):
        hits, misses, rejected = (int(x) for x in self._counters)
        return {"hits": hits, "misses": misses, "not_admitted": rejected,
                "capacity_rows": self.capacity, "cached_rows": len(self.directory),
                "policy": self.policy}

    def check_invariants(self) -> None:
        """Raise AssertionError if the directory is inconsistent (tests)."""
        self.directory.check_invariants()

    def close(self):
        with self._lock:
            self._slots = np.empty((0, self.slot_bytes), dtype=np.uint8)

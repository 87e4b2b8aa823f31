"""A DRAM cache tier of fixed capacity in rows, in front of a slower tier (LRU stand-in).

Semantics, per batch of unique ids (what the store asks for): the rows cached when the
batch arrives are hits, served from the cache's slots and made most recently used (in batch
order); the misses are read from the tier below in one batch and admitted in batch order,
each evicting the least recently used row once the cache is full. A batch with more misses
than the cache has slots admits its last ``capacity`` misses.

This is a stand-in until the Numba cache policies of ``sdm.policies`` land: the recency
order is an ``OrderedDict`` (key -> slot), so its cost is O(batch) Python dict operations,
never O(capacity); the rows themselves move with vectorized numpy copies.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from sdm.errors import ConfigError
from sdm.tiers.base import Tier

__all__ = ["LruCacheTier", "CACHE_POLICIES"]

CACHE_POLICIES = ("lru",)
_TABLE_SHIFT = 48  # cache key = table_id << 48 | row id (row ids are < 2**48)


class LruCacheTier(Tier):
    """Up to ``capacity_rows`` rows of any tables, each in a slot of ``slot_bytes`` bytes.

    Args:
        lower: the tier misses are read from (usually a :class:`~sdm.tiers.metered.Metered`).
        capacity_rows: slots, >= 1.
        slot_bytes: bytes per slot, at least the widest row that will be cached (rows wider
            than a slot pass through uncached).

    ``invalidate`` and ``close`` act on this cache only; the owner of the chain (the
    hierarchy) tells the lower tiers itself.
    """

    name = "cache"
    holds_all_rows = False

    def __init__(self, lower: Tier, capacity_rows: int, slot_bytes: int, *, name: str = "cache"):
        if isinstance(capacity_rows, bool) or not isinstance(capacity_rows, int) or capacity_rows < 1:
            raise ConfigError(f"cache capacity_rows must be an integer >= 1, got {capacity_rows!r}")
        if isinstance(slot_bytes, bool) or not isinstance(slot_bytes, int) or slot_bytes < 1:
            raise ConfigError(f"cache slot_bytes must be an integer >= 1, got {slot_bytes!r}")
        self.name = name
        self.lower = lower
        self.capacity = capacity_rows
        self.slot_bytes = slot_bytes
        # np.empty: slots never filled cost address space, not RAM.
        self._slots = np.empty((capacity_rows, slot_bytes), dtype=np.uint8)
        self._map: OrderedDict[int, int] = OrderedDict()  # key -> slot, least recent first
        self._free: list[int] = []  # slots freed by invalidate
        self._used = 0  # slots [0, _used) have been handed out at least once
        self._hits = 0
        self._misses = 0
        self._lock = threading.Lock()

    def read_rows(self, layout, ids, out):
        width = layout.spec.row_bytes
        n = len(ids)
        if width > self.slot_bytes:
            self.lower.read_rows(layout, ids, out)
            with self._lock:
                self._misses += n
            return np.zeros(n, dtype=bool)
        keys = ((np.int64(layout.table_id) << _TABLE_SHIFT) | ids.astype(np.int64, copy=False)).tolist()
        with self._lock:
            get = self._map.get
            slots = np.fromiter((get(k, -1) for k in keys), dtype=np.int64, count=n)
            hit = slots >= 0
            hit_slots = slots[hit]
            out[hit] = self._slots[hit_slots, :width]
            touch = self._map.move_to_end
            for k in np.asarray(keys, dtype=np.int64)[hit].tolist():
                touch(k)
            miss = ~hit
            n_miss = n - len(hit_slots)
            self._hits += n - n_miss
            self._misses += n_miss
            if n_miss:
                fetched = np.empty((n_miss, width), dtype=np.uint8)
                self.lower.read_rows(layout, ids[miss], fetched)
                out[miss] = fetched
                miss_keys = np.asarray(keys, dtype=np.int64)[miss].tolist()
                if n_miss > self.capacity:
                    miss_keys, fetched = miss_keys[-self.capacity:], fetched[-self.capacity:]
                self._slots[self._admit(miss_keys), :width] = fetched
        return hit

    def _admit(self, keys: list[int]) -> list[int]:
        # One eviction funnel: free slots first, then never-used ones, then the LRU row's.
        slots = []
        for key in keys:
            if self._free:
                slot = self._free.pop()
            elif self._used < self.capacity:
                slot = self._used
                self._used += 1
            else:
                slot = self._map.popitem(last=False)[1]
            self._map[key] = slot
            slots.append(slot)
        return slots

    def row_offsets(self, layout, ids):
        # A cached row sits in its slot. A row not cached has no place here; it is given the
        # slot its id would hash to, which only a device model counting it would see.
        ids = np.asarray(ids, dtype=np.int64)
        keys = ((np.int64(layout.table_id) << _TABLE_SHIFT) | ids).tolist()
        with self._lock:
            get = self._map.get
            slots = np.fromiter((get(k, -1) for k in keys), dtype=np.int64, count=len(keys))
        slots = np.where(slots >= 0, slots, ids % self.capacity)
        return slots * self.slot_bytes

    def invalidate(self, layout):
        with self._lock:
            mine = [k for k in self._map if k >> _TABLE_SHIFT == layout.table_id]
            for key in mine:
                self._free.append(self._map.pop(key))

    def cached_keys(self) -> list[tuple[int, int]]:
        """``[(table_id, row id)]`` cached, least recently used first (tests, invariants)."""
        mask = (1 << _TABLE_SHIFT) - 1
        return [(k >> _TABLE_SHIFT, k & mask) for k in self._map]

    def check_invariants(self) -> None:
        """Raise AssertionError if the key map, free list and slot counter disagree."""
        slots = list(self._map.values())
        # Explicit raises, not asserts: the checks must hold under ``python -O`` too.
        if len(slots) > self.capacity or len(set(slots)) != len(slots):
            raise AssertionError("more keys than slots, or a slot holding two keys")
        if set(slots) & set(self._free):
            raise AssertionError("a slot is both in use and free")
        if not len(slots) + len(self._free) == self._used <= self.capacity:
            raise AssertionError("used-slot counter disagrees with the map and free list")

    def stats(self):
        return {"hits": self._hits, "misses": self._misses, "capacity_rows": self.capacity,
                "cached_rows": len(self._map), "policy": "lru"}

    def close(self):
        with self._lock:
            self._map.clear()
            self._free.clear()
            self._used = 0

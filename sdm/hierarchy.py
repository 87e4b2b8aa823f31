"""A hierarchy: the store's tiers ordered fast to slow, built from a :class:`HierarchyConfig`.

The LMDB environment is always the durable copy of every row; a config decides which tiers
sit in front of it and whether it serves lookups itself. Every tier is wrapped in a
:class:`~sdm.tiers.metered.Metered` device model charging one shared simulated clock. A
lookup probes tiers fast to slow: a cache serves its hits and reads its misses from the
tier below (metered there), admitting them; the last tier holds every row.
"""

from __future__ import annotations

import os

import numpy as np

from sdm.clock import SimClock
from sdm.config import HierarchyConfig, TierConfig
from sdm.errors import ConfigError
from sdm.manifest import Manifest, TableLayout
from sdm.tiers import DramTier, LmdbTier, Tier
from sdm.tiers.cache import LruCacheTier
from sdm.tiers.lmdb import RowDB
from sdm.tiers.metered import Metered
from sdm.tiers.mmap import MmapTier


class Hierarchy:
    """Tiers ordered fast to slow, each metered by its device on one :class:`SimClock`.

    ``tiers[0]`` serves every read: a cache forwards its misses to ``tiers[1]`` and so on;
    the last tier holds all rows.
    """

    def __init__(self, config: HierarchyConfig, db: RowDB, *, clock: SimClock | None = None):
        self.config = config
        self.clock = clock if clock is not None else SimClock()
        directory = os.path.dirname(db.path)
        tables = Manifest.read(directory).tables
        widest = max((t.spec.row_bytes for t in tables), default=1)
        total_rows = sum(t.spec.num_rows for t in tables)
        total_bytes = sum(t.spec.num_rows * t.spec.row_bytes for t in tables)
        backing = LmdbTier(db)
        built: list[Tier] = []
        lower: Tier | None = None
        for index in range(len(config.tiers) - 1, -1, -1):
            tc = config.tiers[index]
            where = f"hierarchy {config.name!r} tiers[{index}] ({tc.kind})"
            if tc.kind == "cache":
                rows = tc.capacity_rows if tc.capacity_rows is not None else tc.capacity_bytes // widest
                if rows < 1:
                    raise ConfigError(f"{where}: capacity_bytes {tc.capacity_bytes} holds no row of "
                                      f"{widest} bytes (the widest row of the store)")
                inner: Tier = LruCacheTier(lower, rows, widest, name=_tier_name(config, index))
            else:
                _check_capacity(tc, total_rows, total_bytes, where)
                if tc.kind == "dram":
                    inner = DramTier(backing)
                elif tc.kind == "mmap":
                    inner = MmapTier(db, directory)
                else:
                    inner = backing
            lower = Metered(inner, tc.device, self.clock, io_mode=config.io_mode,
                            queue_depth=tc.queue_depth, name=_tier_name(config, index))
            built.append(lower)
        self.tiers: list[Metered] = built[::-1]
        self._top = self.tiers[0]

    def resident(self, layout: TableLayout) -> np.ndarray | None:
        """The whole table in memory when the serving tier keeps it so, else None."""
        return self._top.resident(layout)

    def count_resident_hits(self, n: int, layout: TableLayout | None = None) -> None:
        """Record ``n`` rows of ``layout`` pooled straight from :meth:`resident`."""
        self._top.count_hits(n, layout)

    def read_rows(self, layout: TableLayout, ids: np.ndarray, out: np.ndarray) -> None:
        """Rows ``ids`` (sorted, unique int64) into ``out`` ``(n, row_bytes) uint8``, probing
        the tiers fast to slow."""
        self._top.read_rows(layout, ids, out)

    def invalidate(self, layout: TableLayout) -> None:
        for tier in self.tiers:
            tier.invalidate(layout)

    def stats(self) -> list[dict]:
        """Per tier, fast to slow: ``name``, ``kind``, ``device``, ``hits``, ``misses``,
        ``reads``, ``bytes_read``, ``useful_bytes``, ``read_amplification``, ``modeled_ns``,
        ``energy_j``, ``wall_ns``, ``io_mode``, ``queue_depth`` and tier-specific counters."""
        rows = []
        for tc, tier in zip(self.config.tiers, self.tiers):
            counters = {"hits": 0, "misses": 0}
            counters.update(tier.stats())
            rows.append({"name": tier.name, "kind": tc.kind, **counters})
        return rows

    def modeled_ns(self) -> int:
        """Simulated time since the hierarchy was built (every tier's busy time, in turn)."""
        return self.clock.now_ns()

    def close(self) -> None:
        for tier in self.tiers:
            tier.close()


def _tier_name(config: HierarchyConfig, index: int) -> str:
    """The name ``stats()`` shows: the kind (``lmdb``, ``mmap``, ``dram``), or for caches
    ``cache`` and ``cache2``... in order, so names stay unique."""
    kind = config.tiers[index].kind
    if kind != "cache":
        return kind
    before = sum(1 for t in config.tiers[:index] if t.kind == "cache")
    return "cache" if before == 0 else f"cache{before + 1}"


def _check_capacity(tc: TierConfig, total_rows: int, total_bytes: int, where: str) -> None:
    # A tier holding every row must have room for every row.
    if tc.capacity_rows is not None and total_rows > tc.capacity_rows:
        raise ConfigError(f"{where}: the store holds {total_rows} rows, more than "
                          f"capacity_rows {tc.capacity_rows}")
    if tc.capacity_bytes is not None and total_bytes > tc.capacity_bytes:
        raise ConfigError(f"{where}: the store's rows take {total_bytes} bytes, more than "
                          f"capacity_bytes {tc.capacity_bytes}")

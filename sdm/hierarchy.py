"""A hierarchy: the store's tiers ordered fast to slow, built from a :class:`HierarchyConfig`.

The LMDB environment is always the durable copy of every row; a config decides which tiers
sit in front of it and whether it serves lookups itself.
"""

from __future__ import annotations

import numpy as np

from sdm.config import HierarchyConfig
from sdm.manifest import TableLayout
from sdm.tiers import DramTier, LmdbTier, Tier
from sdm.tiers.lmdb import RowDB


class Hierarchy:
    """Tiers ordered fast to slow; the first tier holding all rows serves each read."""

    def __init__(self, config: HierarchyConfig, db: RowDB):
        self.config = config
        backing = LmdbTier(db)
        self.tiers: list[Tier] = []
        for tier in config.tiers:
            if tier.kind == "dram":
                self.tiers.append(DramTier(backing))
            elif tier.kind == "lmdb":
                self.tiers.append(backing)
        self._server = next(t for t in self.tiers if t.holds_all_rows)

    def resident(self, layout: TableLayout) -> np.ndarray | None:
        """The whole table in memory when the serving tier keeps it so, else None."""
        return self._server.resident(layout)

    def count_resident_hits(self, n: int) -> None:
        self._server.count_hits(n)

    def read_rows(self, layout: TableLayout, ids: np.ndarray, out: np.ndarray) -> None:
        """Rows ``ids`` (sorted, unique int64) into ``out`` ``(n, row_bytes) uint8``."""
        self._server.read_rows(layout, ids, out)

    def invalidate(self, layout: TableLayout) -> None:
        for tier in self.tiers:
            tier.invalidate(layout)

    def stats(self) -> list[dict]:
        rows = []
        for tier in self.tiers:
            counters = {"hits": 0, "misses": 0, "reads": 0, "bytes_read": 0, "modeled_ns": 0}
            counters.update(tier.stats())
            rows.append({"name": tier.name, **counters})
        return rows

    def close(self) -> None:
        for tier in self.tiers:
            tier.close()

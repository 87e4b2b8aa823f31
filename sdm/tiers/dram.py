"""The DRAM tier: every row of each table held in RAM, loaded from the backing tier on first use."""

from __future__ import annotations

import threading

import numpy as np

from sdm.errors import ConfigError
from sdm.tiers.base import Tier
from sdm.tiers.manifest import TableLayout

# DRAM is read in cache lines; a row's bytes counted here are whole 64-byte lines.
DRAM_LINE_BYTES = 64


class DramTier(Tier):
    """All rows resident in RAM as ``(num_rows, row_bytes) uint8`` arrays.

    ``source`` is the backing tier the rows are loaded from (``supports_load_table``), a
    table at a time, the first time the table is used (so opening a store costs nothing until
    a table is read). With ``tables`` (table ids), the tier serves only those: tables a
    placement pins whole, in front of a cache that serves the rest.
    """

    name = kind = "dram"
    holds_all_rows = True

    def __init__(self, source: Tier, tables: frozenset[int] | None = None, *, name: str = "dram"):
        if not source.supports_load_table:
            raise ConfigError(f"a DRAM tier loads whole tables; tier {source.name!r} cannot")
        self.name = name
        self._source = source
        self._only = None if tables is None else frozenset(tables)
        self._tables: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()
        self._rows_read = 0

    def resident(self, layout: TableLayout) -> np.ndarray:
        table = self._tables.get(layout.table_id)
        if table is None:
            with self._lock:
                table = self._tables.get(layout.table_id)
                if table is None:
                    table = self._source.load_table(layout)
                    self._tables[layout.table_id] = table
        return table

    def read_rows(self, layout, ids, out):
        np.take(self.resident(layout), ids, axis=0, out=out)
        self._rows_read += len(ids)

    def serves(self, layout):
        return self._only is None or layout.table_id in self._only

    def count_hits(self, n, layout):
        self._rows_read += n

    def row_offsets(self, layout, ids):
        return np.asarray(ids, dtype=np.int64) * layout.spec.row_bytes

    def invalidate(self, layout):
        with self._lock:
            self._tables.pop(layout.table_id, None)

    def rows_changed(self, layout, ids):
        """Re-read the changed rows into the resident table, if it is loaded."""
        table = self._tables.get(layout.table_id)
        if table is not None and len(ids):
            fresh = np.empty((len(ids), layout.spec.row_bytes), dtype=np.uint8)
            self._source.read_rows(layout, ids, fresh)
            table[ids] = fresh

    def stats(self):
        return {"hits": self._rows_read, "misses": 0,
                "resident_bytes": int(sum(t.nbytes for t in self._tables.values()))}

    def close(self):
        self._tables.clear()

"""Rows updated since a derived copy was made, served from the durable copy instead.

The SCM row files are derived from LMDB a whole table at a time; rewriting one for every
``update_rows`` would cost the table. Instead the hierarchy keeps, per table, the sorted ids
updated in its committed generation (from the database's change log), and this wrapper
reads those from LMDB — the truth — and every other row from the derived file. A derived
file is therefore never read for a row it may hold stale, whenever it was built. Publishing
a new generation (``write_table``) empties the set.

Once a table's updated rows pass :data:`REBUILD_FRACTION` of it, reading them one LMDB block
at a time costs more than the derived file saves: the file is dropped, rebuilt from LMDB
by the next read (inside that batch's snapshot, so it holds every update seen so far), and
the set starts empty again. The old file is unlinked first (its header still names the
committed generation, so it would pass as current); other processes keep their mapping of
it and their own set, and a process opening later takes every logged update of the
generation as updated, whichever file it finds.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from sdm.tiers.manifest import TableLayout
from sdm.tiers.base import Tier
from sdm.tiers.lmdb import RowDB

__all__ = ["PatchedTier", "REBUILD_FRACTION"]

REBUILD_FRACTION = 0.05


class PatchedTier(Tier):
    """``inner`` (a derived copy of every row) with the rows of :meth:`rows_changed` read from
    ``db``; ``rowfile(layout)`` names the file ``inner`` derives for a table (unlinked to force
    a rebuild)."""

    holds_all_rows = True

    def __init__(self, inner: Tier, db: RowDB, rowfile=None):
        self.inner = inner
        self._rowfile = rowfile  # layout -> path of the derived file to drop on a rebuild
        self.name = inner.name
        self.kind = inner.kind
        self.supports_direct_io = inner.supports_direct_io
        self._db = db
        self._dirty: dict[int, np.ndarray] = {}  # table id -> sorted unique updated ids
        self._lock = threading.Lock()
        self._patched_reads = 0
        self._rebuilds = 0

    def rows_changed(self, layout: TableLayout, ids: np.ndarray) -> None:
        """Rows ``ids`` (sorted, unique) of ``layout``'s table changed in the database."""
        with self._lock:
            old = self._dirty.get(layout.table_id)
            dirty = ids.copy() if old is None else np.union1d(old, ids)
            rebuild = len(dirty) > REBUILD_FRACTION * layout.spec.num_rows
            if rebuild:
                self._dirty.pop(layout.table_id, None)
                self._rebuilds += 1
            else:
                self._dirty[layout.table_id] = dirty
        if rebuild:
            if self._rowfile is not None:
                try:
                    os.unlink(self._rowfile(layout))
                except FileNotFoundError:
                    pass
            self.inner.invalidate(layout)

    def _split(self, layout, ids):
        dirty = self._dirty.get(layout.table_id)
        if dirty is None or not len(ids):
            return None
        hit = np.isin(ids, dirty, assume_unique=True)
        return hit if hit.any() else None

    def _read(self, layout, ids, out, read_clean):
        hit = self._split(layout, ids)
        if hit is None:
            return read_clean(ids, out)
        clean = ~hit
        if clean.any():
            part = np.empty((int(clean.sum()), out.shape[1]), dtype=np.uint8)
            read_clean(ids[clean], part)
            out[clean] = part
        fresh = np.empty((int(hit.sum()), out.shape[1]), dtype=np.uint8)
        self._db.read_rows(layout, ids[hit], fresh)
        out[hit] = fresh
        self._patched_reads += len(fresh)
        return None

    def read_rows(self, layout, ids, out):
        return self._read(layout, ids, out, lambda i, o: self.inner.read_rows(layout, i, o))

    def read_rows_direct(self, layout, ids, out, *, queue_depth=1):
        return self._read(layout, ids, out,
                          lambda i, o: self.inner.read_rows_direct(layout, i, o, queue_depth=queue_depth))

    def row_offsets(self, layout, ids):
        # Updated rows are charged where the derived copy keeps them: the device model is
        # of the SCM tier, whose file a real system would patch in place.
        return self.inner.row_offsets(layout, ids)

    def resident(self, layout):
        return self.inner.resident(layout)

    def invalidate(self, layout):
        """A new generation: nothing of it has been updated yet."""
        with self._lock:
            self._dirty.pop(layout.table_id, None)
        self.inner.invalidate(layout)

    def stats(self):
        """The inner tier's counters, its ``hits`` counting the updated rows read from LMDB
        too (``updated_rows_from_lmdb`` of them): every row served is a hit of this tier."""
        inner = self.inner.stats()
        return {**inner, "hits": inner["hits"] + self._patched_reads,
                "updated_rows_from_lmdb": self._patched_reads,
                "updated_rows": int(sum(len(v) for v in self._dirty.values())),
                "rebuilds_for_updates": self._rebuilds}

    def close(self):
        self.inner.close()

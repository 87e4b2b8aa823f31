"""Rows updated since a derived copy was made, served from the durable copy instead.

The SCM row files are derived from LMDB a whole table at a time; rewriting one for every
``update_rows`` would cost the table. A row file instead names the database version its rows
are of (:mod:`sdm.tiers.rowfile`), and this wrapper reads from LMDB — the truth, in the
reader's snapshot — every row the change log shows updated between that version and the
reader's, and every other row from the file. So a file is never read for a row it may hold
at another version, whoever built it and when: another process may build the file this one
maps next from an older snapshot than this one's, or from a newer one (then, until this
process catches up, every row of that table comes from LMDB). Publishing a new generation
(``write_table``) starts the table afresh.

Once a table's updated rows pass :data:`REBUILD_FRACTION` of it, reading them one LMDB block
at a time costs more than the file saves: the file is dropped and rebuilt from LMDB by the
next read (inside that batch's snapshot), and a file found on disk that far behind is
rebuilt instead of mapped. The old file is unlinked first, unless another process has
rebuilt it since at a newer version (that file is mapped instead); other processes keep
their mapping of the old one.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from sdm.tiers.manifest import TableLayout
from sdm.tiers.base import Tier
from sdm.tiers.lmdb import RowDB
from sdm.tiers.mmap import FileReplaced
from sdm.tiers.rowfile import built_version_on_disk

__all__ = ["PatchedTier", "REBUILD_FRACTION"]

REBUILD_FRACTION = 0.05


class PatchedTier(Tier):
    """``inner`` (an :class:`~sdm.tiers.mmap.MmapTier`: a derived copy of every row, each file
    naming its version) with the rows updated since ``db`` read from ``db``; ``rowfile(layout)``
    names the file ``inner`` derives for a table (unlinked to force a rebuild)."""

    holds_all_rows = True

    def __init__(self, inner: Tier, db: RowDB, rowfile=None):
        self.inner = inner
        self._rowfile = rowfile  # layout -> path of the derived file to drop on a rebuild
        self.name = inner.name
        self.kind = inner.kind
        self.supports_direct_io = inner.supports_direct_io
        self._db = db
        # table id -> (version of the file inner maps, sorted unique ids updated since it):
        # set on a table's first read, extended by rows_changed while that file stays mapped.
        self._patch: dict[int, tuple[int, np.ndarray]] = {}
        self._lock = threading.Lock()
        self._patched_reads = 0
        self._rebuilds = 0
        inner.accept_file = self._close_enough

    def rows_changed(self, layout: TableLayout, ids: np.ndarray) -> None:
        """Rows ``ids`` (sorted, unique) of ``layout``'s table changed in the database (the
        store's writer catching up, no read in flight)."""
        with self._lock:
            got = self._patch.get(layout.table_id)
            if got is None:
                return  # no file mapped: its first read takes the changes from the log
            dirty = np.union1d(got[1], ids)
            rebuild = len(dirty) > REBUILD_FRACTION * layout.spec.num_rows
            if rebuild:
                del self._patch[layout.table_id]
                self._rebuilds += 1
            else:
                self._patch[layout.table_id] = (got[0], dirty)
        if rebuild:
            if self._rowfile is not None:
                path = self._rowfile(layout)
                on_disk = built_version_on_disk(path)
                # Another process may have rebuilt the file past these changes already (each
                # process catches up on its own): its file stays, and is mapped next.
                if on_disk is None or on_disk <= got[0]:
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass
            self.inner.invalidate(layout)

    def _changed_since(self, layout: TableLayout, version: int, txn) -> np.ndarray:
        """Sorted unique ids of ``layout``'s generation updated after ``version``, up to
        ``txn``'s snapshot."""
        changed = [ids for _, table_id, generation, ids in self._db.changes(version, txn)
                   if table_id == layout.table_id and generation == layout.generation]
        return np.unique(np.concatenate(changed)) if changed else np.empty(0, dtype=np.int64)

    def _close_enough(self, layout: TableLayout, built_version: int) -> bool:
        """Whether a file found on disk, of ``built_version``, is worth mapping: not so far
        behind the calling thread's snapshot that its updated rows pass the rebuild fraction."""
        with self._db.snapshot() as txn:
            if built_version >= self._db.version(txn):
                return True
            far = len(self._changed_since(layout, built_version, txn)) > REBUILD_FRACTION * layout.spec.num_rows
        if far:
            with self._lock:
                self._rebuilds += 1
        return not far

    def _updated(self, layout: TableLayout) -> tuple[int, np.ndarray | None]:
        """``(version of the file inner maps, sorted ids of layout's table that it may hold
        at another version than the calling thread's snapshot)``; None for the ids when every
        row may (a file newer than the snapshot: which rows it changed the snapshot cannot
        tell)."""
        built = self.inner.built_version(layout)
        got = self._patch.get(layout.table_id)
        if got is not None and got[0] == built:
            return got
        with self._lock, self._db.snapshot() as txn:
            got = self._patch.get(layout.table_id)
            if got is not None and got[0] == built:  # another thread got here first
                return got
            if built > self._db.version(txn):
                return built, None
            got = (built, self._changed_since(layout, built, txn))
            self._patch[layout.table_id] = got
            return got

    def _read(self, layout, ids, out, read_clean):
        """``read_clean(ids, out, built_version)`` reads rows from inner's file of that
        version; the rows that file may hold at another version come from the database."""
        if not len(ids):
            return read_clean(ids, out, None)
        built, dirty = self._updated(layout)
        hit = np.ones(len(ids), dtype=np.bool_) if dirty is None else np.isin(ids, dirty, assume_unique=True)
        if not hit.any():
            return self._clean(layout, ids, out, read_clean, built)
        clean = ~hit
        if clean.any():
            part = np.empty((int(clean.sum()), out.shape[1]), dtype=np.uint8)
            self._clean(layout, ids[clean], part, read_clean, built)
            out[clean] = part
        fresh = np.empty((int(hit.sum()), out.shape[1]), dtype=np.uint8)
        self._db.read_rows(layout, ids[hit], fresh)
        out[hit] = fresh
        self._patched_reads += len(fresh)
        return None

    def _clean(self, layout, ids, out, read_clean, built):
        try:
            return read_clean(ids, out, built)
        except FileReplaced:
            # Another file was mapped since ``built`` (a damaged one replaced, perhaps by a
            # file another process built at another version): its rows are not the ones this
            # batch was patched for, so these come from the database. Rare: damage and a
            # rebuild in between.
            self._db.read_rows(layout, ids, out)
            self._patched_reads += len(ids)
            return None

    def read_rows(self, layout, ids, out):
        return self._read(layout, ids, out,
                          lambda i, o, built: self.inner.read_rows(layout, i, o, built_version=built))

    def read_rows_direct(self, layout, ids, out, *, queue_depth=1):
        return self._read(layout, ids, out,
                          lambda i, o, built: self.inner.read_rows_direct(layout, i, o, queue_depth=queue_depth,
                                                                          built_version=built))

    def row_offsets(self, layout, ids):
        # Updated rows are charged where the derived copy keeps them: the device model is
        # of the SCM tier, whose file a real system would patch in place.
        return self.inner.row_offsets(layout, ids)

    def resident(self, layout):
        return self.inner.resident(layout)

    def invalidate(self, layout):
        """A new generation: its rows are the new file's."""
        with self._lock:
            self._patch.pop(layout.table_id, None)
        self.inner.invalidate(layout)

    def stats(self):
        """The inner tier's counters, its ``hits`` counting the updated rows read from LMDB
        too (``updated_rows_from_lmdb`` of them): every row served is a hit of this tier."""
        inner = self.inner.stats()
        with self._lock:  # a table's first read adds its entry
            updated = sum(len(v) for _, v in self._patch.values())
        return {**inner, "hits": inner["hits"] + self._patched_reads,
                "updated_rows_from_lmdb": self._patched_reads,
                "updated_rows": int(updated),
                "rebuilds_for_updates": self._rebuilds}

    def close(self):
        self.inner.close()

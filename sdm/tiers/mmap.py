"""The SCM tier: each table's row file (:mod:`sdm.tiers.rowfile`) read through mmap or O_DIRECT.

A file is used only when it is current and intact; otherwise it is rebuilt from LMDB and the
read served again from the new file, and damage (as opposed to a stale file) is recorded in
:meth:`MmapTier.stats`. See :mod:`sdm.tiers.rowfile` for the layout and the checks.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import deque
from typing import Mapping

import numpy as np

from sdm.devices import block_ranges
from sdm.errors import ConfigError, CorruptStoreError, StoreError
from sdm.kernels.rows import take_rows
from sdm.tiers.base import Tier
from sdm.tiers.io_engine import IOEngine
from sdm.tiers.lmdb import RowDB
from sdm.tiers.manifest import TableLayout
from sdm.tiers.rowfile import (HEADER_BYTES, IDENTITY, PAGE_BYTES, STALE, Damaged, RowFile,
                               build_rowfile, open_verified, order_digest, rowfile_path)
from sdm.validate import check_permutation

__all__ = ["MmapTier", "DAMAGE_LOG", "FileReplaced"]


class FileReplaced(Exception):
    """A read asked for the file of one database version (``built_version=``) and the file
    mapped for the table now is of another (a damaged file was replaced since)."""

#: Damage records kept in :meth:`MmapTier.stats` (``damage``).
DAMAGE_LOG = 100


class MmapTier(Tier):
    """Rows of each table read from its row file (derived from LMDB, rebuilt when stale).

    Holds every row; ``resident`` is None so every read goes through :meth:`read_rows`,
    where a device model sees the rows' offsets.

    ``row_order`` maps a table name to a ``(num_rows,) int64`` permutation (a
    :class:`sdm.store.placement.Placement`'s ``row_order``): that table's file holds row
    ``order[p]`` at position ``p``, and :meth:`row_offsets` reports where each row really
    is, so a device model counts the blocks the layout shares. Tables without an entry keep
    identity order. An order that is not a permutation of the table's rows raises
    ConfigError on the table's first read.

    ``io_engine`` serves :meth:`read_rows_direct`: the device's engine, shared with every
    other tier and request on it (a hierarchy passes one); without one the tier starts its own.

    ``accept_file(layout, built_version)``, when set (by :class:`~sdm.tiers.patched.PatchedTier`),
    judges a current, intact file found on disk before it is mapped: one it refuses is rebuilt
    from the calling thread's snapshot, like a stale one. A read given ``built_version``
    reads only a file of that version: if the file mapped is another one (rebuilt after
    damage, maybe by another process at another version), it raises :class:`FileReplaced`
    and reads nothing, so a caller that patched for one version is never served another's.
    """

    name = kind = "mmap"
    holds_all_rows = True
    supports_direct_io = True

    def __init__(self, db: RowDB, directory: str, row_order: Mapping[str, np.ndarray] | None = None,
                 *, io_engine: IOEngine | None = None):
        self._db = db
        self._directory = directory
        self._orders = dict(row_order or {})
        self._pos: dict[str, tuple[np.ndarray, np.ndarray, bytes]] = {}  # name -> order, pos, digest
        self._files: dict[int, RowFile] = {}
        self._lock = threading.Lock()
        self.io_engine = io_engine
        self._own_engine: IOEngine | None = None
        self._local = threading.local()
        self.accept_file = None
        self._rows = 0
        self._rebuilds = 0
        self._damage: deque[dict] = deque(maxlen=DAMAGE_LOG)
        self._damage_events = 0

    def _file(self, layout: TableLayout) -> RowFile:
        rf = self._files.get(layout.table_id)
        if rf is not None and rf.layout.generation == layout.generation:
            return rf
        with self._lock:
            rf = self._files.get(layout.table_id)
            if rf is not None and rf.layout.generation == layout.generation:
                return rf
            if rf is not None:  # another generation: retired (see RowFile.__del__)
                del self._files[layout.table_id]
            order, _, digest = self._order(layout)
            path = rowfile_path(self._directory, layout, digest)
            rf, why = open_verified(path, layout, digest)
            if rf is not None and self.accept_file is not None and not self.accept_file(layout, rf.built_version):
                rf.close()  # never mapped for a reader
                rf, why = None, STALE
            if rf is None:
                self._rebuild(layout, path, order, digest, None if why == STALE else why)
                rf, why = open_verified(path, layout, digest)
                if rf is None:
                    raise CorruptStoreError(f"SCM row file {path} for table {layout.name!r} fails "
                                            f"verification right after it was built: {why}",
                                            path=path, table=layout.name)
            self._files[layout.table_id] = rf
            return rf

    def built_version(self, layout: TableLayout) -> int:
        """The database version whose rows the file this tier reads for ``layout`` holds
        (mapped first, or built from the calling thread's snapshot, as for a read)."""
        return self._file(layout).built_version

    def _rebuild(self, layout, path, order, digest, damage: str | None) -> None:
        """Build ``layout``'s file from LMDB; ``damage`` (what was wrong, None for a missing
        or stale file) is recorded whether or not the build succeeds."""
        try:
            build_rowfile(self._db, self._directory, layout, order, digest)
        except BaseException as exc:
            if damage is not None:
                self._record(path, layout, damage, f"rebuild failed: {exc}")
            raise
        self._rebuilds += 1
        if damage is not None:
            self._record(path, layout, damage, "rebuilt")

    def _record(self, path, layout, what, action) -> None:
        self._damage.append({"file": path, "table": layout.name, "what": what, "action": action})
        self._damage_events += 1

    def _order(self, layout: TableLayout) -> tuple[np.ndarray | None, np.ndarray | None, bytes]:
        """(order, its inverse ``pos``, digest) of ``layout``'s table, validated and cached;
        (None, None, identity digest) when the table keeps identity order."""
        name = layout.name
        got = self._pos.get(name)
        if got is not None:
            return got
        order = self._orders.get(name)
        if order is None:
            return None, None, IDENTITY
        n = layout.spec.num_rows
        order = check_permutation(order, n, f"row order of table {name!r}", error=ConfigError)
        pos = np.empty(n, dtype=np.int64)
        pos[order] = np.arange(n, dtype=np.int64)
        got = (order, pos, order_digest(order))
        self._pos[name] = got
        return got

    def path_of(self, layout: TableLayout) -> str:
        """The row file this tier reads for ``layout``'s table (in its row order)."""
        return rowfile_path(self._directory, layout, self._order(layout)[2])

    def _positions(self, layout, ids) -> np.ndarray:
        pos = self._order(layout)[1]
        ids = np.asarray(ids, dtype=np.int64)
        return ids if pos is None else pos[ids]

    def _replace_damaged(self, layout, rf: RowFile, what: str) -> None:
        """``rf`` was found damaged while open: record it, rebuild it, stop using it."""
        with self._lock:
            if self._files.get(layout.table_id) is not rf:
                return  # another thread got here first
            del self._files[layout.table_id]  # retired (see RowFile.__del__)
            order, _, digest = self._order(layout)
            self._rebuild(layout, rf.path, order, digest, what)

    def _repaired(self, layout, read, built_version=None) -> None:
        """``read(rf)`` on ``layout``'s file (of ``built_version``, when given: see the class
        docstring); damage it finds (``Damaged``) is recorded, the file rebuilt from LMDB and
        ``read`` run once more on the new one."""
        rf = self._file_of(layout, built_version)
        try:
            return read(rf)
        except Damaged as exc:
            self._replace_damaged(layout, rf, str(exc))
        rf = self._file_of(layout, built_version)
        try:
            return read(rf)
        except Damaged as exc:
            raise CorruptStoreError(f"SCM row file {rf.path} for table {layout.name!r}: {exc} right "
                                    f"after it was rebuilt", path=rf.path, table=layout.name) from None

    def _file_of(self, layout, built_version) -> RowFile:
        rf = self._file(layout)
        if built_version is not None and rf.built_version != built_version:
            raise FileReplaced(f"{rf.path}: built at version {rf.built_version}, not {built_version}")
        return rf

    def read_rows(self, layout, ids, out, *, built_version=None):
        pos = self._positions(layout, ids)

        def read(rf):
            # A mapped file truncated under us would fault (SIGBUS) past its new end: one
            # fstat per batch catches it (a truncation racing this very read still faults).
            size = os.fstat(rf.fd).st_size
            if size < rf.size:
                raise Damaged(f"truncated while open: {size} bytes, expected {rf.size}")
            if rf.unchecked:
                rf.check_positions(pos)
            take_rows(rf.rows, pos, out)  # each row prefetched ahead (sdm.kernels.rows: 1.3-2.3x np.take)

        self._repaired(layout, read, built_version)
        self._rows += len(ids)

    def row_offsets(self, layout, ids):
        """Offsets in the row file, in the order of ``ids`` (not ascending under a row order)."""
        return HEADER_BYTES + self._positions(layout, ids) * layout.spec.row_bytes

    def read_rows_direct(self, layout, ids, out, *, queue_depth=1, built_version=None):
        """Read the 4 KiB pages covering rows ``ids`` with O_DIRECT into a page-aligned
        anonymous buffer, as ``queue_depth`` jobs on the IO engine (at most that many of this
        batch's reads outstanding); then copy the rows out. Every page is a real device read: the page cache is bypassed, and a
        page not checked yet is checked against its CRC as read.

        A short read (the file was truncated under us) or a page failing its CRC is damage:
        the file is recorded, rebuilt from LMDB and read once more."""
        self._repaired(layout, lambda rf: self._read_direct(rf, layout, ids, out, queue_depth), built_version)
        self._rows += len(ids)

    def _read_direct(self, rf, layout, ids, out, queue_depth):
        if rf.direct_fd is None:
            with self._lock:
                if rf.direct_fd is None:
                    # Through the open descriptor, not the path: the path may name a newer
                    # file by now (another process rebuilt it), the descriptor the mapped one.
                    try:
                        rf.direct_fd = os.open(f"/proc/self/fd/{rf.fd}", os.O_RDONLY | os.O_DIRECT)
                    except OSError as exc:
                        raise StoreError(f"cannot open {rf.path} with O_DIRECT: {exc}") from None
        width = layout.spec.row_bytes
        offsets = self.row_offsets(layout, ids)
        pages = block_ranges(offsets, width, PAGE_BYTES)
        if not len(pages):
            return
        buf = self._buffer(len(pages) * PAGE_BYTES)
        view = memoryview(buf)
        fd = rf.direct_fd
        page_list = pages.tolist()

        short = self._engine(queue_depth).read_pages(fd, page_list, view, PAGE_BYTES, queue_depth)
        if short:
            raise Damaged(f"short O_DIRECT read at page {page_list[short[0]]}")
        if rf.unchecked:  # file page k of the data is buffer page j: pages[j] == k + 1
            data_pages = pages - HEADER_BYTES // PAGE_BYTES
            todo = np.flatnonzero(~rf.checked[data_pages])
            rf.check_pages(data_pages[todo], view, todo * PAGE_BYTES)
        # Rows spanning pages span consecutive entries of `pages`, so they are contiguous here.
        at = np.searchsorted(pages, offsets // PAGE_BYTES) * PAGE_BYTES + offsets % PAGE_BYTES
        data = np.frombuffer(buf, dtype=np.uint8)
        np.take(data, at[:, None] + np.arange(width), out=out)
        del data, view

    def _buffer(self, nbytes: int) -> mmap.mmap:
        # Anonymous maps are page aligned, as O_DIRECT needs. One per calling thread, kept:
        # a fresh map per read would make the kernel fault and pin new pages every time
        # (measured: ~1.6x the latency of a reused buffer).
        buf = getattr(self._local, "buf", None)
        if buf is None or len(buf) < nbytes:
            if buf is not None:
                buf.close()
            buf = mmap.mmap(-1, max(nbytes, 16 * PAGE_BYTES))
            self._local.buf = buf
        return buf

    def _engine(self, queue_depth: int) -> IOEngine:
        """The device's shared engine, or (a tier used on its own) one of this tier's."""
        if self.io_engine is not None:
            return self.io_engine
        with self._lock:
            if self._own_engine is None or self._own_engine.depth < queue_depth:
                if self._own_engine is not None:
                    self._own_engine.close()
                self._own_engine = IOEngine(f"{self.name}-direct", queue_depth)
            return self._own_engine

    def invalidate(self, layout):
        with self._lock:
            self._files.pop(layout.table_id, None)  # retired (see RowFile.__del__)

    def stats(self):
        """``hits``, ``rebuilds`` (files built: missing, stale or damaged), ``damage_events``
        (damaged files found) and ``damage``, the last ``DAMAGE_LOG`` of them as
        ``{file, table, what, action}`` (action ``rebuilt``, or ``rebuild failed: ...``)."""
        with self._lock:
            damage = [dict(d) for d in self._damage]
        return {"hits": self._rows, "misses": 0, "rebuilds": self._rebuilds,
                "damage_events": self._damage_events, "damage": damage}

    def close(self):
        with self._lock:
            files, self._files = self._files, {}
            engine, self._own_engine = self._own_engine, None
        for rf in files.values():
            rf.close()
        if engine is not None:  # a shared engine is closed by its owner
            engine.close()

"""The SCM tier: a page-aligned row file per table, read through mmap (or O_DIRECT).

The row file is derived from the LMDB durable copy and rebuildable at any time::

    scm/t<table_id>.rows
        [0, 4096)        header: magic, version, table id, generation, num_rows, row_bytes,
                         data bytes, CRC32 of the data, CRC32 of the header
        [4096, ...)      row i at 4096 + i * row_bytes (rows packed, so with a 512 B device
                         a row may straddle two blocks and cost two reads), padded to a
                         whole 4 KiB page so O_DIRECT can read the last one

A file is used only when its header matches the table's committed generation and geometry
and its data matches its CRC32 (checked once per open); otherwise — missing, stale after a
``write_table``, damaged — it is rebuilt from LMDB: streamed a block at a time into a
temporary file, fsynced, renamed over the old one, directory fsynced. Readers holding the
old file keep their mapping (rename keeps the inode).
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from sdm.devices import block_ranges
from sdm.errors import StoreError
from sdm.manifest import TableLayout, fsync_dir
from sdm.tiers.base import Tier
from sdm.tiers.lmdb import RowDB

__all__ = ["MmapTier", "ROWFILE_DIRNAME", "HEADER_BYTES", "rowfile_path"]

ROWFILE_DIRNAME = "scm"
HEADER_BYTES = 4096
PAGE_BYTES = 4096
_MAGIC = b"SDMROWS\x00"
_VERSION = 1
_HEAD = struct.Struct("<8sIIQQQQI")  # magic, version, table id, generation, rows, row bytes, data bytes, data crc
_HEAD_CRC = struct.Struct("<I")


def rowfile_path(directory: str, layout: TableLayout) -> str:
    return os.path.join(directory, ROWFILE_DIRNAME, f"t{layout.table_id}.rows")


def _padded(nbytes: int) -> int:
    return -(-nbytes // PAGE_BYTES) * PAGE_BYTES


def _header(layout: TableLayout, data_bytes: int, crc: int) -> bytes:
    head = _HEAD.pack(_MAGIC, _VERSION, layout.table_id, layout.generation, layout.spec.num_rows,
                      layout.spec.row_bytes, data_bytes, crc)
    return head + _HEAD_CRC.pack(zlib.crc32(head))


class _RowFile:
    """One open, verified row file: its mmap, a ``(num_rows, row_bytes)`` view, and an
    O_DIRECT descriptor opened on first direct read."""

    def __init__(self, path: str, layout: TableLayout, fd: int, mm: mmap.mmap):
        self.path = path
        self.layout = layout
        self.fd = fd
        self.mmap = mm
        n, width = layout.spec.num_rows, layout.spec.row_bytes
        self.rows = np.frombuffer(mm, dtype=np.uint8, count=n * width, offset=HEADER_BYTES).reshape(n, width)
        self.direct_fd: int | None = None

    def close(self) -> None:
        self.rows = None
        # A view still exported by an in-flight read keeps the map alive; the GC closes it.
        try:
            self.mmap.close()
        except BufferError:
            pass
        os.close(self.fd)
        if self.direct_fd is not None:
            os.close(self.direct_fd)


def _open_verified(path: str, layout: TableLayout) -> _RowFile | None:
    """The row file at ``path`` if it is current and intact for ``layout``, else None."""
    data_bytes = layout.spec.num_rows * layout.spec.row_bytes
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        if os.fstat(fd).st_size != HEADER_BYTES + _padded(data_bytes):
            os.close(fd)
            return None
        mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    except OSError:
        os.close(fd)
        return None
    head = mm[:_HEAD.size + _HEAD_CRC.size]
    fields = _HEAD.unpack_from(head)
    want = (_MAGIC, _VERSION, layout.table_id, layout.generation, layout.spec.num_rows,
            layout.spec.row_bytes, data_bytes)
    ok = (_HEAD_CRC.unpack_from(head, _HEAD.size)[0] == zlib.crc32(head[:_HEAD.size])
          and fields[:7] == want
          and zlib.crc32(memoryview(mm)[HEADER_BYTES:HEADER_BYTES + data_bytes]) == fields[7])
    if not ok:
        mm.close()
        os.close(fd)
        return None
    return _RowFile(path, layout, fd, mm)


def build_rowfile(db: RowDB, directory: str, layout: TableLayout) -> str:
    """Write ``layout``'s row file from LMDB atomically; returns its path."""
    path = rowfile_path(directory, layout)
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    data_bytes = layout.spec.num_rows * layout.spec.row_bytes
    try:
        with open(tmp, "wb") as f:
            f.write(bytes(HEADER_BYTES))
            crc = 0
            for rows in db.iter_blocks(layout):
                crc = zlib.crc32(rows, crc)
                f.write(rows)
            f.write(bytes(_padded(data_bytes) - data_bytes))
            f.seek(0)
            f.write(_header(layout, data_bytes, crc))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(folder)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StoreError(f"cannot write SCM row file {path} for table {layout.name!r}: {exc}") from None
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


class MmapTier(Tier):
    """Rows of each table read from its row file (derived from LMDB, rebuilt when stale).

    Holds every row; ``resident`` is None so every read goes through :meth:`read_rows`,
    where a device model sees the rows' offsets.
    """

    name = "mmap"
    holds_all_rows = True
    supports_direct_io = True

    def __init__(self, db: RowDB, directory: str):
        self._db = db
        self._directory = directory
        self._files: dict[int, _RowFile] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        self._local = threading.local()
        self._rows = 0
        self._rebuilds = 0

    def _file(self, layout: TableLayout) -> _RowFile:
        rf = self._files.get(layout.table_id)
        if rf is not None and rf.layout.generation == layout.generation:
            return rf
        with self._lock:
            rf = self._files.get(layout.table_id)
            if rf is not None and rf.layout.generation == layout.generation:
                return rf
            if rf is not None:
                rf.close()
                del self._files[layout.table_id]
            path = rowfile_path(self._directory, layout)
            rf = _open_verified(path, layout)
            if rf is None:
                build_rowfile(self._db, self._directory, layout)
                self._rebuilds += 1
                rf = _open_verified(path, layout)
                if rf is None:
                    raise StoreError(f"SCM row file {path} for table {layout.name!r} fails "
                                     f"verification right after it was built")
            self._files[layout.table_id] = rf
            return rf

    def read_rows(self, layout, ids, out):
        np.take(self._file(layout).rows, ids, axis=0, out=out)
        self._rows += len(ids)

    def row_offsets(self, layout, ids):
        return HEADER_BYTES + np.asarray(ids, dtype=np.int64) * layout.spec.row_bytes

    def read_rows_direct(self, layout, ids, out, *, queue_depth=1):
        """Read the 4 KiB pages covering rows ``ids`` with O_DIRECT, ``queue_depth`` reads in
        flight (one worker thread each), into page-aligned anonymous buffers; then copy
        the rows out. Every page is a real device read: the page cache is bypassed."""
        rf = self._file(layout)
        if rf.direct_fd is None:
            with self._lock:
                if rf.direct_fd is None:
                    try:
                        rf.direct_fd = os.open(rf.path, os.O_RDONLY | os.O_DIRECT)
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

        def read_some(start: int) -> None:
            for j in range(start, len(page_list), queue_depth):
                got = os.preadv(fd, [view[j * PAGE_BYTES:(j + 1) * PAGE_BYTES]], page_list[j] * PAGE_BYTES)
                if got != PAGE_BYTES:
                    raise StoreError(f"short O_DIRECT read of {rf.path} at page {page_list[j]}: {got} bytes")

        workers = min(queue_depth, len(page_list))
        if workers == 1:
            read_some(0)
        else:
            for f in [self._executor(queue_depth).submit(read_some, w) for w in range(workers)]:
                f.result()
        # Rows spanning pages span consecutive entries of `pages`, so they are contiguous here.
        at = np.searchsorted(pages, offsets // PAGE_BYTES) * PAGE_BYTES + offsets % PAGE_BYTES
        data = np.frombuffer(buf, dtype=np.uint8)
        np.take(data, at[:, None] + np.arange(width), out=out)
        del data, view
        self._rows += len(ids)

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

    def _executor(self, size: int) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._pool_size < size:
                if self._pool is not None:
                    self._pool.shutdown(wait=False)
                self._pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="sdm-direct")
                self._pool_size = size
            return self._pool

    def invalidate(self, layout):
        with self._lock:
            rf = self._files.pop(layout.table_id, None)
        if rf is not None:
            rf.close()

    def stats(self):
        return {"hits": self._rows, "misses": 0, "rebuilds": self._rebuilds}

    def close(self):
        with self._lock:
            files, self._files = self._files, {}
            pool, self._pool = self._pool, None
        for rf in files.values():
            rf.close()
        if pool is not None:
            pool.shutdown(wait=True)

"""The SCM row file: a page-aligned copy of a table's rows, for mmap and O_DIRECT reads.

The row file is derived from the LMDB durable copy and rebuildable at any time::

    scm/t<table_id>.rows (identity order) or scm/t<table_id>-<12 hex digits>.rows (a row
    order, named by its SHA-256)
        [0, 4096)        header: magic, version, table id, generation, num_rows, row_bytes,
                         data bytes, CRC32 of the page-checksum table, SHA-256 of the row
                         order (zeros for identity order), the database version its rows
                         were read at, CRC32 of the whole header page
        [4096, 4096 + D) the row at position p at 4096 + p * row_bytes (rows packed, so with
                         a 512 B device a row may straddle two blocks and cost two reads),
                         padded to D, a whole number of 4 KiB pages, so O_DIRECT can read
                         the last one
        [4096 + D, end)  the page-checksum table: a little-endian CRC32 per 4 KiB data page
                         (padding included), zero padded to a whole page

Positions are row ids unless the tier is given a row order for the table (a placement's
``row_order``: ``order[p]`` is the row at position p, so rows looked up together can share
device blocks); reads then map ids through ``pos = inverse(order)``.

A file holds its rows as of one database version, which its header names (the builder reads
every row in one LMDB snapshot); a reader whose snapshot is of another version patches the rows
updated in between (:mod:`sdm.tiers.patched`). A file is used only
when its header matches the table's committed generation, geometry and row order, its size is right and its page-checksum table matches its CRC32 (checked when the
file is opened: a 4-byte read per 4 KiB page, so opening costs 0.1% of the file, not all of
it); otherwise — missing, stale after a ``write_table``, built for another order, damaged —
it is rebuilt from LMDB: streamed a chunk at a time into a temporary file, fsynced, renamed
over the old one, directory fsynced. Readers holding the old file keep their mapping
(rename keeps the inode). Each data page is checked against its CRC32 the first time a read
touches it (a bitmap per open file remembers the pages checked, so a page costs one CRC per
process, not one per read).

Stale is not damage: a file whose header is intact (its CRC holds) but names another
generation, row order or format version is simply rebuilt. Damage — a header that fails its
CRC, an intact header for this generation whose geometry or file size is wrong, a page
table or a data page that fails its CRC, an O_DIRECT read that comes back short — is
rebuilt too (the read that found it is served again from the new file), and recorded in
:meth:`MmapTier.stats` (``damage_events`` and the last ``DAMAGE_LOG`` records under
``damage``), so rows are still served, from the LMDB copy, while the damage shows.

What is not detected: a page changed in place after it was checked (sdm never does that:
rebuilds write a new inode) serves what it now holds; and a mapped file truncated in place
by another process between a read's size check and its access faults (SIGBUS). Truncation
seen by that check (one fstat per batch) or by an O_DIRECT read coming back short is damage
(recorded, rebuilt, read again).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import struct
import threading
import uuid
import zlib

import numpy as np

from sdm.kernels.jit import jit
from sdm.errors import StoreError
from sdm.tiers.manifest import TableLayout, fsync_dir
from sdm.tiers.lmdb import RowDB

__all__ = ["ROWFILE_DIRNAME", "HEADER_BYTES", "PAGE_BYTES", "RowFile", "build_rowfile", "open_verified",
           "rowfile_path", "built_version_on_disk", "order_digest", "Damaged", "STALE", "IDENTITY"]

ROWFILE_DIRNAME = "scm"
HEADER_BYTES = 4096
PAGE_BYTES = 4096
_MAGIC = b"SDMROWS\x00"
# 2: the row order's digest. 3: the CRCs cover the whole header page and the data's padding.
# 4: a CRC32 per data page, checked on first read instead of the whole data on open.
# 5: the database version the rows were read at.
# Files are derived data: older versions are stale and rebuilt.
_VERSION = 5
# magic, version, table id, generation, rows, row bytes, data bytes, page-table crc, order
# digest, database version of the rows
_HEAD = struct.Struct("<8sIIQQQQI32sQ")
IDENTITY = bytes(32)
_SIBLING = re.compile(r"t(\d+)(-[0-9a-f]{12})?\.rows")
# Rows gathered per chunk when building a file in a row order (bounds the builder's memory).
_BUILD_CHUNK_BYTES = 32 << 20
_HEAD_CRC = struct.Struct("<I")
_CRC_AT = _HEAD.size  # the header CRC's offset; it covers every other byte of the page
# An intact older header is stale, not damage. Versions 1-2: their header's size, followed by
# a CRC of only those bytes; 3-4: their header's size, followed by a CRC of the whole page.
_OLD_HEADS = {1: 44, 2: 84}
_OLD_PAGE_HEADS = {3: 84, 4: 84}
_PAGE_CRC = np.dtype("<u4")
_GENERATION_AT = struct.calcsize("<8sII")  # where every version's header holds the generation
STALE = "stale"  # open_verified's reason for a file of another generation or order: not damage


def rowfile_path(directory: str, layout: TableLayout, digest: bytes = IDENTITY) -> str:
    """The row file of ``layout``'s table in the row order of SHA-256 ``digest``:
    ``scm/t<id>.rows`` in identity order, ``scm/t<id>-<12 hex digits of digest>.rows`` in
    another, so processes serving one table in different orders do not rebuild each other's
    file."""
    suffix = "" if digest == IDENTITY else "-" + digest[:6].hex()
    return os.path.join(directory, ROWFILE_DIRNAME, f"t{layout.table_id}{suffix}.rows")


def _padded(nbytes: int) -> int:
    return -(-nbytes // PAGE_BYTES) * PAGE_BYTES


def _file_bytes(data_bytes: int) -> tuple[int, int]:
    """(padded data bytes D, padded page-table bytes) of a file holding ``data_bytes``."""
    data = _padded(data_bytes)
    return data, _padded(data // PAGE_BYTES * _PAGE_CRC.itemsize)


def _header_crc(page: bytes, at: int = _CRC_AT) -> int:
    """The CRC32 of a header page but for the 4 bytes at ``at``, where it is stored."""
    return zlib.crc32(page[at + _HEAD_CRC.size:HEADER_BYTES], zlib.crc32(page[:at]))


def _header(layout: TableLayout, data_bytes: int, crc: int, digest: bytes, built_version: int) -> bytes:
    """The whole header page."""
    head = _HEAD.pack(_MAGIC, _VERSION, layout.table_id, layout.generation, layout.spec.num_rows,
                      layout.spec.row_bytes, data_bytes, crc, digest, built_version)
    page = head + bytes(HEADER_BYTES - len(head))
    return head + _HEAD_CRC.pack(_header_crc(page)) + page[_CRC_AT + _HEAD_CRC.size:]


def order_digest(order: np.ndarray | None) -> bytes:
    """SHA-256 of a row order as little-endian int64 (32 zero bytes for identity order)."""
    if order is None:
        return IDENTITY
    return hashlib.sha256(np.ascontiguousarray(order, dtype="<i8").data).digest()


class Damaged(Exception):
    """A read found its row file damaged (internal: the tier records it and rebuilds)."""


@jit
def _unchecked_pages(pos, width, checked, out):
    """Write to ``out`` the data pages holding rows at positions ``pos`` (``width`` bytes
    each) that are not ``checked`` yet, repeats allowed; returns how many. A pass over the
    positions, so a batch whose pages are all checked costs ~1 ns a row."""
    n = 0
    for i in range(pos.shape[0]):
        start = pos[i] * width
        for p in range(start // 4096, (start + width - 1) // 4096 + 1):
            if not checked[p]:
                out[n] = p
                n += 1
    return n


class RowFile:
    """One open row file (header and page table verified): its mmap, a ``(num_rows,
    row_bytes)`` view, the page CRCs and which pages have been checked against them, an
    O_DIRECT descriptor opened on first direct read, and ``built_version``: the database
    version its rows are of."""

    def __init__(self, path: str, layout: TableLayout, fd: int, mm: mmap.mmap, data_bytes: int,
                 built_version: int):
        self.path = path
        self.layout = layout
        self.built_version = built_version
        self.fd = fd
        self.mmap = mm
        self.size = len(mm)
        n, width = layout.spec.num_rows, layout.spec.row_bytes
        self.rows = np.frombuffer(mm, dtype=np.uint8, count=n * width, offset=HEADER_BYTES).reshape(n, width)
        pages = data_bytes // PAGE_BYTES
        self.data = memoryview(mm)[HEADER_BYTES:HEADER_BYTES + data_bytes]
        self.crcs = np.frombuffer(mm, dtype=_PAGE_CRC, count=pages, offset=HEADER_BYTES + data_bytes)
        self.checked = np.zeros(pages, dtype=np.bool_)
        self.unchecked = pages
        self._check_lock = threading.Lock()
        self.direct_fd: int | None = None
        self._owns_fds = True  # set last: a half-built one leaves its fd to the opener

    def check_positions(self, pos: np.ndarray) -> None:
        """Check every page holding the rows at positions ``pos`` not checked yet (through
        the mapping); raises Damaged at the first that fails its CRC."""
        width = self.layout.spec.row_bytes
        per_row = (width + PAGE_BYTES - 2) // PAGE_BYTES + 1  # pages a row can span
        found = np.empty(len(pos) * per_row, dtype=np.int64)
        n = _unchecked_pages(pos, width, self.checked, found)
        if n:  # once warm, most batches find every page checked: no sort, no call
            pages = np.unique(found[:n])
            self.check_pages(pages, self.data, pages * PAGE_BYTES)

    def check_pages(self, pages: np.ndarray, view, starts: np.ndarray) -> None:
        """Check distinct data ``pages`` whose bytes are ``view[starts[i]:][:4096]``; raises
        Damaged at the first that fails its CRC, else marks them checked."""
        if not len(pages):
            return
        got = np.fromiter((zlib.crc32(view[s:s + PAGE_BYTES]) for s in starts.tolist()),
                          dtype=np.uint32, count=len(pages))
        bad = np.flatnonzero(got != self.crcs[pages])
        if len(bad):
            raise Damaged(f"data page {int(pages[bad[0]])} fails its CRC32")
        with self._check_lock:  # the count must not drop twice for one page
            self.unchecked -= int(np.count_nonzero(~self.checked[pages]))
            self.checked[pages] = True

    def close(self) -> None:
        """Release the file now (the tier is closing: no read is in flight)."""
        self.rows = self.crcs = None
        self.data.release()
        # A view still exported by a caller keeps the map alive; the GC closes it.
        try:
            self.mmap.close()
        except BufferError:
            pass
        self._close_fds()

    def __del__(self):
        # A file retired while other threads may still be reading it (replaced after damage,
        # a publish or an update) is dropped, not closed: closing its descriptors under a
        # reader could hand the reader another file's descriptor number. They close here,
        # when the last reader lets go.
        self._close_fds()

    def _close_fds(self) -> None:
        if not getattr(self, "_owns_fds", False):
            return
        self._owns_fds = False
        for fd in (self.fd, self.direct_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass


def open_verified(path: str, layout: TableLayout,
                   digest: bytes = IDENTITY) -> tuple[RowFile | None, str | None]:
    """``(row file, None)`` if the file at ``path`` is current and intact for ``layout`` and
    the row order of SHA-256 ``digest``; else ``(None, why)``: why is None for a missing
    file, ``STALE`` for an intact file of another generation, order or format version, and
    otherwise names the damage."""
    data_bytes = layout.spec.num_rows * layout.spec.row_bytes
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"cannot be opened: {exc}"
    rf = None
    try:
        rf, why = _verify(fd, path, layout, digest, data_bytes)
        return rf, why
    except OSError as exc:
        return None, f"cannot be read: {exc}"
    finally:
        if rf is None:
            os.close(fd)


def _intact_version(page: bytes) -> int | None:
    """The format version of a header page whose CRC holds in that version's layout, or None
    (not a row file's header, or damaged). Every version keeps magic, version, table id and
    generation first."""
    if len(page) < HEADER_BYTES or page[:8] != _MAGIC:
        return None
    version = struct.unpack_from("<I", page, 8)[0]
    if version in _OLD_HEADS:
        n = _OLD_HEADS[version]
        intact = _HEAD_CRC.unpack_from(page, n)[0] == zlib.crc32(page[:n])
    elif version in _OLD_PAGE_HEADS:
        n = _OLD_PAGE_HEADS[version]
        intact = _HEAD_CRC.unpack_from(page, n)[0] == _header_crc(page, n)
    else:
        intact = version == _VERSION and _HEAD_CRC.unpack_from(page, _CRC_AT)[0] == _header_crc(page)
    return version if intact else None


def built_version_on_disk(path: str) -> int | None:
    """The database version named by the intact current-format header of the file at
    ``path`` (one 4 KiB read); None when there is none: missing, damaged or of an older
    format."""
    try:
        page = _header_page(path)
    except OSError:
        return None
    return _HEAD.unpack_from(page)[9] if _intact_version(page) == _VERSION else None


def _header_page(path: str) -> bytes:
    """The first :data:`HEADER_BYTES` of the file at ``path`` (fewer if it is shorter)."""
    with open(path, "rb") as f:
        return f.read(HEADER_BYTES)


def _verify(fd: int, path: str, layout: TableLayout, digest: bytes,
            data_bytes: int) -> tuple[RowFile | None, str | None]:
    size = os.fstat(fd).st_size
    page = os.pread(fd, HEADER_BYTES, 0)
    if len(page) < HEADER_BYTES:
        return None, f"truncated: {size} bytes, shorter than its {HEADER_BYTES}-byte header"
    if _intact_version(page) not in (None, _VERSION):
        return None, STALE
    if _HEAD_CRC.unpack_from(page, _CRC_AT)[0] != _header_crc(page):
        return None, "header fails its CRC32"
    fields = _HEAD.unpack_from(page)
    if fields[0] != _MAGIC or fields[1] != _VERSION:
        return None, f"header has magic {fields[0]!r} version {fields[1]} under an intact CRC"
    if fields[3] != layout.generation or fields[8] != digest:
        return None, STALE
    want = (layout.table_id, layout.spec.num_rows, layout.spec.row_bytes, data_bytes)
    got = (fields[2],) + fields[4:7]
    if got != want:
        return None, f"header geometry (table id, rows, row bytes, data bytes) {got} is not the table's {want}"
    padded, table = _file_bytes(data_bytes)
    expect = HEADER_BYTES + padded + table
    if size != expect:
        return None, f"{'truncated' if size < expect else 'extended'}: {size} bytes, expected {expect}"
    if zlib.crc32(os.pread(fd, table, HEADER_BYTES + padded)) != fields[7]:
        return None, "page-checksum table fails its CRC32"
    mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    return RowFile(path, layout, fd, mm, padded, fields[9]), None


def _ordered_rows(db: RowDB, layout: TableLayout, order: np.ndarray):
    """Yield the rows of ``layout`` at positions ``order`` in chunks of at most
    ``_BUILD_CHUNK_BYTES``: each chunk's ids are read sorted (as RowDB reads them) and
    scattered back into position order."""
    width = layout.spec.row_bytes
    step = max(1, _BUILD_CHUNK_BYTES // width)
    sorted_rows = np.empty((min(step, len(order)), width), dtype=np.uint8)
    rows = np.empty_like(sorted_rows)
    for start in range(0, len(order), step):
        ids = order[start:start + step]
        by_id = np.argsort(ids, kind="stable")
        k = len(ids)
        db.read_rows(layout, ids[by_id], sorted_rows[:k])
        rows[:k][by_id] = sorted_rows[:k]
        yield rows[:k]


class _PageCrcs:
    """CRC32s of consecutive 4 KiB pages of a byte stream fed in chunks of any size (staged
    so pages are hashed from whole buffers: a chunk is one append, a page one crc32 call)."""

    _STAGE = 1 << 20

    def __init__(self):
        self.crcs: list[int] = []
        self.stage = bytearray()

    def add(self, chunk) -> None:
        self.stage += memoryview(chunk).cast("B")
        if len(self.stage) >= self._STAGE:
            self._drain()

    def _drain(self) -> None:
        full = len(self.stage) // PAGE_BYTES * PAGE_BYTES
        view = memoryview(self.stage)
        self.crcs += [zlib.crc32(view[i:i + PAGE_BYTES]) for i in range(0, full, PAGE_BYTES)]
        view.release()
        del self.stage[:full]

    def table(self) -> bytes:
        """The page table (the stream must have ended on a page boundary), zero padded."""
        self._drain()
        if self.stage:
            raise ValueError("page CRCs of a stream that ends mid-page")
        raw = np.asarray(self.crcs, dtype=_PAGE_CRC).tobytes()
        return raw + bytes(_padded(len(raw)) - len(raw))


def build_rowfile(db: RowDB, directory: str, layout: TableLayout,
                  order: np.ndarray | None = None, digest: bytes | None = None) -> str:
    """Write ``layout``'s row file from LMDB atomically, rows in ``order`` (``(num_rows,)
    int64`` permutation; None = identity; ``digest`` its :func:`order_digest` when known);
    returns its path. Every row is read in one snapshot (the calling thread's, if it holds
    one), whose database version the header records. Files of the same table for older
    generations (any order) are deleted after it is in place."""
    digest = order_digest(order) if digest is None else digest
    path = rowfile_path(directory, layout, digest)
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    data_bytes = layout.spec.num_rows * layout.spec.row_bytes
    try:
        with db.snapshot() as txn, open(tmp, "wb") as f:
            built_version = db.version(txn)
            f.write(bytes(HEADER_BYTES))
            page_crcs = _PageCrcs()
            chunks = db.iter_blocks(layout) if order is None else _ordered_rows(db, layout, order)
            for rows in chunks:
                page_crcs.add(rows)
                f.write(rows)
            padding = bytes(_padded(data_bytes) - data_bytes)
            page_crcs.add(padding)
            f.write(padding)
            table = page_crcs.table()
            f.write(table)
            f.seek(0)
            f.write(_header(layout, data_bytes, zlib.crc32(table), digest, built_version))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(folder)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        # CorruptStoreError (damaged LMDB rows) is an OSError too: it passes as it is, naming
        # the damaged file; only real IO errors of the row file are wrapped.
        if isinstance(exc, OSError) and not isinstance(exc, StoreError):
            raise StoreError(f"cannot write SCM row file {path} for table {layout.name!r}: {exc}") from None
        raise
    _drop_older_generations(folder, layout)
    return path


def _drop_older_generations(folder: str, layout: TableLayout) -> None:
    """Unlink row files of ``layout``'s table whose intact header, in any format version,
    names an older generation (processes still serving that generation keep their mapping:
    unlink keeps the inode). Files of the current generation in other orders, and damaged
    files, are left to whoever opens them."""
    for name in os.listdir(folder):
        m = _SIBLING.fullmatch(name)
        if m is None or int(m.group(1)) != layout.table_id:
            continue
        path = os.path.join(folder, name)
        try:
            page = _header_page(path)
            if (_intact_version(page) is not None
                    and struct.unpack_from("<Q", page, _GENERATION_AT)[0] < layout.generation):
                os.unlink(path)
        except OSError:
            pass  # gone already, or unreadable: not ours to judge here



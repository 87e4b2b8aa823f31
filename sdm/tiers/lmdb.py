"""The durable copy of every row: an LMDB environment of checksummed device blocks.

Layout: key ``>IIQ`` = (generation, table id, block number), so keys sort by generation,
then table, then block; a new generation is always appended past every existing key (fast
bulk loads with ``MDB_APPEND``). Value = CRC32 of key and payload (4 bytes, little-endian; the key is
included so a damaged key cannot pass another block off as its own)
followed by the block's whole rows (``rows_per_block * row_bytes`` bytes, the last block of
a table may be shorter). One value fits one 4 KiB LMDB overflow page, so one value is one
device read: read amplification is real, not assumed.

A table's rows become visible only when the manifest names their generation; generations
the manifest does not name (a write that was killed, or one just superseded) are garbage
and are deleted before the next write.

Generation 0 is never a table's: its keys hold the store's *version* and *change log*.
``update_rows`` rewrites the blocks holding the changed rows in place, in one write
transaction that also appends a log entry ``(version, table, generation, ids)`` and bumps
the version, so a delta is atomic: a reader's transaction (LMDB MVCC) sees all of it or
none. The log is how every process holding copies of rows (caches, SCM row files) learns
exactly which rows changed; entries of a table's superseded generations are dropped when a
new generation is published.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from contextlib import contextmanager
from typing import Iterable

import lmdb
import numpy as np

from sdm.errors import CorruptStoreError, StoreError
from sdm.kernels.memory import huge_empty
from sdm.tiers.manifest import CHECKSUM_BYTES, LMDB_PAGE_BYTES, LMDB_VALUE_BYTES, TableLayout
from sdm.tiers.lmdb_check import MetaGone, TreeDamage, check_tree
from sdm.tiers.base import Tier

__all__ = ["RowDB", "LmdbTier", "LMDB_DIRNAME", "check_snapshot"]

LMDB_DIRNAME = "rows.lmdb"
_KEY = struct.Struct(">IIQ")
_CRC = struct.Struct("<I")
MAP_SIZE = 1 << 40  # address space only; the file grows with the data
COMMIT_BYTES = 32 << 20  # rows per write transaction, bounding a writer's dirty pages
_TREE_CHECK_TRIES = 8


# py-lmdb allows one Environment per path per process; stores opened twice share it.
_ENVS: dict[str, list] = {}  # realpath -> [env, open count, readonly]
_ENVS_LOCK = threading.Lock()


def _acquire_env(path: str, *, create: bool, readonly: bool) -> lmdb.Environment:
    key = os.path.realpath(path)
    with _ENVS_LOCK:
        entry = _ENVS.get(key)
        if entry is not None:
            if entry[2] and not readonly:
                raise StoreError(f"row database {path} is already open read-only in this process")
            entry[1] += 1
            return entry[0]
        try:
            # sync=False: commits are made durable by one explicit sync before the manifest,
            # the store's single commit point, names the new rows.
            env = lmdb.open(path, map_size=MAP_SIZE, subdir=True, create=create, readonly=readonly,
                            sync=False, metasync=False, readahead=False, max_readers=256, lock=True)
        except lmdb.Error as exc:
            data = os.path.join(path, "data.mdb")
            raise CorruptStoreError(f"row database {data} cannot be opened (damaged?): {exc}",
                                    path=data) from None
        _ENVS[key] = [env, 1, readonly]
        return env


def _release_env(path: str) -> None:
    key = os.path.realpath(path)
    with _ENVS_LOCK:
        entry = _ENVS[key]
        entry[1] -= 1
        if entry[1] == 0:
            del _ENVS[key]
            entry[0].close()


def check_snapshot(env: lmdb.Environment, data_path: str, psize: int) -> None:
    """:func:`check_tree` on the snapshot of a read transaction: while it is held, no writer
    (in any process) reuses its pages. A writer that commits twice meanwhile overwrites its
    meta page (LMDB keeps two), so its root is gone: the walk retries on a newer snapshot.
    Raises TreeDamage."""
    for _ in range(_TREE_CHECK_TRIES):
        with env.begin() as txn:
            try:
                check_tree(data_path, psize, txn.id())
                return
            except MetaGone:
                continue
    raise TreeDamage(f"no meta page names the current transaction ({_TREE_CHECK_TRIES} tries)")


def block_key(generation: int, table_id: int, block: int) -> bytes:
    return _KEY.pack(generation, table_id, block)


# Generation 0 holds metadata: (0, 0, 0) the version record, (0, 1, v) the log entry of version v.
_VERSION_KEY = block_key(0, 0, 0)
_VERSION = struct.Struct("<Q")
_LOG_HEAD = struct.Struct("<IIQ")  # table id, generation, number of ids


def _log_key(version: int) -> bytes:
    return block_key(0, 1, version)


def _sealed(key: bytes, payload: bytes) -> bytes:
    return _CRC.pack(zlib.crc32(payload, zlib.crc32(key))) + payload


def block_pages(layout: TableLayout) -> int:
    """LMDB overflow pages one block of ``layout`` occupies (1 unless one row is wider)."""
    value = layout.rows_per_block * layout.spec.row_bytes + CHECKSUM_BYTES
    return -(-(value + LMDB_PAGE_BYTES - LMDB_VALUE_BYTES) // LMDB_PAGE_BYTES)


class RowDB:
    """The store's LMDB environment: checksummed block reads, generation writes and deletes."""

    def __init__(self, directory: str, *, create: bool = False, readonly: bool = False):
        self.path = os.path.join(directory, LMDB_DIRNAME)
        self.data_path = os.path.join(self.path, "data.mdb")
        if not create and not os.path.isfile(self.data_path):
            raise CorruptStoreError(f"store {directory} has no row database ({self.data_path} is missing)",
                                    path=self.data_path)
        self.env = _acquire_env(self.path, create=create, readonly=readonly)
        self._local = threading.local()  # the calling thread's snapshot transaction, if any
        try:
            self._check_size()
        except BaseException:
            _release_env(self.path)
            raise

    # -- snapshots -------------------------------------------------------------------

    @contextmanager
    def snapshot(self):
        """Every read of the calling thread inside the block sees one version of the database
        (one LMDB read transaction); nested calls share the outer one. Yields the transaction."""
        txn = getattr(self._local, "txn", None)
        if txn is not None:
            yield txn
            return
        try:
            txn = self.env.begin(buffers=True)
        except lmdb.Error as exc:
            raise CorruptStoreError(f"row database {self.data_path}: {exc}", path=self.data_path) from None
        self._local.txn = txn
        try:
            yield txn
        finally:
            self._local.txn = None
            txn.abort()

    def version(self, txn=None) -> int:
        """The database's version: 0 for a store never updated, +1 per ``update_rows``."""
        with self.snapshot() if txn is None else _given(txn) as t, self._corruption():
            value = t.get(_VERSION_KEY)
        if value is None:
            return 0
        value = bytes(value)
        if len(value) != _CRC.size + _VERSION.size or _CRC.unpack_from(value)[0] != zlib.crc32(
                value[_CRC.size:], zlib.crc32(_VERSION_KEY)):
            raise CorruptStoreError(f"row database {self.data_path}: the version record is damaged",
                                    path=self.data_path)
        return _VERSION.unpack_from(value, _CRC.size)[0]

    def changes(self, after: int = 0, txn=None) -> list[tuple[int, int, int, np.ndarray]]:
        """Log entries of versions ``> after``, ascending: ``(version, table id, generation,
        ids)`` with ``ids`` sorted unique int64 (checksums verified)."""
        out = []
        with self.snapshot() if txn is None else _given(txn) as t, self._corruption():
            cur = t.cursor()
            if not cur.set_range(_log_key(after + 1)):
                return out
            for key, value in cur:
                key = bytes(key)
                gen, kind, version = _KEY.unpack(key)
                if gen != 0 or kind != 1:
                    break
                value = bytes(value)
                if len(value) < _CRC.size + _LOG_HEAD.size or _CRC.unpack_from(value)[0] != zlib.crc32(
                        value[_CRC.size:], zlib.crc32(key)):
                    raise CorruptStoreError(f"row database {self.data_path}: change log entry of version "
                                            f"{version} is damaged", path=self.data_path)
                table_id, generation, n = _LOG_HEAD.unpack_from(value, _CRC.size)
                ids = np.frombuffer(value, dtype="<i8", offset=_CRC.size + _LOG_HEAD.size)
                if len(ids) != n:
                    raise CorruptStoreError(f"row database {self.data_path}: change log entry of version "
                                            f"{version} holds {len(ids)} ids, its header says {n}",
                                            path=self.data_path)
                out.append((version, table_id, generation, ids.astype(np.int64)))
        return out

    @contextmanager
    def _corruption(self, table: str | None = None):
        """LMDB errors inside the block (a damaged B-tree page) raised as CorruptStoreError."""
        try:
            yield
        except lmdb.Error as exc:
            raise CorruptStoreError(f"row database {self.data_path}: {exc}", path=self.data_path,
                                    table=table) from None

    def _check_size(self) -> None:
        # A truncated data file, or a damaged value reference running past its end, would
        # fault (SIGBUS) on the first read that follows it: refuse both before LMDB walks the
        # trees.
        info = self.env.info()
        psize = self.env.stat()["psize"]
        need = (info["last_pgno"] + 1) * psize
        have = os.path.getsize(self.data_path)
        if have < need:
            raise CorruptStoreError(
                f"row database {self.data_path} is truncated: {have} bytes, its pages need {need}",
                path=self.data_path)
        try:
            check_snapshot(self.env, self.data_path, psize)
        except TreeDamage as exc:
            raise CorruptStoreError(f"row database {self.data_path} is damaged: {exc}",
                                    path=self.data_path) from None

    # -- reads -----------------------------------------------------------------------

    def _payload(self, txn, layout: TableLayout, block: int):
        key = block_key(layout.generation, layout.table_id, block)
        try:
            value = txn.get(key)
        except lmdb.Error as exc:
            raise self._damage(layout, block, f"LMDB error {exc}") from None
        want = layout.block_rows(block) * layout.spec.row_bytes + CHECKSUM_BYTES
        if value is None or len(value) != want:
            got = "missing" if value is None else f"{len(value)} bytes, expected {want}"
            raise self._damage(layout, block, got)
        view = memoryview(value)
        if _CRC.unpack_from(view)[0] != zlib.crc32(view[CHECKSUM_BYTES:], zlib.crc32(key)):
            raise self._damage(layout, block, "checksum mismatch")
        return view[CHECKSUM_BYTES:]

    def _damage(self, layout, block, what) -> CorruptStoreError:
        return CorruptStoreError(
            f"row database {self.data_path}: table {layout.name!r} block {block}: {what}",
            path=self.data_path, table=layout.name)

    def read_rows(self, layout: TableLayout, ids: np.ndarray, out: np.ndarray) -> int:
        """Fill ``out`` with rows ``ids`` (sorted, unique); returns the number of blocks read."""
        rpb = layout.rows_per_block
        width = layout.spec.row_bytes
        blocks = ids // rpb
        starts = np.flatnonzero(np.diff(blocks, prepend=-1))
        ends = np.append(starts[1:], len(ids))
        with self._corruption(layout.name), self.snapshot() as txn:
            for s, e in zip(starts.tolist(), ends.tolist()):
                block = int(blocks[s])
                rows = np.frombuffer(self._payload(txn, layout, block), dtype=np.uint8)
                rows = rows.reshape(-1, width)
                np.take(rows, ids[s:e] - block * rpb, axis=0, out=out[s:e])
        return len(starts)

    def load_table(self, layout: TableLayout) -> np.ndarray:
        """Every row of a written table, ``(num_rows, row_bytes) uint8``, checksums verified;
        in huge pages (a DRAM tier gathers its rows at random: :mod:`sdm.kernels.memory`)."""
        out = huge_empty((layout.spec.num_rows, layout.spec.row_bytes), np.uint8)
        flat = out.reshape(-1)
        span = layout.rows_per_block * layout.spec.row_bytes
        with self._corruption(layout.name), self.snapshot() as txn:
            for block in range(layout.num_blocks):
                payload = self._payload(txn, layout, block)
                flat[block * span: block * span + len(payload)] = np.frombuffer(payload, np.uint8)
        return out

    def iter_blocks(self, layout: TableLayout):
        """Yield every block's rows of a written table in order, as ``(k, row_bytes) uint8``
        views valid until the next item (checksums verified); memory stays one block."""
        width = layout.spec.row_bytes
        with self._corruption(layout.name), self.snapshot() as txn:
            for block in range(layout.num_blocks):
                payload = self._payload(txn, layout, block)
                yield np.frombuffer(payload, dtype=np.uint8).reshape(-1, width)

    # -- writes ----------------------------------------------------------------------

    def write_generation(self, layout: TableLayout, generation: int,
                         chunks: Iterable[np.ndarray], progress=None) -> None:
        """Append every block of ``layout``'s table under ``generation``.

        ``chunks`` yields ``(k, row_bytes) uint8`` raw rows in order, covering exactly
        ``num_rows`` rows (the caller checks the count). Rows are visible only after the
        manifest names ``generation``; until then they are garbage if the process dies.
        """
        rpb = layout.rows_per_block
        width = layout.spec.row_bytes
        pending = np.empty((0, width), dtype=np.uint8)
        block = 0
        txn = self.env.begin(write=True)
        written = 0
        try:
            for chunk in chunks:
                if len(pending):
                    chunk = np.concatenate([pending, chunk])
                full = (len(chunk) // rpb) * rpb
                block, written, txn = self._put_blocks(txn, layout, generation, block, chunk[:full], written)
                pending = chunk[full:].copy()
                if progress is not None:
                    progress(full)
            if len(pending):
                block, written, txn = self._put_blocks(txn, layout, generation, block, pending, written)
                if progress is not None:
                    progress(len(pending))
            txn.commit()
        except BaseException:
            txn.abort()
            raise

    def _put_blocks(self, txn, layout, generation, block, rows, written):
        rpb = layout.rows_per_block
        for start in range(0, len(rows), rpb):
            payload = rows[start:start + rpb].tobytes()
            key = block_key(generation, layout.table_id, block)
            value = _sealed(key, payload)
            if not txn.put(key, value, append=True):
                raise StoreError(f"row database {self.data_path}: block key out of order "
                                 f"(table {layout.name!r}, generation {generation}, block {block})")
            block += 1
            written += len(value)
            if written >= COMMIT_BYTES:
                txn.commit()
                txn = self.env.begin(write=True)
                written = 0
        return block, written, txn

    def update_rows(self, layout: TableLayout, ids: np.ndarray, rows: np.ndarray) -> int:
        """Replace rows ``ids`` (sorted, unique int64) of ``layout``'s committed generation with
        ``rows`` (``(n, row_bytes) uint8``), log them and bump the version, in one write
        transaction, then sync. Returns the new version."""
        rpb = layout.rows_per_block
        width = layout.spec.row_bytes
        blocks = ids // rpb
        starts = np.flatnonzero(np.diff(blocks, prepend=-1))
        ends = np.append(starts[1:], len(ids))
        try:
            with self.env.begin(write=True, buffers=True) as txn:
                for s, e in zip(starts.tolist(), ends.tolist()):
                    block = int(blocks[s])
                    payload = np.frombuffer(self._payload(txn, layout, block), dtype=np.uint8)
                    patched = payload.reshape(-1, width).copy()
                    patched[ids[s:e] - block * rpb] = rows[s:e]
                    key = block_key(layout.generation, layout.table_id, block)
                    txn.put(key, _sealed(key, patched.tobytes()))
                version = self.version(txn) + 1
                entry = _LOG_HEAD.pack(layout.table_id, layout.generation, len(ids)) + \
                    np.ascontiguousarray(ids, dtype="<i8").tobytes()
                txn.put(_log_key(version), _sealed(_log_key(version), entry))
                txn.put(_VERSION_KEY, _sealed(_VERSION_KEY, _VERSION.pack(version)))
        except lmdb.Error as exc:
            raise StoreError(f"row database {self.data_path}: cannot update table {layout.name!r}: {exc}") from None
        self.sync()
        return version

    def drop_changes(self, table_id: int, keep_generation: int) -> int:
        """Delete the log entries of ``table_id`` for generations other than
        ``keep_generation`` (superseded by a publish). Returns how many were deleted."""
        doomed = [version for version, t, g, _ in self.changes() if t == table_id and g != keep_generation]
        if doomed:
            with self._corruption(), self.env.begin(write=True) as txn:
                for version in doomed:
                    txn.delete(_log_key(version))
        return len(doomed)

    def delete_generations(self, keep: dict[int, int | None], from_generation: int = 0) -> int:
        """Delete every block whose (generation, table) is not ``keep[table] == generation``.

        Returns the number of blocks deleted. Walks one key per (generation, table) prefix and
        deletes in bounded transactions, so the cost is the garbage, not the store. Generation
        0 (the version and change log) is never touched.
        """
        deleted = 0
        start = block_key(max(1, from_generation), 0, 0)
        while True:
            with self._corruption(), self.env.begin(write=True) as txn:
                cur = txn.cursor()
                if not cur.set_range(start):
                    return deleted
                gen, tid, _ = _KEY.unpack(cur.key())
                if keep.get(tid) == gen:
                    start = block_key(gen, tid + 1, 0) if tid + 1 < 2**32 else block_key(gen + 1, 0, 0)
                    continue
                prefix = cur.key()[:8]
                for _ in range(8192):
                    if cur.key()[:8] != prefix or not cur.delete():
                        break
                    deleted += 1
                start = block_key(gen, tid, 0)

    def sync(self) -> None:
        self.env.sync(True)

    def close(self) -> None:
        if self.env is not None:
            self.env = None
            _release_env(self.path)


@contextmanager
def _given(txn):
    yield txn


class LmdbTier(Tier):
    """Rows read from the LMDB environment on demand, a block (one value) per read."""

    name = kind = "lmdb"
    holds_all_rows = True
    supports_load_table = True

    def __init__(self, db: RowDB):
        self.db = db
        self._rows = 0
        self._blocks = 0

    def read_rows(self, layout, ids, out):
        self._blocks += self.db.read_rows(layout, ids, out)
        self._rows += len(ids)

    def load_table(self, layout):
        self._blocks += layout.num_blocks
        return self.db.load_table(layout)

    def row_offsets(self, layout, ids):
        # One value per run of overflow pages (one 4 KiB page unless a single row is wider);
        # rows start after the page header and the block's checksum.
        rpb = layout.rows_per_block
        stride = block_pages(layout) * LMDB_PAGE_BYTES
        ids = np.asarray(ids, dtype=np.int64)
        return ((ids // rpb) * stride + (LMDB_PAGE_BYTES - LMDB_VALUE_BYTES) + CHECKSUM_BYTES
                + (ids % rpb) * layout.spec.row_bytes)

    def stats(self):
        return {"hits": self._rows, "misses": 0, "reads": self._blocks,
                "bytes_read": self._blocks * LMDB_PAGE_BYTES}

"""``sdm.Store``: one embedding store over a hierarchy of tiers.

A store is a directory (DESIGN.md §5)::

    manifest.json   tables, row formats, block geometry, committed generations, SHA-256
    rows.lmdb/      LMDB: every row, one checksummed 4 KiB block per value
    write.lock      serializes writers across processes

It becomes visible only when complete: ``create`` builds it under a temporary name, fsyncs
and renames it into place; ``write_table`` writes a new generation of blocks, syncs, and
only then names it in the manifest (the single commit point), so a killed writer leaves the
old version, never a mix.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
import uuid
from collections.abc import Iterable, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np

from sdm.store.config import HierarchyConfig, resolve_config
from sdm.progress import progress_bar
from sdm.errors import (
    InvalidArgumentError, ReadOnlyError, StoreError, StoreExistsError,
    StoreNotFoundError, UnknownTableError,
)
from sdm.formats import dequantize_rows, quantize_rows
from sdm.store.hierarchy import Hierarchy
from sdm.tiers.manifest import MANIFEST_NAME, Manifest, TableLayout, TableSpec, fsync_dir
from sdm.kernels.dedup import unique_inverse
from sdm.store.pooled import PooledCache
from sdm.kernels.pooling import check_bags, check_ids, check_mode, check_weights
from sdm.tiers.base import Bags
from sdm.tiers.clock import paced_request
from sdm.tiers.slots import CpuSlots, default_cpu_slots
from sdm.validate import check_int
from sdm.tiers.lmdb import RowDB

__all__ = ["Store", "TableSpec", "PrefetchTicket"]

_LOCK_NAME = "write.lock"
_CHUNK_BYTES = 8 << 20  # float32 input rows quantized per step while writing a table


class Store:
    """An embedding store: tables of rows across a hierarchy of tiers.

    Make one with :meth:`create` or :meth:`open`; use it as a context manager or call
    :meth:`close`. Lookups are thread-safe, and at most ``cpu_slots`` of them (default: the
    cores) run their CPU work at once (:meth:`open`); writes are serialized (across processes
    too).
    """

    def __init__(self, path: str, manifest: Manifest, stamp: tuple, db: RowDB, config: HierarchyConfig,
                 readonly: bool, cpu_slots: int | None = None):
        self.path = path
        self.readonly = readonly
        self.config = config
        self._manifest = manifest
        self._manifest_stamp = stamp  # taken before ``manifest`` was read (see open)
        self._db = db
        self._hierarchy = Hierarchy(config, db, tables=manifest.tables)
        # Bags that repeat (a user's features across a request's candidate items) are
        # served whole from here, before any row is looked up.
        self._pooled = PooledCache(config.pooled_cache_bytes) if config.pooled_cache_bytes else None
        self._write_lock = threading.Lock()
        self._counter_lock = threading.Lock()
        self._rw = _ReadWriteLock()
        # Requests running CPU work at once, the rest queued: past the cores, Python threads
        # only trade the interpreter lock (sdm.tiers.slots). 0: no bound.
        n = default_cpu_slots() if cpu_slots is None else check_int(cpu_slots, "cpu_slots", lo=0)
        self._slots = CpuSlots(n) if n else None
        self._seen_version = 0  # the database version every copy of rows here reflects
        self._lookups = 0
        self._batches = 0
        self._closed = False
        self._catch_up()

    # -- lifecycle -------------------------------------------------------------------

    @classmethod
    def create(cls, path, tables: Iterable[TableSpec], *, config=None) -> "Store":
        """Create a new store directory at ``path`` holding ``tables`` (rows not yet written).

        Raises:
            StoreExistsError: ``path`` already exists (nothing is touched).
            InvalidArgumentError: no tables, a non-TableSpec, or duplicate names.
        """
        path = _store_path(path)
        config = resolve_config(config)
        if isinstance(tables, (str, bytes)) or not isinstance(tables, Iterable):
            raise InvalidArgumentError(f"tables must be an iterable of sdm.TableSpec, got {tables!r}"
                                       if tables is None else
                                       f"tables must be an iterable of sdm.TableSpec, got {type(tables).__name__}")
        specs = list(tables)
        if not specs:
            raise InvalidArgumentError("a store needs at least one table, got none")
        for spec in specs:
            if not isinstance(spec, TableSpec):
                raise InvalidArgumentError(f"tables must be sdm.TableSpec, got {type(spec).__name__}")
        names = [s.name for s in specs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise InvalidArgumentError(f"table names must be unique; repeated: {dupes}")
        if os.path.lexists(path):
            raise StoreExistsError(f"cannot create a store at {path}: it already exists")
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            raise StoreNotFoundError(f"cannot create a store at {path}: {parent} is not a directory")
        tmp = os.path.join(parent, f".{os.path.basename(path)}.creating-{uuid.uuid4().hex[:12]}")
        os.mkdir(tmp)
        try:
            manifest = Manifest(tuple(TableLayout.for_spec(s, i) for i, s in enumerate(specs)))
            db = RowDB(tmp, create=True)
            db.sync()
            db.close()
            open(os.path.join(tmp, _LOCK_NAME), "w").close()
            manifest.write(tmp)  # last: a directory without it is never a store
            os.rename(tmp, path)
            fsync_dir(parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return cls.open(path, config=config)

    @classmethod
    def open(cls, path, *, config=None, readonly: bool = False, cpu_slots: int | None = None) -> "Store":
        """Open an existing store. ``config``: a hierarchy preset name, a TOML path, or a
        :class:`sdm.store.config.HierarchyConfig` (default ``dram``). ``cpu_slots``: how many
        lookup calls run their CPU work at once when many threads call (the others queue,
        first come first served; a call waiting for devices gives its slot up): None for the
        cores this process may use, 0 for no bound (:mod:`sdm.tiers.slots`).

        Raises:
            StoreNotFoundError: no store at ``path``.
            CorruptStoreError: a damaged manifest or row database (names the file).
        """
        path = _store_path(path)
        config = resolve_config(config)
        if not os.path.isfile(os.path.join(path, MANIFEST_NAME)):
            raise StoreNotFoundError(f"no sdm store at {path} ({MANIFEST_NAME} not found)")
        # The stamp first: a publish between the two then makes the stamp older than the
        # manifest, and the first batch re-reads it. The other order would pair an old
        # manifest with the new stamp, and the store would never see that publish.
        stamp = _stamp(path)
        manifest = Manifest.read(path)
        db = RowDB(path, readonly=readonly)
        try:
            return cls(path, manifest, stamp, db, config, readonly, cpu_slots)
        except BaseException:  # a config the store's tables cannot use: release the database
            db.close()
            raise

    def close(self) -> None:
        """Release the store's memory and files; further calls raise StoreError."""
        if not self._closed:
            self._closed = True
            self._hierarchy.close()
            self._db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"Store({self.path!r}, tables={list(self.tables)}, config={self.config.name!r})"

    # -- tables ----------------------------------------------------------------------

    @property
    def cpu_slots(self) -> int:
        """How many lookup calls run their CPU work at once (0: no bound; see :meth:`open`)."""
        return 0 if self._slots is None else self._slots.n

    @property
    def tables(self) -> dict[str, TableSpec]:
        """Table specs by name, in creation order."""
        return {t.name: t.spec for t in self._manifest.tables}

    def _layout(self, name) -> TableLayout:
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        layout = self._manifest.table(name) if isinstance(name, str) else None
        if layout is None:
            raise UnknownTableError(f"table {name!r} is not in the store; tables: {list(self.tables)}")
        return layout

    def _readable(self, name) -> TableLayout:
        layout = self._layout(name)
        if layout.generation is None:
            raise StoreError(f"table {name!r} has no rows yet; call write_table({name!r}, rows) first")
        return layout

    def write_table(self, name: str, rows, *, progress: bool | None = None) -> None:
        """Write every row of table ``name``, replacing any earlier rows atomically.

        Args:
            name: a table of the store.
            rows: ``(num_rows, dim)`` float rows as an array or ``np.memmap``, or an iterable
                of ``(k, dim)`` chunks that together hold exactly ``num_rows`` rows. Rows are
                encoded in the table's format; memory stays bounded by one chunk.
            progress: show a progress bar; None (default) shows one only on a terminal.

        Raises:
            InvalidArgumentError: wrong shape, dtype, row count, or non-finite values. The
                store is unchanged: rows become visible only once all are written.
        """
        layout = self._layout(name)
        if self.readonly:
            raise ReadOnlyError(f"store {self.path} is open read-only; cannot write table {name!r}")
        spec = layout.spec
        chunks = _row_chunks(spec, rows)
        with self._write_lock, _FileLock(os.path.join(self.path, _LOCK_NAME)):
            manifest = Manifest.read(self.path)  # another process may have committed since
            live = {t.table_id: t.generation for t in manifest.tables}
            self._db.delete_generations(live)  # leftovers of killed or superseded writes
            generation = manifest.next_generation
            bar = progress_bar(total=spec.num_rows, unit="row", unit_scale=True, desc=f"write {name}",
                               show=progress)
            try:
                self._db.write_generation(layout, generation, chunks, progress=bar.update)
            except BaseException:
                self._db.delete_generations(live, from_generation=generation)
                raise
            finally:
                bar.close()
            self._db.sync()  # rows durable before the manifest names them
            new = manifest.table(name)
            committed = TableLayout(new.spec, new.table_id, new.rows_per_block, generation)
            manifest = manifest.with_table(committed, generation + 1)
            manifest.write(self.path)
            with self._rw.writing():
                self._catch_up()
            live[committed.table_id] = generation
            self._db.delete_generations(live)
            self._db.drop_changes(committed.table_id, generation)

    def update_rows(self, name: str, ids, rows) -> int:
        """Replace rows ``ids`` of table ``name`` with ``rows``, atomically: every reader's
        next batch (in this process or another) sees all of them, a batch already running
        sees none. Copies of the old rows (DRAM cache, resident tables, SCM row files,
        pooled vectors) are dropped or refreshed for exactly these rows.

        Args:
            name: a written table.
            ids: ``(n,)`` distinct row ids.
            rows: ``(n, dim)`` float rows, encoded in the table's format.

        Returns:
            The store's new version (``stats()["version"]``).

        Raises:
            ReadOnlyError, UnknownTableError, StoreError (no rows yet), IdOutOfRangeError,
            InvalidArgumentError (repeated ids, wrong shape, non-finite values). Nothing is
            written then.
        """
        layout = self._readable(name)
        if self.readonly:
            raise ReadOnlyError(f"store {self.path} is open read-only; cannot update table {name!r}")
        spec = layout.spec
        ids = check_ids(ids, spec.num_rows, what=f"id of table {name!r}")
        rows = _as_rows(rows, f"rows of table {name!r}")
        _check_chunk(spec, rows, "rows")
        if rows.shape[0] != len(ids):
            raise InvalidArgumentError(f"update of table {name!r}: {len(ids)} ids but {rows.shape[0]} rows")
        order = np.argsort(ids, kind="stable")
        ids = ids[order].astype(np.int64, copy=False)
        if len(ids) > 1 and (ids[1:] == ids[:-1]).any():
            dup = int(ids[1:][ids[1:] == ids[:-1]][0])
            raise InvalidArgumentError(f"update of table {name!r}: id {dup} is given more than once")
        raw = quantize_rows(rows[order], spec.fmt)
        if not len(ids):
            return self._seen_version
        with self._write_lock, _FileLock(os.path.join(self.path, _LOCK_NAME)):
            current = Manifest.read(self.path).table(name)  # another process may have published
            version = self._db.update_rows(current, ids, raw)
            with self._rw.writing():
                self._catch_up()
        return version

    # -- versions ----------------------------------------------------------------------

    def _catch_up(self) -> None:
        """Bring every copy of rows in this process up to the current manifest and database
        version: tables republished since are dropped whole, rows updated since exactly.
        Caller holds the write side of ``_rw`` (or is the constructor)."""
        stamp = _stamp(self.path)
        if stamp != self._manifest_stamp:
            manifest = Manifest.read(self.path)
            for new in manifest.tables:
                old = self._manifest.table(new.name)
                if old is None or old.generation != new.generation:
                    self._hierarchy.invalidate(new)
                    if self._pooled is not None:
                        self._pooled.invalidate(new.table_id)
            self._manifest, self._manifest_stamp = manifest, stamp
        with self._db.snapshot() as txn:
            version = self._db.version(txn)
            if version == self._seen_version:
                return
            tables = {t.table_id: t for t in self._manifest.tables}
            for _, table_id, generation, ids in self._db.changes(self._seen_version, txn):
                layout = tables.get(table_id)
                if layout is not None and layout.generation == generation:
                    self._hierarchy.rows_changed(layout, ids)
                    if self._pooled is not None:  # only the bags holding a changed row
                        self._pooled.invalidate(table_id, ids)
            self._seen_version = version

    def _cpu_slot(self):
        """One of the store's CPU slots for a lookup call (inside its paced request, so the
        call's deferred device wait comes after the slot is returned)."""
        return self._slots.held() if self._slots is not None else nullcontext()

    @contextmanager
    def _serving(self):
        """One batch's consistent view: the read side of ``_rw`` and one LMDB snapshot,
        taken once every copy of rows here reflects that snapshot's version."""
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        while True:
            self._rw.acquire_read()
            snapshot = self._db.snapshot()
            try:
                txn = snapshot.__enter__()
                if self._db.version(txn) == self._seen_version and _stamp(self.path) == self._manifest_stamp:
                    break
            except BaseException:
                snapshot.__exit__(None, None, None)
                self._rw.release_read()
                raise
            snapshot.__exit__(None, None, None)
            self._rw.release_read()
            with self._rw.writing():
                self._catch_up()
        try:
            yield
        finally:
            snapshot.__exit__(None, None, None)
            self._rw.release_read()

    # -- lookups ---------------------------------------------------------------------

    def lookup(self, name: str, ids) -> np.ndarray:
        """Rows ``ids`` of table ``name``, ``(n,)`` ints -> ``(n, dim) float32``."""
        with self._serving():
            spec = self._readable(name).spec
            return dequantize_rows(self._lookup(name, ids), spec.fmt, spec.dim)

    def lookup_raw(self, name: str, ids) -> np.ndarray:
        """Rows ``ids`` of table ``name`` as stored, ``(n,)`` ints -> ``(n, row_bytes) uint8``
        in the table's row format (:mod:`sdm.formats`); what :meth:`lookup` decodes."""
        with self._serving():
            return self._lookup(name, ids)

    def _lookup(self, name, ids):
        layout = self._readable(name)
        spec = layout.spec
        ids = check_ids(ids, spec.num_rows, what=f"id of table {name!r}")
        self._count(len(ids), 1)
        table = self._hierarchy.resident(layout)
        if table is not None:
            self._hierarchy.count_resident_hits(len(ids), layout)
            raw = table[ids]
        else:
            unique, inverse = unique_inverse(ids)
            raw_unique = np.empty((len(unique), spec.row_bytes), dtype=np.uint8)
            self._hierarchy.read_rows(layout, unique, raw_unique)
            raw = raw_unique[inverse]
        return raw

    def embedding_bag(self, name: str, indices, offsets, *, mode: str = "sum",
                      per_sample_weights=None) -> np.ndarray:
        """Pool rows of table ``name`` per bag, as :func:`sdm.embedding_bag`.

        Args:
            indices: ``(nnz,)`` int32/int64 row ids.
            offsets: ``(B + 1,)`` CSR bag boundaries.
            mode: ``"sum"`` or ``"mean"``.
            per_sample_weights: optional ``(nnz,)`` float weights.

        Returns:
            ``(B, dim) float32``.
        """
        with paced_request(), self._cpu_slot(), self._serving():
            request = self._check_bag(name, indices, offsets, mode, per_sample_weights)
            self._count(len(request.indices), 1)
            return self._pool([request])[request.layout.name]

    def embedding_bags(self, requests: Mapping[str, tuple], *, mode: str = "sum") -> dict[str, np.ndarray]:
        """Pool one batch over several tables: ``{name: (indices, offsets)}`` or
        ``{name: (indices, offsets, per_sample_weights)}`` -> ``{name: (B, dim) float32}``.

        Every request is validated before any is served. Under a paced hierarchy the
        request's device waits are taken once, at its end (:func:`sdm.tiers.clock.paced_request`).
        """
        with paced_request(), self._cpu_slot(), self._serving():
            checked = self._check_requests(requests, mode)
            self._count(sum(len(c.indices) for c in checked), 1)
            return self._pool(checked)

    def _check_requests(self, requests, mode) -> list[Bags]:
        if not isinstance(requests, Mapping):
            raise InvalidArgumentError(f"requests must be a mapping of table name to (indices, offsets), "
                                       f"got {type(requests).__name__}")
        checked = []
        for name, request in requests.items():
            if not isinstance(request, (tuple, list)) or len(request) not in (2, 3):
                raise InvalidArgumentError(
                    f"request for table {name!r} must be (indices, offsets) or "
                    f"(indices, offsets, per_sample_weights)")
            weights = request[2] if len(request) == 3 else None
            checked.append(self._check_bag(name, request[0], request[1], mode, weights))
        return checked

    def _check_bag(self, name, indices, offsets, mode, per_sample_weights):
        layout = self._readable(name)
        mean = check_mode(mode)
        indices, offsets = check_bags(indices, offsets, layout.spec.num_rows,
                                      what=f"index of table {name!r}")
        weights = check_weights(per_sample_weights, len(indices))
        out = np.empty((len(offsets) - 1, layout.spec.dim), dtype=np.float32)
        return Bags(layout, indices, offsets, weights, mean, out)

    def _pool(self, checked: list[Bags]) -> dict[str, np.ndarray]:
        """Pool every table's validated bags of one request: ``{name: (B, dim) float32}``."""
        if self._pooled is None:
            self._hierarchy.pool(checked)
        else:
            self._hierarchy.pool([b for b in checked if b.weights is not None])  # never cached
            for b in checked:
                if b.weights is None:
                    self._pool_through_pooled(b)
        return {b.layout.name: b.out for b in checked}

    def _pool_through_pooled(self, bags: Bags) -> None:
        """Pool ``bags`` through the pooled-embedding cache: only the bags it misses are pooled
        from the hierarchy."""
        def pool_misses(sub_indices, sub_offsets, sub_out):
            self._hierarchy.pool([Bags(bags.layout, sub_indices, sub_offsets, None, bags.mean, sub_out)])

        self._pooled.pool(bags.layout.table_id, bags.indices, bags.offsets, bags.mean, pool_misses, bags.out)

    # -- prefetch ----------------------------------------------------------------------

    def prefetch(self, requests: Mapping[str, tuple]) -> "PrefetchTicket":
        """Read the rows of an upcoming batch into the DRAM cache ahead of its use, pinned
        so nothing can evict them before the batch is served; then serve the batch with
        :meth:`embedding_bags` and hand the ticket to :meth:`release`.

        ``requests`` as for :meth:`embedding_bags` (validated the same way). Tables not
        served through a cache (resident, pinned whole, or no cache in the hierarchy) need
        no prefetch and are skipped. The reads are charged to the devices like any other;
        whether they overlap other work is the caller's schedule (see
        :class:`sdm.store.prefetch.Lookahead`).
        """
        with self._serving():
            checked = self._check_requests(requests, "sum")
            pinned = []
            for layout, indices, *_ in checked:
                unique = unique_inverse(indices)[0]
                if len(unique) and self._hierarchy.prefetch(layout, unique):
                    pinned.append((layout, unique))
            return PrefetchTicket(tuple(pinned))

    def release(self, ticket: "PrefetchTicket") -> None:
        """Unpin the rows :meth:`prefetch` pinned (their batch has been served). Releasing
        a ticket twice raises InvalidArgumentError."""
        if not isinstance(ticket, PrefetchTicket):
            raise InvalidArgumentError(f"release takes the ticket prefetch returned, got {type(ticket).__name__}")
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        if ticket.released:
            raise InvalidArgumentError("this prefetch ticket was released already")
        ticket.released = True
        for layout, ids in ticket.rows:
            self._hierarchy.release(layout, ids)

    def _count(self, lookups: int, batches: int) -> None:
        with self._counter_lock:
            self._lookups += lookups
            self._batches += batches

    def modeled_ns(self) -> int:
        """Simulated device time since open: the busy time of every tier, charged in turn
        to one clock. The difference around a call is that call's modeled IO time."""
        return self._hierarchy.modeled_ns()

    def stats(self) -> dict:
        """Counters since open: ``lookups``, ``batches`` (one per serving call: ``lookup``,
        ``lookup_raw``, ``embedding_bag``, ``embedding_bags``), and ``tiers``, a list (fast to slow)
        of ``{name, hits, misses, reads, bytes_read, modeled_ns, ...}`` per tier; with a
        pooled-embedding cache, ``pooled_cache`` (its ``hits``, ``misses``, ``bytes_used``...).
        Lookups of bags the pooled cache served never reach the tiers. ``devices`` has the
        counters of each device's shared queue (see :meth:`Hierarchy.device_stats`).

        ``damage`` lists the damaged files found and worked around since open (an SCM row
        file that failed its checksums and was rebuilt from LMDB, so its rows were served
        from the intact copy): ``{file, table, what, action}`` each, newest last. Damage
        that cannot be worked around is raised as :class:`CorruptStoreError` instead."""
        tiers = self._hierarchy.stats()
        out = {"lookups": self._lookups, "batches": self._batches, "version": self._seen_version,
               "config": self.config.name, "tiers": tiers, "devices": self._hierarchy.device_stats(),
               "damage": [d for t in tiers for d in t.get("damage", ())]}
        if self._pooled is not None:
            out["pooled_cache"] = self._pooled.stats()
        return out


@dataclass
class PrefetchTicket:
    """What :meth:`Store.prefetch` pinned: ``rows``, ``(layout, sorted ids)`` per table."""

    rows: tuple
    released: bool = False

    @property
    def num_rows(self) -> int:
        return sum(len(ids) for _, ids in self.rows)


def _store_path(path) -> str:
    """The absolute text path of a store the caller named; InvalidArgumentError otherwise."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(f"store path must be a str or os.PathLike, got {path!r}")
    path = os.fspath(path)
    if not isinstance(path, str) or "\0" in path:
        raise InvalidArgumentError(f"store path {path!r} must be text without NUL bytes")
    return os.path.abspath(path)


def _as_rows(values, what: str) -> np.ndarray:
    """``np.asarray(values)``, with ragged nesting refused naming ``what``."""
    try:
        return np.asarray(values)
    except (ValueError, TypeError) as exc:
        raise InvalidArgumentError(f"{what} is not a 2-D array (ragged nesting?): {exc}") from None


def _row_chunks(spec: TableSpec, rows):
    """Validate ``rows`` for ``spec`` and return an iterator of encoded ``(k, row_bytes)`` chunks.

    Arrays are checked whole up front; chunks of an iterable are checked as they come, and
    the total is checked at the end (a mismatch raises before anything is committed).
    """
    if isinstance(rows, (list, tuple)):
        rows = _as_rows(rows, f"rows of table {spec.name!r}")
    if isinstance(rows, np.ndarray):
        _check_chunk(spec, rows, "rows")
        if rows.shape[0] != spec.num_rows:
            raise InvalidArgumentError(
                f"table {spec.name!r} has {spec.num_rows} rows of dim {spec.dim}; "
                f"got rows of shape {rows.shape}")
        step = max(1, _CHUNK_BYTES // (4 * spec.dim))
        return (quantize_rows(rows[i:i + step], spec.fmt) for i in range(0, len(rows), step))
    if not isinstance(rows, Iterable):
        raise InvalidArgumentError(
            f"rows must be an array or an iterable of (k, {spec.dim}) chunks, got {type(rows).__name__}")
    return _encode_chunks(spec, rows)


def _encode_chunks(spec: TableSpec, chunks):
    seen = 0
    for i, chunk in enumerate(chunks):
        chunk = _as_rows(chunk, f"chunk {i} of table {spec.name!r}")
        _check_chunk(spec, chunk, f"chunk {i}")
        seen += len(chunk)
        if seen > spec.num_rows:
            raise InvalidArgumentError(
                f"table {spec.name!r} has {spec.num_rows} rows; chunks supplied more (>= {seen})")
        yield quantize_rows(chunk, spec.fmt)
    if seen != spec.num_rows:
        raise InvalidArgumentError(f"table {spec.name!r} has {spec.num_rows} rows; chunks supplied {seen}")


def _check_chunk(spec: TableSpec, chunk: np.ndarray, what: str) -> None:
    if chunk.ndim != 2 or chunk.shape[1] != spec.dim:
        raise InvalidArgumentError(
            f"{what} for table {spec.name!r} must have shape (k, {spec.dim}), got {chunk.shape}")
    if chunk.dtype == np.bool_ or not (np.issubdtype(chunk.dtype, np.floating)
                                       or np.issubdtype(chunk.dtype, np.integer)):
        raise InvalidArgumentError(f"{what} for table {spec.name!r} must be numeric, got {chunk.dtype}")


def _stamp(path: str) -> tuple:
    """What changes whenever the manifest is replaced (it is renamed into place)."""
    try:
        st = os.stat(os.path.join(path, MANIFEST_NAME))
    except OSError as exc:
        raise StoreError(f"store {path}: cannot stat its manifest: {exc}") from None
    return st.st_ino, st.st_mtime_ns, st.st_size


class _ReadWriteLock:
    """Batches share the store; applying a change (a publish, an update seen in the database)
    waits for the running batches and holds new ones back, so no batch sees half of it.
    Writers go first once waiting. Not reentrant."""

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._waiting = 0

    def acquire_read(self) -> None:
        with self._cond:
            while self._writer or self._waiting:
                self._cond.wait()
            self._readers += 1

    def release_read(self) -> None:
        with self._cond:
            self._readers -= 1
            if not self._readers:
                self._cond.notify_all()

    @contextmanager
    def writing(self):
        with self._cond:
            self._waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class _FileLock:
    """An exclusive ``flock`` on a file, held across the ``with`` block (one writer per store)."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot lock {self.path} for writing: {exc}") from None
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)

"""The DRAM cache tier: a policy-driven cache of rows in front of a slower tier.

The directory (which key sits in which slot) is a :class:`sdm.policies.Cache`, the same
Numba kernels ``sdm.simulate`` runs; the rows sit in a slot buffer this tier owns. A batch
(one request: every table's bags; a large request's tables one batch each) is served in a
fixed number of Numba and numpy calls whatever its size: one dedup and one probe of all its
tables' rows (every hit, miss, admission and eviction decided in one kernel, under the lock
once), one read of every
table's misses from the tier below (:meth:`~sdm.tiers.base.Tier.read_many`: its device model
counts the blocks, each table's a batch), and per table one scatter into the slots and one
pooled gather straight from them. Where the policy's hits commute (FIFO, CLOCK, SIEVE, S3-FIFO,
random; not behind TinyLFU), a batch whose every lookup hits a ready slot skips the dedup: one
pass looks each lookup up and applies each distinct key's hit
(:func:`~sdm.kernels.serve.hit_batch_for`), and its first miss sends the batch down the
general path with nothing changed.

Cache keys are ``table_id << 48 | row id``, so one cache (and one policy) spans all tables.

Two ways rows enter besides demand misses, both pinning their slots so no policy decision
can evict them: :meth:`pin_rows` (hot rows a placement keeps resident for good) and
:meth:`prefetch` (rows of an upcoming batch, pinned until :meth:`release` after that batch
was served — the eviction-before-use bug class of lookahead prefetchers cannot happen).

Many batches are served at once. Only the probe (or the all-hit pass) runs under the cache's lock; there a batch
stamps every slot it will read (no other batch evicts a slot stamped by a batch in flight:
:mod:`sdm.kernels.serve`), claims its misses' slots as pending and takes its
own range of scratch rows. Its misses are then read from the tier below with no lock held, and a
batch that hit a slot another batch is still filling waits for that row only (a condition
variable), so hits never wait for device reads of other rows, and two batches needing the
same missing row read it once. Pooling runs from the held slots, unlocked; at the end the
batch leaves the set in flight and unpins the few slots it shared with other batches. A single thread's key stream meets no
other batch in flight, so its policy decisions stay exactly ``sdm.simulate``'s.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from sdm.errors import ConfigError
from sdm.formats import typed_rows
from sdm.kernels.dedup import compose, unique_ranked
from sdm.kernels.memory import huge_empty
from sdm.kernels.policies import A_KIND, M_FLYING, pin_batch
from sdm.kernels.serve import (C_HITS, C_MISSES, C_PREFETCH_USED, C_PREFETCH_WASTED, C_REJECTED,
                               N_COUNTERS, PREFETCHED, READY_BITS, SLOT_FAILED, SLOT_PENDING,
                               SLOT_READY, TABLE_SHIFT, fill_rows, hit_batch_for, hits_commute,
                               probe_batch_for)
from sdm.tiers.manifest import TableLayout
from sdm.policies import Cache
from sdm.policies.cache import _no_admission
from sdm.kernels.pooling import pool
from sdm.tiers.base import CacheTier, Tier
from sdm.tiers.clock import current_paced_request, wait_until_ns
from sdm.tiers.slots import give_up

__all__ = ["DramCacheTier"]

# Scratch rows, all batches in flight together. Untouched rows of the buffer cost address space,
# not RAM, so it is sized for many requests at once: a batch that finds too few waits until
# none is in flight to grow the buffer, which under steady concurrent load rarely happens.
_MIN_SCRATCH = 1 << 16
_WAIT_S = 0.05  # waits for other batches' rows re-check this often (a notify is never lost, but be safe)
_LINE = 64  # slots start on cache lines, so a row costs exactly ceil(row_bytes / 64) lines
_ROW_MASK = (1 << TABLE_SHIFT) - 1
# A request of up to this many lookups is one batch (one lock, one probe, one read below:
# small requests are dominated by per-call costs); a larger one goes table by table, so each
# batch's arrays (~40 bytes per lookup across dedup, probe, slot pointers and pooling) stay in
# L2 from one phase to the next. Both serve the key stream sdm.simulate replays.
_FUSE_MAX_LOOKUPS = 1 << 13


class DramCacheTier(CacheTier):
    """Up to ``capacity_rows`` rows of any tables, each in a slot of ``slot_bytes`` bytes.

    Args:
        lower: the tier misses are read from (usually a :class:`~sdm.tiers.metered.Metered`).
        capacity_rows: cache slots, >= 1.
        slot_bytes: bytes per slot: the widest row of the store (rounded up to 64 here).
        policy: a name of ``sdm.POLICIES`` (not ``belady``, which needs the future).
        admission: None, ``"threshold"``, ``"tinylfu"`` or an :class:`sdm.policies.Admission`.

    Thread-safe: many batches are served at once (see the module's docstring).
    """

    def __init__(self, lower: Tier, capacity_rows: int, slot_bytes: int, *, policy: str = "lru",
                 admission=None, name: str = "cache", seed: int = 0):
        if isinstance(slot_bytes, bool) or not isinstance(slot_bytes, int) or slot_bytes < 1:
            raise ConfigError(f"cache slot_bytes must be an integer >= 1, got {slot_bytes!r}")
        if policy == "belady":
            raise ConfigError("policy 'belady' needs the future of the key stream; it exists in "
                              "sdm.simulate only, not in a live cache")
        self.name = name
        self.lower = lower
        self.directory = Cache(capacity_rows, policy, admission=admission, seed=seed, guarded=True)
        self.capacity = self.directory.capacity
        # a batch of hits alone is served in one pass over its lookups (_serve_hits)
        self._hits_commute = hits_commute(self.directory._code, self.directory._adm[0][A_KIND])
        self._try_hits_alone = self._hits_commute  # the last batch only hit (a hint; no lock)
        self.slot_bytes = -(-slot_bytes // _LINE) * _LINE
        # Slots never filled cost address space, not RAM; huge pages spare the page walk of a
        # hit's random slot (sdm.kernels.memory).
        self._slots = huge_empty((self.capacity + _MIN_SCRATCH, self.slot_bytes), np.uint8)
        self._state = np.full(self.capacity, SLOT_READY, dtype=np.uint8)  # SLOT_* | PREFETCHED
        # paced mode: when a slot's deferred read completes (perf_counter_ns), for the batches
        # that waited on it (np.zeros: untouched pages cost no RAM)
        self._ready_ns = np.zeros(self.capacity, dtype=np.float64)
        self._deferred_reads = False  # any so far: batches then check their slots' _ready_ns
        self._scratch = _Ranges(self.capacity, _MIN_SCRATCH)
        self._inflight = 0  # batches pointing into the slot buffer (it grows only at 0)
        self._epoch = 0
        self._flying: set[int] = set()  # epochs of the demand batches in flight
        self._counters = np.zeros(N_COUNTERS, dtype=np.int64)  # demand batches
        self._prefetch_counters = np.zeros(N_COUNTERS, dtype=np.int64)
        self._prefetched = 0  # rows read from below by prefetches
        self._pinned: dict[int, np.ndarray] = {}  # table id -> ids pinned by pin_rows
        self._bypass = _no_admission()  # pins and prefetches are decided, not filtered
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)

    @property
    def policy(self) -> str:
        return self.directory.policy

    # -- the batch path ----------------------------------------------------------------

    def _begin(self, layouts, keys: np.ndarray, *, prefetch: bool = False) -> "_Batch":
        """Probe distinct ascending cache ``keys`` of the tables ``layouts`` (ascending table
        ids, one each) under the lock (:func:`probe_batch_for`): plan every row, stamp the slots
        the batch uses (a demand batch joins the set in flight until :meth:`_end`; a prefetch
        pins its slots in the kernel, until :meth:`release`), claim its misses' slots. Caller
        holds the lock."""
        u = keys.shape[0]
        start = self._take_scratch(u)
        self._epoch += 1
        st = self._flying_state()
        ptr = np.empty(u, dtype=np.int64)
        is_miss = np.empty(u, dtype=np.bool_)
        waits = np.empty(u, dtype=np.int64)
        shared = np.empty(u, dtype=np.int64)
        n_waits, n_shared = probe_batch_for(self.directory._code)(
            keys, st,
            self._bypass if prefetch else self.directory._adm, self._slots, start, self._state,
            np.int64(self._epoch << 32), prefetch, ptr, is_miss, waits, shared,
            self._prefetch_counters if prefetch else self._counters)
        if not prefetch:
            self._flying.add(self._epoch)
        return _Batch(layouts, keys, ptr, is_miss, start, u, waits[:n_waits], self._slots, self._epoch,
                      shared[:n_shared], u - int(np.count_nonzero(is_miss)))

    def _flying_state(self):
        """The policy state with the epochs of the demand batches in flight listed in it (its
        array of them grown when full). Caller holds the lock."""
        st = self.directory._state
        m = len(self._flying)
        if m > st[20].shape[0]:
            st = self.directory._state = st[:20] + (np.zeros(2 * m, dtype=np.int64),)
        st[20][:m] = sorted(self._flying)
        st[0][M_FLYING] = m
        return st

    def _take_scratch(self, n: int) -> int:
        """The first of ``n`` scratch rows for one batch; waits for other batches to give
        theirs back, and grows the slot buffer when none is in flight. Caller holds the lock."""
        while True:
            start = self._scratch.take(n)
            if start is not None:
                self._inflight += 1
                return start
            if self._inflight == 0:  # nobody points into the buffer: grow it geometrically
                extra = max(n, 2 * self._scratch.size)
                grown = huge_empty((self.capacity + extra, self.slot_bytes), np.uint8)
                grown[: self.capacity] = self._slots[: self.capacity]
                self._slots = grown
                self._scratch = _Ranges(self.capacity, extra)
            else:
                give_up()
                self._cond.wait(_WAIT_S)

    def _read(self, batch: "_Batch", which: np.ndarray, source: Tier | None = None) -> None:
        """Read rows ``batch.keys[which]`` (ascending positions) from the tier below into
        their planned rows, every table's in one :meth:`~sdm.tiers.base.Tier.read_many`, no
        lock held; on failure their slots are marked failed (the next batch reads them)."""
        if not which.size:
            return
        try:
            parts = [(layout, which[lo:hi]) for layout, lo, hi in batch.tables(which)]
            reads = [(layout, batch.keys[mine] & _ROW_MASK,
                      np.empty((mine.size, layout.spec.row_bytes), dtype=np.uint8)) for layout, mine in parts]
            (source or self.lower).read_many(reads)
            for (_, mine), (_, _, fetched) in zip(parts, reads):
                fill_rows(batch.slots, batch.ptr[mine], fetched)
        except BaseException:
            self._mark(batch.ptr[which], SLOT_FAILED)
            raise
        paced = current_paced_request()
        self._mark(batch.ptr[which], SLOT_READY, paced.deadline_ns if paced is not None else 0.0)

    def _mark(self, rows: np.ndarray, ready: int, ready_ns: float = 0.0) -> None:
        """Set the ready state of the cache slots among ``rows`` and wake the waiters;
        ``ready_ns``: when their paced reads complete, if the reader deferred its wait."""
        with self._cond:
            mine = rows[rows < self.capacity]
            self._state[mine] = (self._state[mine] & PREFETCHED) | ready
            self._ready_ns[mine] = ready_ns
            self._deferred_reads |= ready_ns > 0
            self._cond.notify_all()

    def _wait_until_ready(self, batch: "_Batch") -> None:
        """Paced reads whose wait their reader deferred to its request's end (a
        :func:`~sdm.tiers.clock.paced_request`) mark their slots ready before that: a batch
        holding such a slot completes no earlier than the read, as if it had waited for a
        pending slot (its own request's wait is deferred too, or taken here)."""
        held = batch.ptr[batch.ptr < self.capacity]
        ready = float(self._ready_ns[held].max()) if held.size else 0.0
        paced = current_paced_request()
        if paced is not None:
            paced.wait_for(ready)
        elif ready > time.perf_counter_ns():
            wait_until_ns(int(ready))

    def _wait_for_others(self, batch: "_Batch") -> None:
        """Wait until the rows this batch hit while other batches were reading them are
        there; a row whose read failed is read again here."""
        while batch.waits.size:
            with self._cond:
                state = self._state[batch.ptr[batch.waits]] & READY_BITS
                while (state == SLOT_PENDING).all():
                    give_up()
                    self._cond.wait(_WAIT_S)
                    state = self._state[batch.ptr[batch.waits]] & READY_BITS
                failed = batch.waits[state == SLOT_FAILED]
                rows = batch.ptr[failed]
                self._state[rows] &= PREFETCHED  # claimed (SLOT_PENDING): this batch reads them
                batch.waits = batch.waits[state == SLOT_PENDING]
            self._read(batch, failed)

    def _end(self, batch: "_Batch") -> None:
        with self._cond:
            self._flying.discard(batch.epoch)
            if batch.shared.size:
                pin_batch(self.directory._state, batch.shared, -1)
            self._scratch.give(batch.start, batch.scratch_rows)
            self._inflight -= 1
            self._cond.notify_all()

    def _serve(self, layouts, keys: np.ndarray) -> "_Batch":
        """Make every row of distinct ascending cache ``keys`` of ``layouts``'s tables present
        for this batch (its slots held until :meth:`_end`); returns the batch."""
        with self._cond:
            batch = self._begin(layouts, keys)
        try:
            self._read(batch, np.flatnonzero(batch.is_miss))
            self._wait_for_others(batch)
            if self._deferred_reads:
                self._wait_until_ready(batch)
        except BaseException:
            self._end(batch)
            raise
        return batch

    def _view(self, layout: TableLayout, slots: np.ndarray) -> np.ndarray:
        raw = slots if layout.spec.row_bytes == self.slot_bytes else slots[:, : layout.spec.row_bytes]
        return typed_rows(raw, layout.spec.fmt)

    def pool_bags(self, bags) -> int:
        """Pool each table's bags (a sequence of :class:`~sdm.tiers.base.Bags`, one per
        table) into its ``out`` straight from the cache's slots, after one probe of the
        request's distinct rows (a large request's tables one batch each); returns the
        number of them that hit."""
        bags = sorted(bags, key=lambda b: b.layout.table_id)  # the key order the probe serves
        if sum(b.indices.shape[0] for b in bags) <= _FUSE_MAX_LOOKUPS:
            return self._pool_batch(bags)
        return sum(self._pool_batch([b]) for b in bags)

    def _serve_hits(self, layouts, ids: np.ndarray, base: int) -> "_Batch | None":
        """The batch of lookups ``base | ids`` (cache keys, repeats included: the row ids of
        one table and its key base, or keys and 0) if every one hits a ready slot, served in
        one pass (:func:`hit_batch_for`), its ``ptr`` the slot of each lookup and its
        ``keys`` None (the caller waits for its slots' deferred reads); else None, with nothing
        changed."""
        n = ids.shape[0]
        ptr = np.empty(n, dtype=np.int64)
        seen = np.empty(n, dtype=np.int64)
        with self._cond:
            epoch = self._epoch + 1  # taken only if the batch is served here
            hits, n_shared = hit_batch_for(self.directory._code)(
                ids, np.int64(base), self._flying_state(), self._state, np.int64(epoch << 32), ptr,
                seen, self._counters)
            if hits < 0:
                return None
            self._epoch = epoch
            self._flying.add(epoch)
            self._inflight += 1  # it points into the slot buffer, as a batch with scratch rows does
            return _Batch(layouts, None, ptr, None, 0, 0, seen[:0], self._slots, epoch, seen[:n_shared],
                          hits)

    def _pool_batch(self, bags) -> int:
        """:meth:`pool_bags` of ``bags`` (ascending table ids) as one batch."""
        layouts = [b.layout for b in bags]
        batch = None
        if self._try_hits_alone and len(bags) == 1:  # a table's row ids and key base: no keys made
            batch = self._serve_hits(layouts, bags[0].indices, _key_base(layouts[0]))
        elif self._try_hits_alone:
            batch = self._serve_hits(layouts, np.concatenate([_keys(b.layout, b.indices) for b in bags]), 0)
        if batch is None:
            keys = [_keys(b.layout, b.indices) for b in bags]
            unique, inverse, rank = unique_ranked(keys[0] if len(keys) == 1 else np.concatenate(keys))
            batch = self._serve(layouts, unique)
            # after a batch with a miss, the one pass is tried again once a batch hits only: where
            # most batches miss somewhere, none pays for a pass it throws away
            self._try_hits_alone = self._hits_commute and batch.hits == unique.shape[0]
        try:
            if batch.keys is not None:
                rows = compose(batch.ptr, rank, inverse)
            else:  # served in one pass: no reads of its own, but maybe another's deferred ones
                if self._deferred_reads:
                    self._wait_until_ready(batch)
                rows = batch.ptr
            start = 0
            for b in bags:
                end = start + b.indices.shape[0]
                pool(self._view(b.layout, batch.slots), rows[start:end], b.offsets, b.weights, b.mean,
                     b.layout.spec.fmt, b.out)
                start = end
        finally:
            self._end(batch)
        return batch.hits

    def read_rows(self, layout, ids, out):
        batch = self._serve([layout], _keys(layout, ids))
        try:
            np.take(batch.slots[:, : layout.spec.row_bytes], batch.ptr, axis=0, out=out)
        finally:
            self._end(batch)
        return ~batch.is_miss

    # -- pins and prefetch -------------------------------------------------------------

    def pin_rows(self, layout: TableLayout, ids: np.ndarray, *, source: Tier | None = None) -> None:
        """Load rows ``ids`` (sorted, unique int64) from ``source`` (default the tier below)
        and pin them for good (a placement's hot rows). They count against the capacity;
        demand counters are not touched. Rows of the table pinned earlier stay pinned.

        Raises:
            ConfigError: the pins would leave no slot for the rest of the traffic.
        """
        with self._cond:
            before = self._pinned.get(layout.table_id)
            ids = ids if before is None else np.setdiff1d(ids, before, assume_unique=True)
            total = sum(len(v) for v in self._pinned.values()) + len(ids)
            if total >= self.capacity:
                raise ConfigError(
                    f"cache {self.name!r}: pinning {total} rows leaves no slot of its "
                    f"{self.capacity} for other rows; pin fewer or give the cache more capacity")
            self._pinned[layout.table_id] = ids if before is None else np.union1d(before, ids)
            counters = self._prefetch_counters.copy()  # pins are setup: no counter moves
            batch = self._begin([layout], _keys(layout, ids), prefetch=True)
            self._prefetch_counters[:] = counters
        try:
            self._read(batch, np.flatnonzero(batch.is_miss & (batch.ptr < self.capacity)), source)
        finally:
            with self._cond:
                placed = batch.ptr[batch.ptr < self.capacity]
                self._state[placed] &= READY_BITS  # pinned for good, not a prefetch
                self._scratch.give(batch.start, batch.scratch_rows)
                self._inflight -= 1
                self._cond.notify_all()

    def prefetch(self, layout: TableLayout, ids: np.ndarray) -> int:
        """Bring rows ``ids`` (sorted, unique int64) of an upcoming batch into the cache and
        pin them until :meth:`release`; rows already cached are pinned too. Returns the rows
        read from the tier below. Rows that find no unpinned slot are skipped (counted as
        not admitted)."""
        with self._cond:
            batch = self._begin([layout], _keys(layout, ids), prefetch=True)
        missing = np.flatnonzero(batch.is_miss & (batch.ptr < self.capacity))
        try:
            self._read(batch, missing)
        finally:
            with self._cond:
                self._prefetched += int(missing.size)
                self._scratch.give(batch.start, batch.scratch_rows)
                self._inflight -= 1
                self._cond.notify_all()
        return int(missing.size)

    def release(self, layout: TableLayout, ids: np.ndarray) -> None:
        """Unpin rows ``ids`` pinned by :meth:`prefetch` (their batch has been served)."""
        with self._cond:
            slots = self.directory.lookup(_keys(layout, ids))
            self.directory.unpin(slots[slots >= 0])

    # -- the rest of the tier contract --------------------------------------------------

    def row_offsets(self, layout, ids):
        with self._cond:
            slots = self.directory.lookup(_keys(layout, np.asarray(ids, np.int64)))
        return np.where(slots >= 0, slots, 0) * self.slot_bytes

    def rows_changed(self, layout, ids):
        """Drop the changed rows; changed rows pinned by :meth:`pin_rows` are loaded again
        (pinned afresh) from the tier below, which serves the new ones."""
        with self._lock:
            freed = self.directory.remove(_keys(layout, ids))
            self._state[freed[freed >= 0]] &= READY_BITS
            pinned = self._pinned.get(layout.table_id)
        if pinned is not None:
            again = np.intersect1d(pinned, ids, assume_unique=True)
            if len(again):
                with self._lock:
                    self._pinned[layout.table_id] = np.setdiff1d(pinned, again, assume_unique=True)
                self.pin_rows(layout, again)

    def invalidate(self, layout):
        """Drop the table's rows, pinned ones included (their owner pins the new ones)."""
        with self._lock:
            keys = self.directory.slot_keys()
            mine = keys[(keys >= 0) & ((keys >> TABLE_SHIFT) == layout.table_id)]
            freed = self.directory.remove(mine)
            self._state[freed[freed >= 0]] &= READY_BITS
            self._pinned.pop(layout.table_id, None)

    def stats(self):
        c, p = self._counters, self._prefetch_counters
        hits, misses, rejected = int(c[C_HITS]), int(c[C_MISSES]), int(c[C_REJECTED])
        used = int(c[C_PREFETCH_USED])
        out = {"hits": hits, "misses": misses, "not_admitted": rejected,
               "capacity_rows": self.capacity, "cached_rows": len(self.directory),
               "pinned_rows": sum(len(v) for v in self._pinned.values()),
               "policy": self.policy,
               "admission": None if self.directory.admission is None else self.directory.admission.kind}
        if self._prefetched or p[C_HITS] or p[C_MISSES]:
            out.update({
                "prefetched": self._prefetched, "prefetch_already_cached": int(p[C_HITS]),
                "prefetch_skipped": int(p[C_REJECTED]), "prefetch_used": used,
                "prefetch_wasted": int(c[C_PREFETCH_WASTED] + p[C_PREFETCH_WASTED]),
                # of the rows the demand path needed from below, the share prefetch had read
                "prefetch_coverage": used / (used + misses) if used + misses else 0.0,
                # of the rows prefetch read, the share a demand batch used
                "prefetch_accuracy": used / self._prefetched if self._prefetched else 0.0})
        return out

    def check_invariants(self) -> None:
        """Raise AssertionError if the directory is inconsistent (tests)."""
        self.directory.check_invariants()

    def close(self):
        with self._lock:
            self._slots = np.empty((0, self.slot_bytes), dtype=np.uint8)


def _key_base(layout: TableLayout) -> int:
    """What the cache keys of ``layout``'s table add to its row ids."""
    return layout.table_id << TABLE_SHIFT


def _keys(layout: TableLayout, ids: np.ndarray) -> np.ndarray:
    """The cache keys of rows ``ids`` of ``layout``'s table."""
    return np.int64(_key_base(layout)) | ids


class _Batch:
    """One batch in flight: the tables it serves (ascending ids), its distinct cache keys
    (ascending), the row of ``slots`` serving each (the cache slots among them held for it),
    which it reads itself, its scratch rows, the hits it waits on other batches for, its epoch,
    the slots it pinned because another batch in flight had them, and how many keys hit.
    A batch of hits alone (:meth:`DramCacheTier._serve_hits`) has no ``keys``: its ``ptr`` is
    the slot of each lookup."""

    __slots__ = ("layouts", "keys", "ptr", "is_miss", "start", "scratch_rows", "waits", "slots", "epoch",
                 "shared", "hits")

    def __init__(self, layouts, keys, ptr, is_miss, start, scratch_rows, waits, slots, epoch, shared, hits):
        self.layouts, self.keys, self.ptr, self.is_miss = layouts, keys, ptr, is_miss
        self.start, self.scratch_rows, self.waits, self.slots = start, scratch_rows, waits, slots
        self.epoch, self.shared, self.hits = epoch, shared, hits

    def tables(self, which: np.ndarray):
        """``(layout, lo, hi)`` per table with keys among ``keys[which]`` (``which``
        ascending positions): ``which[lo:hi]`` are that table's."""
        if len(self.layouts) == 1:
            yield self.layouts[0], 0, which.size
            return
        bounds = np.searchsorted(self.keys[which] >> TABLE_SHIFT,
                                 [layout.table_id for layout in self.layouts] + [1 << 62])
        for layout, lo, hi in zip(self.layouts, bounds[:-1].tolist(), bounds[1:].tolist()):
            if hi > lo:
                yield layout, lo, hi


class _Ranges:
    """Free row ranges of ``[base, base + size)``, first fit: the scratch rows of the batches
    in flight. Not thread-safe (the cache's lock guards it)."""

    def __init__(self, base: int, size: int):
        self.size = size
        self._free = [(base, size)]  # (start, length), sorted by start, never adjacent

    def take(self, n: int) -> int | None:
        if n == 0:
            return self._free[0][0] if self._free else 0
        for i, (start, length) in enumerate(self._free):
            if length >= n:
                if length == n:
                    del self._free[i]
                else:
                    self._free[i] = (start + n, length - n)
                return start
        return None

    def give(self, start: int, n: int) -> None:
        if n == 0:
            return
        free = self._free
        i = 0
        while i < len(free) and free[i][0] < start:
            i += 1
        free.insert(i, (start, n))
        if i + 1 < len(free) and start + n == free[i + 1][0]:  # merge with the next range
            free[i] = (start, n + free[i + 1][1])
            del free[i + 1]
        if i > 0 and free[i - 1][0] + free[i - 1][1] == start:  # and with the previous one
            free[i - 1] = (free[i - 1][0], free[i - 1][1] + free[i][1])
            del free[i]

"""``Metered``: a device model wrapped around any tier (:func:`metered` picks the class).

The wrapper finds the blocks a batch touches from the inner tier's ``row_offsets``, queues
them on the device's :class:`DeviceQueue` (shared by every tier and request reading that
device, so latency rises with load), counts bytes read against useful bytes, and — by IO
mode (DESIGN.md §3) — either charges the completion to simulated time (``modeled``: the
request's :class:`~sdm.tiers.clock.Timeline` when it has one, else the store's clock), really
waits until it (``paced``; inside a :func:`~sdm.tiers.clock.paced_request`, once at the
request's end), or has the inner tier read its file with O_DIRECT (``direct``)
and records the wall time the real device took.
"""

from __future__ import annotations

import threading
import time

import numpy as np


from sdm.devices import DeviceSpec, blocks_of, get_device
from sdm.errors import ConfigError
from sdm.tiers.base import CacheTier, Tier
from sdm.kernels.devqueue import grow_device_state, lone_spans, make_device_state, reserve
from sdm.tiers.clock import SimClock, current_issue_log, current_paced_request, current_timeline, wait_until_ns
from sdm.tiers.manifest import TableLayout

__all__ = ["Metered", "MeteredCache", "metered", "DeviceQueue", "IO_MODES", "MAX_QUEUE_DEPTH"]

IO_MODES = ("modeled", "paced", "direct")
MAX_QUEUE_DEPTH = 1024
# How far apart in wall time paced threads may start reads that reach one device queue out of
# order (a thread descheduled between starting a read and charging it); older steps are dropped.
PACED_ORDER_NS = 100_000_000


class DeviceQueue:
    """One device's queue, shared by every request in flight (:mod:`sdm.kernels.devqueue`).

    ``units`` (reads the device serves at once) defaults to ``max_read_iops x latency``;
    giving it instead sets the throughput to ``units / latency``. Thread-safe.
    """

    def __init__(self, device, *, units: float | None = None):
        self.device: DeviceSpec = get_device(device)
        self.latency_ns = self.device.read_latency_us * 1e3
        iops = self.device.max_read_iops if units is None else units * 1e9 / self.latency_ns
        self.spacing_ns = max(1e9 / iops, self.device.access_bytes / self.device.read_bandwidth_gbps)
        self.units = self.latency_ns / self.spacing_ns
        self._state = make_device_state()
        self._lock = threading.Lock()
        self._reads = 0
        self._in_device = 0.0  # sum over reads of their time in the device

    def submit(self, issue_ns: float, reads: int, queue_depth: int, *,
               keep_from_ns: float | None = None) -> float:
        """Queue ``reads`` block reads issued from ``issue_ns`` on, ``queue_depth`` at a time,
        on the units earlier batches left free; returns how long they take (ns, queueing
        included): they complete at ``issue_ns`` plus that. ``keep_from_ns`` (default
        ``issue_ns``): no later batch issues before it (:func:`sdm.kernels.devqueue.reserve`)."""
        if reads <= 0:
            return 0.0
        with self._lock:
            self._state = grow_device_state(self._state)  # two breakpoints per batch in flight, at most
            keep = issue_ns if keep_from_ns is None else min(keep_from_ns, issue_ns)
            took, in_device = reserve(*self._state, float(keep), float(issue_ns),
                                      reads, queue_depth, self.latency_ns, self.units)
            self._reads += reads
            self._in_device += in_device
        return took

    def lone_ns(self, reads, queue_depth: int) -> np.ndarray:
        """How long each batch of ``reads`` ``(n,)`` int64 takes alone on the idle device,
        ``(n,)`` float64 ns: what :meth:`submit` charges a serial stream of batches."""
        reads = np.ascontiguousarray(reads, dtype=np.int64)
        return lone_spans(reads, queue_depth, self.latency_ns, self.units,
                          np.empty(reads.shape[0], dtype=np.float64))

    def counters(self) -> tuple[int, float]:
        """``(reads, in_device_ns)`` so far: over a window of ``elapsed`` ns, utilization is
        ``reads x spacing_ns / elapsed`` and the mean queue depth ``in_device_ns / elapsed``."""
        with self._lock:
            return self._reads, self._in_device


class Metered(Tier):
    """``inner`` as seen through ``device``: every read queued on the device and charged.

    Args:
        inner: the tier serving the rows.
        device: a :class:`~sdm.devices.DeviceSpec` or a preset name of ``sdm.DEVICES``.
        clock: the :class:`~sdm.tiers.clock.SimClock` to charge (a fresh one by default); share
            one across the tiers of a hierarchy so energy counts idle time correctly.
        io_mode: ``modeled`` (simulated time only), ``paced`` (also wait in wall-clock time
            until the modeled completion) or ``direct`` (the inner tier reads with O_DIRECT
            when it can; the modeled time is still charged, the real time is ``wall_ns``).
        queue_depth: reads in flight per batch, in ``[1, 1024]``.
        queue: the device's :class:`DeviceQueue`, shared with every other tier reading the
            same device (a fresh one by default).
    """

    def __init__(self, inner: Tier, device, clock: SimClock | None = None, *,
                 io_mode: str = "modeled", queue_depth: int = 1, name: str | None = None,
                 queue: DeviceQueue | None = None):
        if not isinstance(inner, Tier):
            raise ConfigError(f"Metered wraps a Tier, got {type(inner).__name__}")
        if io_mode not in IO_MODES:
            raise ConfigError(f"io_mode {io_mode!r} is not one of {IO_MODES}")
        if (isinstance(queue_depth, bool) or not isinstance(queue_depth, int)
                or not 1 <= queue_depth <= MAX_QUEUE_DEPTH):
            raise ConfigError(f"queue_depth must be an integer in [1, {MAX_QUEUE_DEPTH}], got {queue_depth!r}")
        self.inner = inner
        self.device: DeviceSpec = get_device(device)
        self.clock = clock if clock is not None else SimClock()
        self.io_mode = io_mode
        self.queue_depth = queue_depth
        self.queue = queue if queue is not None else DeviceQueue(self.device)
        self.name = name or inner.name
        self.kind = inner.kind
        self.holds_all_rows = inner.holds_all_rows
        self.supports_direct_io = inner.supports_direct_io
        self.supports_load_table = inner.supports_load_table
        self._start_ns = self.clock.now_ns()
        self._lock = threading.Lock()
        self._reads = 0
        self._useful = 0
        self._busy_ns = 0
        self._wall_ns = 0

    @property
    def true_io_mode(self) -> str:
        """``direct`` asked of a tier that cannot read with O_DIRECT (DRAM, a cache, LMDB)
        reads as ``modeled`` does."""
        return "modeled" if self.io_mode == "direct" and not self.inner.supports_direct_io else self.io_mode

    # -- reads -----------------------------------------------------------------------

    def read_rows(self, layout, ids, out):
        start = time.perf_counter_ns()
        served, blocks = self._read(layout, ids, out)
        if blocks:
            self._charge(blocks, _useful(layout, ids, served), start)
        with self._lock:
            self._wall_ns += time.perf_counter_ns() - start
        return served

    def _read(self, layout, ids, out) -> tuple[np.ndarray | None, int]:
        """Rows ``ids`` from the inner tier (with O_DIRECT in ``direct`` mode): ``(served,
        blocks)``, ``served`` as :meth:`read_rows` returns it and ``blocks`` the device blocks
        the rows it served itself span."""
        if self.io_mode == "direct" and self.inner.supports_direct_io:
            served = self.inner.read_rows_direct(layout, ids, out, queue_depth=self.queue_depth)
        else:
            served = self.inner.read_rows(layout, ids, out)
        own = ids if served is None else ids[served]
        if not len(own):
            return served, 0
        offsets = self.inner.row_offsets(layout, own)
        return served, int(blocks_of(np.ascontiguousarray(offsets, dtype=np.int64), layout.spec.row_bytes,
                                     self.device.access_bytes))

    def read_rows_direct(self, layout, ids, out, *, queue_depth=1):
        return self.inner.read_rows_direct(layout, ids, out, queue_depth=queue_depth)

    def count_hits(self, n: int, layout: TableLayout) -> None:
        """Rows pooled straight from the inner tier's resident table.

        Their offsets are not seen, so each row is charged as if block aligned
        (``ceil(row_bytes / access_bytes)`` blocks): a lower bound of the true count.
        """
        self.inner.count_hits(n, layout)
        if n:
            self._charge_rows(n, layout, time.perf_counter_ns())

    def _charge_rows(self, n: int, layout: TableLayout, start: int) -> None:
        per_row = -(-layout.spec.row_bytes // self.device.access_bytes)
        self._charge(n * per_row, n * layout.spec.row_bytes, start)

    def _charge(self, blocks: int, useful_bytes: int, wall_start: int) -> float:
        """Queue ``blocks`` reads on the device; returns the time they took (ns), queueing
        behind other requests' reads included."""
        timeline = current_timeline()
        paced = current_paced_request() if self.io_mode == "paced" else None
        log = current_issue_log()
        if log is not None:
            log.append((self.kind, wall_start))
        # keep: no later batch on this device issues before it. Timelines are served in
        # arrival order (a request's tables one after another, so the next request's first
        # batch can issue before this one's last); paced threads start their reads within
        # PACED_ORDER_NS of one another.
        if self.io_mode == "paced":  # real time: the queue holds wall-clock completions
            keep = wall_start - PACED_ORDER_NS
            # a deferred wait: the read issues when the request's previous one completed
            issue = wall_start if paced is None else max(wall_start, paced.deadline_ns)
        elif timeline is not None:
            issue, keep = timeline.now_ns, timeline.start_ns
        else:
            issue = keep = self.clock.now_ns()
        modeled = self.queue.submit(issue, blocks, self.queue_depth, keep_from_ns=keep)
        with self._lock:
            self._reads += blocks
            self._useful += useful_bytes
            self._busy_ns += modeled
        if self.io_mode == "paced":
            self.clock.advance_ns(round(modeled))
            if paced is None:
                wait_until_ns(int(issue + modeled))
            else:
                paced.wait_for(issue + modeled)
        elif timeline is not None:
            timeline.now_ns = issue + modeled
            self.clock.advance_to_ns(round(timeline.now_ns))
        else:  # integer time plus the rounded duration: what the sweep's model charges
            self.clock.advance_to_ns(issue + round(modeled))
        return modeled

    # -- the rest of the contract forwards to the inner tier --------------------------

    def row_offsets(self, layout, ids):
        return self.inner.row_offsets(layout, ids)

    def serves(self, layout):
        return self.inner.serves(layout)

    @property
    def medium(self):
        return self.inner.medium

    def resident(self, layout):
        return self.inner.resident(layout)

    def load_table(self, layout):
        return self.inner.load_table(layout)

    def invalidate(self, layout):
        self.inner.invalidate(layout)

    def rows_changed(self, layout, ids):
        self.inner.rows_changed(layout, ids)

    def close(self):
        self.inner.close()

    def stats(self) -> dict:
        """The inner tier's counters plus the device's: ``reads`` (blocks), ``bytes_read``,
        ``useful_bytes``, ``read_amplification``, ``modeled_ns`` (busy time), ``energy_j``
        (active over busy time, idle over the rest of the clock's elapsed time), ``wall_ns``
        (real time spent in reads, including the paced waits not deferred to the request's
        end and, for a cache, the reads of the tiers below it), ``device``, ``io_mode`` (how
        this tier really reads: ``direct`` only where it reads with O_DIRECT, else
        ``modeled``), ``queue_depth``."""
        with self._lock:
            reads, useful, busy, wall = self._reads, self._useful, self._busy_ns, self._wall_ns
        bytes_read = reads * self.device.access_bytes
        elapsed = self.clock.now_ns() - self._start_ns
        return {**self.inner.stats(), "reads": reads, "bytes_read": bytes_read, "useful_bytes": useful,
                "read_amplification": bytes_read / useful if useful else 0.0,
                "modeled_ns": round(busy), "energy_j": self.device.energy_j(busy, elapsed),
                "wall_ns": wall, "device": self.device.name, "io_mode": self.true_io_mode,
                "queue_depth": self.queue_depth}

    def __repr__(self):
        return f"Metered({self.inner!r}, device={self.device.name!r}, io_mode={self.io_mode!r})"


class MeteredCache(Metered, CacheTier):
    """:class:`Metered` around a :class:`~sdm.tiers.base.CacheTier`: the cache's own calls
    pass through, and pooling from its slots is charged to its device."""

    inner: CacheTier

    @property
    def lower(self) -> Tier:
        return self.inner.lower

    def pool_bags(self, bags) -> int:
        """Every lookup reads its row from the slots, as a resident table's lookups read
        theirs (:meth:`count_hits`), so both are charged alike: one row per lookup, and slots
        are cache-line aligned, so exactly ``ceil(row_bytes / access_bytes)`` blocks of a
        64-byte-line device; each table's lookups as one batch."""
        start = time.perf_counter_ns()
        hits = self.inner.pool_bags(bags)
        for b in bags:
            if len(b.indices):
                self._charge_rows(len(b.indices), b.layout, start)
        with self._lock:
            self._wall_ns += time.perf_counter_ns() - start
        return hits

    def pin_rows(self, layout, ids, *, source=None):
        self.inner.pin_rows(layout, ids, source=source)

    def prefetch(self, layout, ids):
        return self.inner.prefetch(layout, ids)

    def release(self, layout, ids):
        self.inner.release(layout, ids)


def _useful(layout: TableLayout, ids: np.ndarray, served: np.ndarray | None) -> int:
    """Bytes of the rows a tier served itself (all of ``ids`` when ``served`` is None)."""
    return (len(ids) if served is None else int(np.count_nonzero(served))) * layout.spec.row_bytes


def metered(inner: Tier, device, clock: SimClock | None = None, **options) -> Metered:
    """``inner`` behind ``device`` (arguments as :class:`Metered`): a :class:`MeteredCache`
    when ``inner`` is a cache, so the wrapper keeps every ability the tier has."""
    cls = MeteredCache if isinstance(inner, CacheTier) else Metered
    return cls(inner, device, clock, **options)

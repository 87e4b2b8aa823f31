"""A hierarchy: the store's tiers ordered fast to slow, built from a :class:`HierarchyConfig`.

The LMDB environment is always the durable copy of every row; a config decides which tiers
sit in front of it and whether it serves lookups itself. Every tier is wrapped in a
:class:`~sdm.tiers.metered.Metered` device model charging one shared simulated clock. A
lookup probes tiers fast to slow: a cache serves its hits and reads its misses from the
tier below (metered there), admitting them; the last tier holds every row.

A placement (``config.placement``, see :mod:`sdm.store.placement`) adds three decisions: tables
pinned whole in DRAM (a ``pinned`` DRAM tier in front that serves only those tables, metered
like every DRAM tier; their bytes come out of the first cache's capacity), hot rows pinned in
the first cache, and the order rows are laid out in the SCM row files (so rows looked up
together share device blocks).

The hierarchy uses the tier contract only (:mod:`sdm.tiers.base`): a table is served by the
first tier that :meth:`~sdm.tiers.base.Tier.serves` it; a tier that does not hold all rows is
a :class:`~sdm.tiers.base.CacheTier`.
"""

from __future__ import annotations

import os

import numpy as np

from sdm.tiers.clock import SimClock
from sdm.store.config import DRAM_QUEUE_DEPTH, HierarchyConfig, TierConfig
from sdm.errors import ConfigError
from sdm.formats import typed_rows
from sdm.kernels.dedup import unique_inverse
from sdm.tiers.manifest import Manifest, TableLayout
from sdm.kernels.pooling import pool
from sdm.tiers import DramTier, LmdbTier, Tier
from sdm.tiers.base import CacheTier
from sdm.tiers.dram_cache import DramCacheTier
from sdm.tiers.lmdb import RowDB
from sdm.devices import get_device
from sdm.policies.cache import MAX_CAPACITY
from sdm.tiers.io_engine import IOEngine
from sdm.validate import check_fits_memory
from sdm.tiers.metered import DeviceQueue, Metered, metered
from sdm.tiers.mmap import MmapTier
from sdm.tiers.patched import PatchedTier


_ENGINE_DEPTH_CAP = 64


class Hierarchy:
    """Tiers ordered fast to slow, each metered by its device on one :class:`SimClock`.

    A table is served by the first of ``tiers`` that serves it (every tier but a ``pinned``
    one serves every table): a cache forwards its misses to the tier below it and so on; the
    last tier holds all rows.
    """

    def __init__(self, config: HierarchyConfig, db: RowDB, *, clock: SimClock | None = None,
                 tables: tuple[TableLayout, ...] | None = None):
        self.config = config
        self.clock = clock if clock is not None else SimClock()
        directory = os.path.dirname(db.path)
        if tables is None:  # a store passes the tables of the manifest it serves
            tables = Manifest.read(directory).tables
        self.placement = _load_placement(config, tables)
        by_name = {t.name: t for t in tables}
        pinned_tables = [by_name[n] for n in self.placement.pinned_tables] if self.placement else []
        widest = max((t.spec.row_bytes for t in tables), default=1)
        total_rows = sum(t.spec.num_rows for t in tables)
        total_bytes = sum(t.spec.num_rows * t.spec.row_bytes for t in tables)
        first_cache = next((i for i, t in enumerate(config.tiers) if t.kind == "cache"), None)
        backing = LmdbTier(db)
        # One queue per device, shared by every tier on it and every request in flight.
        self.queues: dict[str, DeviceQueue] = {}

        def queue(device) -> DeviceQueue:
            return self.queues.setdefault(device.name, DeviceQueue(device))

        # In direct mode, one IO engine per device too: the reads in flight on a device are
        # bounded by its parallel units (at least a request's queue depth, at most
        # _ENGINE_DEPTH_CAP reader threads), whatever the number of requests.
        self.engines: dict[str, IOEngine] = {}

        def engine(tc: TierConfig) -> IOEngine | None:
            if config.io_mode != "direct":
                return None
            device = get_device(tc.device)
            depth = max(tc.queue_depth, min(_ENGINE_DEPTH_CAP, round(queue(device).units)))
            if device.name not in self.engines:
                self.engines[device.name] = IOEngine(device.name, depth, config.io_submission)
            return self.engines[device.name]

        built: list[Tier] = []
        lower: Tier | None = None
        for index in range(len(config.tiers) - 1, -1, -1):
            tc = config.tiers[index]
            where = f"hierarchy {config.name!r} tiers[{index}] ({tc.kind})"
            if tc.kind == "cache":
                inner: Tier = DramCacheTier(
                    lower, self._cache_rows(tc, widest, pinned_tables if index == first_cache else [], where,
                                            total_rows),
                    widest, policy=tc.policy, admission=tc.admission, name=_tier_name(config, index))
            else:
                _check_capacity(tc, total_rows, total_bytes, where)
                if tc.kind == "dram":
                    inner = DramTier(backing)
                elif tc.kind == "mmap":
                    order = {} if self.placement is None else self.placement.row_order
                    mapped = MmapTier(db, directory, row_order=order or None, io_engine=engine(tc))
                    inner = PatchedTier(mapped, db, rowfile=mapped.path_of)
                else:
                    inner = backing
            lower = metered(inner, tc.device, self.clock, io_mode=config.io_mode,
                            queue_depth=tc.queue_depth, name=_tier_name(config, index),
                            queue=queue(tc.device))
            built.append(lower)
        # Tables pinned whole: a resident copy in front, metered like every DRAM tier. Under a
        # `dram` top tier every table is resident already, so there is nothing to pin.
        if pinned_tables and config.tiers[0].kind != "dram":
            pinned = DramTier(backing, frozenset(t.table_id for t in pinned_tables), name="pinned")
            dram = get_device("dram")
            built.append(Metered(pinned, dram, self.clock, io_mode=config.io_mode,
                                 queue_depth=DRAM_QUEUE_DEPTH, queue=queue(dram)))
        self.tiers: list[Metered] = built[::-1]
        self._cache: CacheTier | None = next((t for t in self.tiers if not t.holds_all_rows), None)
        self._pin_plan: dict[int, np.ndarray] = {}
        if self._cache is not None and self.placement is not None:
            whole = {t.table_id for t in pinned_tables}
            for name, ids in self.placement.pinned_rows.items():
                if len(ids) and by_name[name].table_id not in whole:
                    self._pin_plan[by_name[name].table_id] = ids
            for layout in tables:
                self._pin(layout)

    def _cache_rows(self, tc: TierConfig, widest: int, pinned_tables, where: str, store_rows: int) -> int:
        """Slots of a cache tier: its capacity less the bytes of tables pinned whole, and never
        more than the ``store_rows`` rows it could ever hold (more would only be allocated)."""
        pinned = sum(t.spec.num_rows * t.spec.row_bytes for t in pinned_tables)
        budget = tc.capacity_rows * widest if tc.capacity_rows is not None else tc.capacity_bytes
        rows = (budget - pinned) // widest
        if rows < 1:
            raise ConfigError(f"{where}: capacity {budget} bytes holds no row of {widest} bytes (the "
                              f"widest row of the store)" + (f" once {pinned} bytes of pinned tables "
                                                              f"are taken out" if pinned else ""))
        rows = min(rows, max(1, store_rows - sum(t.spec.num_rows for t in pinned_tables)))
        given = (f"capacity_rows {tc.capacity_rows}" if tc.capacity_rows is not None
                 else f"capacity_bytes {tc.capacity_bytes} (--cache-bytes)")
        check_fits_memory(rows * widest, f"{where}:", given, f"{rows:,} cache slots x {widest} B",
                          error=ConfigError)
        if rows > MAX_CAPACITY:
            raise ConfigError(f"{where}: {given} makes {rows:,} cache slots, more than the "
                              f"{MAX_CAPACITY:,} a cache holds")
        return rows

    def _pin(self, layout: TableLayout) -> None:
        # Loading pinned rows is setup, not serving: read through the tier below's own
        # medium, uncharged, so device counters show the traffic only.
        ids = self._pin_plan.get(layout.table_id)
        if ids is not None and layout.generation is not None:
            self._cache.pin_rows(layout, ids, source=self._cache.lower.medium)

    def serving(self, layout: TableLayout) -> Tier:
        """The tier lookups of ``layout``'s table start at."""
        return next(t for t in self.tiers if t.serves(layout))

    def resident(self, layout: TableLayout) -> np.ndarray | None:
        """The whole table in memory when the serving tier keeps it so, else None."""
        return self.serving(layout).resident(layout)

    def count_resident_hits(self, n: int, layout: TableLayout) -> None:
        """Record ``n`` rows of ``layout`` pooled straight from :meth:`resident`."""
        self.serving(layout).count_hits(n, layout)

    def read_rows(self, layout: TableLayout, ids: np.ndarray, out: np.ndarray) -> None:
        """Rows ``ids`` (sorted, unique int64) into ``out`` ``(n, row_bytes) uint8``, probing
        the tiers fast to slow."""
        self.serving(layout).read_rows(layout, ids, out)

    def pool(self, bags) -> None:
        """Pool the validated bags of a request's tables (a sequence of
        :class:`~sdm.tiers.base.Bags`, one per table), each into its ``out``.

        A resident table is pooled in place; the tables under a cache are pooled straight
        from its slots after one probe of their distinct ids; otherwise a table's distinct
        rows are read once from the serving tier and pooled from that buffer.
        """
        cached: dict[int, tuple[Tier, list]] = {}
        for b in bags:
            layout, fmt = b.layout, b.layout.spec.fmt
            tier = self.serving(layout)
            table = tier.resident(layout)
            if table is not None:
                tier.count_hits(len(b.indices), layout)
                pool(typed_rows(table, fmt), b.indices, b.offsets, b.weights, b.mean, fmt, b.out)
            elif not tier.holds_all_rows:
                cached.setdefault(id(tier), (tier, []))[1].append(b)
            else:
                unique, inverse = unique_inverse(b.indices)
                rows = np.empty((len(unique), layout.spec.row_bytes), dtype=np.uint8)
                tier.read_rows(layout, unique, rows)
                pool(typed_rows(rows, fmt), inverse, b.offsets, b.weights, b.mean, fmt, b.out)
        for tier, mine in cached.values():
            tier.pool_bags(mine)

    def prefetch(self, layout: TableLayout, ids: np.ndarray) -> bool:
        """Bring rows ``ids`` (sorted, unique int64) into the serving cache ahead of use and
        pin them until :meth:`release`. Returns False (nothing done) when no cache serves the
        table: then every row is served from a tier that holds them all anyway."""
        tier = self.serving(layout)
        if tier.holds_all_rows:
            return False
        tier.prefetch(layout, ids)
        return True

    def release(self, layout: TableLayout, ids: np.ndarray) -> None:
        """Unpin rows a :meth:`prefetch` of ``layout``'s table pinned."""
        tier = self.serving(layout)
        if not tier.holds_all_rows:
            tier.release(layout, ids)

    def invalidate(self, layout: TableLayout) -> None:
        """``layout``'s rows changed: every tier forgets them, slow to fast (so a cache's
        pinned rows are loaded again from tiers that hold the new ones)."""
        for tier in self.tiers[::-1]:
            tier.invalidate(layout)
        if self._cache is not None:
            self._pin(layout)

    def rows_changed(self, layout: TableLayout, ids: np.ndarray) -> None:
        """Rows ``ids`` (sorted, unique int64) of ``layout``'s table were updated in LMDB:
        every tier forgets or refreshes its copy, slow to fast (so a cache reloading a pinned
        row reads the new one)."""
        for tier in self.tiers[::-1]:
            tier.rows_changed(layout, ids)

    def stats(self) -> list[dict]:
        """Per tier, fast to slow: ``name``, ``kind``, ``device``, ``hits``, ``misses``,
        ``reads``, ``bytes_read``, ``useful_bytes``, ``read_amplification``, ``modeled_ns``,
        ``energy_j``, ``wall_ns`` (the tier's own real time: a cache's excludes the reads of
        the tier below, which it waits on), ``io_mode``, ``queue_depth`` and tier-specific
        counters. With tables pinned whole, a ``pinned`` DRAM tier comes first."""
        out = [{"name": tier.name, "kind": tier.kind, "hits": 0, "misses": 0, **tier.stats()}
               for tier in self.tiers]
        for upper, lower, tier in zip(out, out[1:], self.tiers):
            if not tier.holds_all_rows:  # a cache calls the tier below it, inside its own time
                upper["wall_ns"] = max(0, upper["wall_ns"] - lower["wall_ns"])
        return out

    def device_stats(self) -> dict[str, dict]:
        """Per device, its shared queue's ``units``, ``spacing_ns`` (work per read), and the
        running ``reads`` and ``in_device_ns``: over a window of ``T`` ns, the device's
        utilization is ``reads x spacing_ns / T`` and its mean queue depth ``in_device_ns / T``.
        In ``direct`` mode a device read through an IO engine adds ``engine``: its ``depth``,
        the pages it ``reads`` and ``peak_in_flight``, the most jobs it ran at once."""
        out = {}
        for name, queue in self.queues.items():
            reads, in_device = queue.counters()
            out[name] = {"units": queue.units, "spacing_ns": queue.spacing_ns, "reads": reads,
                         "in_device_ns": in_device}
            if name in self.engines:
                out[name]["engine"] = self.engines[name].stats()
        return out

    def modeled_ns(self) -> int:
        """Simulated time since the hierarchy was built (every tier's busy time, in turn)."""
        return self.clock.now_ns()

    def close(self) -> None:
        for tier in self.tiers:
            tier.close()
        for engine in self.engines.values():
            engine.close()


def _load_placement(config: HierarchyConfig, tables):
    """The config's placement (a Placement or a path: the config checked which), checked
    against the store's tables."""
    placement = config.placement
    if placement is None:
        return None
    if isinstance(placement, str):
        from sdm.store.placement import Placement  # only hierarchies with a placement file need it

        placement = Placement.load(placement)
    placement.validate({t.name: t.spec for t in tables})
    return placement


def _tier_name(config: HierarchyConfig, index: int) -> str:
    """The name ``stats()`` shows: the kind (``lmdb``, ``mmap``, ``dram``), or for caches
    ``cache`` and ``cache2``... in order, so names stay unique."""
    kind = config.tiers[index].kind
    if kind != "cache":
        return kind
    before = sum(1 for t in config.tiers[:index] if t.kind == "cache")
    return "cache" if before == 0 else f"cache{before + 1}"


def _check_capacity(tc: TierConfig, total_rows: int, total_bytes: int, where: str) -> None:
    # A tier holding every row must have room for every row.
    if tc.capacity_rows is not None and total_rows > tc.capacity_rows:
        raise ConfigError(f"{where}: the store holds {total_rows} rows, more than "
                          f"capacity_rows {tc.capacity_rows}")
    if tc.capacity_bytes is not None and total_bytes > tc.capacity_bytes:
        raise ConfigError(f"{where}: the store's rows take {total_bytes} bytes, more than "
                          f"capacity_bytes {tc.capacity_bytes}")

"""Request profiles: what each request of a warm replay asks of a host's cores and devices.

:func:`build_profile` serves a trace twice under a hierarchy with the host's DRAM cache:
the first pass warms the cache and is left out, the second is profiled. Per request of the
second pass it records

* lookups, distinct rows and DRAM hits (the control plane: ``sdm.simulate`` on the key
  stream the store's cache sees, :func:`sdm.replay.requests.key_stream`, which a test keeps
  equal to the live store's counts);
* its device batches, as the store issues them (tables one after another; per table the
  SCM reads of its misses, then the DRAM line reads of its lookups from the cache slots),
  each SCM tier's blocks striped over that tier's devices by block number (device
  ``block % count``), and the block numbers of each SCM batch themselves, so that
  :func:`sdm.host.variants.with_scm_devices` stripes the same reads over another count of
  devices without serving the trace again;
* its CPU work, measured here on a live store: the thread CPU time of its
  ``Store.embedding_bags`` call (dedup, probe, pooling, hits and misses as they fall; the
  median over warm passes, :func:`_measure_cpu`; in the hierarchy's IO mode when it is
  ``paced``, else ``modeled``) and, with a DLRM preset, the bottom MLP and the interaction +
  top MLP at their measured time per sample (:func:`_mlp_cpu`); all divided by the host's
  ``core_speed``;
* where in its CPU work each device batch issues (:func:`_issue_points`): the store reaches
  a table's reads only after the work before them;
* on ``this-machine``, how much slower a request runs on a core that sat idle before it, and
  how early in the request that extra time falls (:func:`_measure_cold`): the back-to-back
  passes above keep caches, branch predictors and clocks warm, and live load at a low rate
  does not.

It also reports how fast the hit rate settles: the requests of the two passes after which
the rest's last half is within 0.01 of the rest's whole.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numba
import numpy as np

from sdm.devices import get_device
from sdm.errors import ConfigError, InvalidArgumentError
from sdm.formats import check_format, row_bytes as row_bytes_of
from sdm.host.spec import THIS_MACHINE, HostSpec, resolve_host
from sdm.host.threads import ThreadCurve, measure_threads
from sdm.policies import simulate
from sdm.replay.live import DEFAULT_DIM, build_store, check_store_tables, make_model
from sdm.replay.requests import KeyStream, check_request_size, iter_requests, key_stream
from sdm.replay.sweep import _ROW_MASK, segment_blocks
from sdm.store.config import HierarchyConfig, resolve_config, with_io_mode, with_options
from sdm.store.store import Store
from sdm.tiers.clock import recorded_issues
from sdm.tiers.metered import DeviceQueue
from sdm.tiers.rowfile import HEADER_BYTES
from sdm.trace.format import Trace, load
from sdm.validate import check_int

__all__ = ["RequestProfile", "Device", "device_of", "segment_block_ids", "UnsupportedHierarchy", "build_profile", "hit_rate_settles_after", "CONVERGED_WITHIN"]

#: The hit rate has settled when the last half of the requests after a point is within this
#: of all of them.
CONVERGED_WITHIN = 0.01
_MODEL_SAMPLES = 16  # requests whose forward pass is timed to get the MLPs' time per sample
# Each request's CPU time is the median of its timed passes, repeated until _TIMED_S of wall
# time (at least _MIN_PASSES, at most _MAX_PASSES): see _measure_cpu.
_TIMED_S = 1.5
_MIN_PASSES = 3
_MAX_PASSES = 64
# _measure_cold: the idle gaps (ms) it times requests after, how many requests, how many rounds.
_COLD_GAPS_MS = (0.3, 1.0, 3.0, 10.0, 30.0)
_COLD_REQUESTS = 16
_COLD_ROUNDS = 2
_COLD_EXTRA_MIN = 0.1  # a cold call at least this much slower than warm shows where its extra time fell
_ISSUE_PASSES = 3  # passes that record where each request's reads issue (_issue_points)


class UnsupportedHierarchy(ConfigError):
    """A hierarchy whose shape the host model does not cover (it names the shapes it does)."""


@dataclass(frozen=True)
class Device:
    """One device of the host: ``group`` names what it serves (``dram`` or the SCM tier's
    kind), ``latency_ns`` / ``spacing_ns`` as :class:`~sdm.tiers.metered.DeviceQueue`;
    ``read_cpu_ns``: the host's core time per read (direct IO's, measured; 0: none, as a
    modeled device's timer); ``read_threads``: how many threads spend one request's read CPU
    at once (1: the request's own, with kernel AIO; 0: as many as it has reads in flight, one
    reader thread each)."""

    name: str
    group: str
    latency_ns: float
    spacing_ns: float
    read_cpu_ns: float = 0.0
    read_threads: int = 0

    @property
    def units(self) -> float:
        return self.latency_ns / self.spacing_ns


@dataclass
class RequestProfile:
    """``R`` profiled requests, the arrays :func:`sdm.kernels.hostsim.simulate_host` takes.

    Per request ``(R,)``: ``samples``, ``lookups``, ``distinct`` (rows after dedup per table),
    ``hits`` (of those, DRAM hits) int64; ``cpu_emb_ns``, ``cpu_bottom_ns``, ``cpu_top_ns``
    float64 (already divided by the host's core speed). Batches: ``batch_ptr`` ``(R + 1,)``,
    ``batch_qd`` ``(nb,)``, ``sub_ptr`` ``(nb + 1,)``, ``sub_dev`` / ``sub_reads`` ``(ns,)``
    int64. ``devices``: index -> :class:`Device` (the DRAM device first, then the SCM tier's).
    ``scm_block_ptr`` ``(nb + 1,)`` / ``scm_block_ids`` int64: CSR of each batch's SCM block
    numbers, ascending (an empty range for a DRAM batch; None for a profile without SCM), from
    which the batch's parts on any number of devices follow. ``cold_gap_ns`` /
    ``cold_factor`` ``(G,)`` float64: a CPU task's time on a core idle ``cold_gap_ns[g]``
    before it is ``cold_factor[g]`` times its profiled time (interpolated; empty: 1,
    measured on ``this-machine`` only): the median of the measured cold calls; ``cold_draws``
    ``(S, G)`` float64 (empty: the medians alone): each gap's measured slowdowns, ascending
    (row ``s`` the ``s``-th smallest at every gap), of which a simulated request draws one
    row (:meth:`cold_table`); where present they, not ``cold_factor``, are simulated, so an
    edit of one must edit the other (or clear the draws). ``batch_after_ns`` ``(nb,)`` float64 (None: all 0):
    the embedding task's CPU time into which each batch's reads issue at the earliest, as
    the live store reaches them (:func:`_issue_points`); ``batch_cold_ns`` (None: as
    ``batch_after_ns``): how much of that time a cold core stretches, from
    ``cold_issue_share`` / ``cold_issue_extra`` ``(K,)`` float64: of a cold task's extra time,
    the share spent before a point ``cold_issue_share`` of the way into its warm time
    (measured with the cold factors; empty: evenly). ``settles_after``: requests (of both passes)
    the hit rate took to settle, None if it did not; ``live_hits``: the live store's cache hits
    over the profiled pass (None without a cache), equal to ``hits.sum()`` when the control
    plane and the store agree.
    """

    trace: str
    config: str
    host: HostSpec
    io_mode: str
    model: str | None
    row_bytes: int
    cache_bytes: int | None
    samples: np.ndarray
    lookups: np.ndarray
    distinct: np.ndarray
    hits: np.ndarray
    cpu_emb_ns: np.ndarray
    cpu_bottom_ns: np.ndarray
    cpu_top_ns: np.ndarray
    batch_ptr: np.ndarray
    batch_qd: np.ndarray
    sub_ptr: np.ndarray
    sub_dev: np.ndarray
    sub_reads: np.ndarray
    devices: list
    settles_after: int | None
    live_hits: int | None
    bottom_ns_per_sample: float = 0.0
    top_ns_per_sample: float = 0.0
    scm_block_ptr: np.ndarray | None = None
    scm_block_ids: np.ndarray | None = None
    cold_gap_ns: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    cold_factor: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    cold_draws: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0)))
    batch_after_ns: np.ndarray | None = None
    batch_cold_ns: np.ndarray | None = None
    cold_issue_share: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    cold_issue_extra: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    threads: ThreadCurve | None = None

    @property
    def requests(self) -> int:
        return int(self.samples.shape[0])

    def cold_table(self) -> np.ndarray:
        """``(S, G)`` float64 cold-core factors, a row per draw (``sdm.kernels.hostsim``'s
        ``cold_factor``): the measured draws, else the medians as one row."""
        if self.cold_draws.shape[0] and self.cold_draws.shape[1] == self.cold_gap_ns.shape[0]:
            return np.ascontiguousarray(self.cold_draws, dtype=np.float64)
        return np.ascontiguousarray(self.cold_factor, dtype=np.float64).reshape(1, -1)

    @property
    def hit_rate(self) -> float:
        """DRAM hits over distinct rows read (the share ``sdm replay`` reports); 1 for ``dram``."""
        total = int(self.distinct.sum())
        return float(self.hits.sum()) / total if total else 0.0

    def reads_per_request(self) -> np.ndarray:
        """``(D,)`` float64 mean block reads per request on each device."""
        out = np.zeros(len(self.devices))
        np.add.at(out, self.sub_dev, self.sub_reads)
        return out / max(self.requests, 1)

    def read_cpu_ns_per_request(self) -> float:
        """Mean core time per request its device reads cost (direct IO's readers)."""
        return float(self.reads_per_request() @ np.array([d.read_cpu_ns for d in self.devices]))

    def cpu_ns_per_request(self) -> float:
        """Mean core time per request: its CPU tasks and its reads' CPU."""
        return float((self.cpu_emb_ns + self.cpu_bottom_ns + self.cpu_top_ns).mean()) + self.read_cpu_ns_per_request()

    def _issue_summary(self) -> dict:
        """Per request, the CPU time into its embedding task of its first and last batch's
        issue, averaged over requests with batches (µs)."""
        after, ptr = self.batch_after_ns, self.batch_ptr
        has = np.flatnonzero(np.diff(ptr) > 0)
        if after is None or not has.size:
            return {"first": 0.0, "last": 0.0}
        return {"first": float(after[ptr[has]].mean()) / 1e3, "last": float(after[ptr[has + 1] - 1].mean()) / 1e3}

    def summary(self) -> dict:
        reads = self.reads_per_request()
        return {"requests": self.requests, "samples_per_request": float(self.samples.mean()),
                "lookups_per_request": float(self.lookups.mean()),
                "distinct_rows_per_request": float(self.distinct.mean()), "hit_rate": self.hit_rate,
                "cache_bytes": self.cache_bytes, "settles_after_requests": self.settles_after,
                "live_hits": self.live_hits, "profiled_hits": int(self.hits.sum()),
                "cpu_us_per_request": {"embeddings": float(self.cpu_emb_ns.mean()) / 1e3,
                                       "bottom_mlp": float(self.cpu_bottom_ns.mean()) / 1e3,
                                       "interaction_top_mlp": float(self.cpu_top_ns.mean()) / 1e3,
                                       "device_reads": self.read_cpu_ns_per_request() / 1e3},
                "mlp_us_per_sample": {"bottom": self.bottom_ns_per_sample / 1e3,
                                      "interaction_top": self.top_ns_per_sample / 1e3},
                "reads_issue_after_us": self._issue_summary(),
                "cold_extra_before": [{"warm_share": float(a), "extra_share": float(b)}
                                      for a, b in zip(self.cold_issue_share, self.cold_issue_extra)],
                "cold_core": [{"idle_us": float(g) / 1e3, "cpu_factor": float(f),
                               "cpu_factor_q10": float(np.quantile(draws, 0.1)),
                               "cpu_factor_q90": float(np.quantile(draws, 0.9)),
                               "cpu_factor_max": float(draws.max())}
                              for g, f, draws in zip(self.cold_gap_ns, self.cold_factor, self.cold_table().T)],
                "threads": None if self.threads is None else self.threads.to_json(),
                "cpu_slots": None if self.threads is None else self.threads.cpu_slots,
                "devices": [{"name": d.name, "group": d.group, "latency_us": d.latency_ns / 1e3,
                             "units": d.units, "cpu_us_per_read": d.read_cpu_ns / 1e3,
                             "read_threads": d.read_threads,
                             "reads_per_request": float(reads[i])}
                            for i, d in enumerate(self.devices)]}


def hit_rate_settles_after(hits, rows, *, within: float = CONVERGED_WITHIN, steps: int = 64) -> int | None:
    """The first request ``k`` (on a grid of ``steps``) after which the hit rate of the last
    half of requests ``k:`` is within ``within`` of that of all of them; None if none is.

    ``hits``, ``rows``: ``(R,)`` per request DRAM hits and distinct rows read."""
    hits = np.asarray(hits, dtype=np.float64)
    rows = np.asarray(rows, dtype=np.float64)
    n = hits.shape[0]
    ch, cr = np.concatenate(([0.0], np.cumsum(hits))), np.concatenate(([0.0], np.cumsum(rows)))
    for k in sorted({int(i) for i in np.linspace(0, n - 2, steps)} if n >= 2 else ()):
        mid = k + (n - k) // 2
        whole, half = cr[n] - cr[k], cr[n] - cr[mid]
        if whole <= 0 or half <= 0:
            continue
        if abs((ch[n] - ch[mid]) / half - (ch[n] - ch[k]) / whole) <= within:
            return k
    return None


def _shape(config: HierarchyConfig) -> tuple:
    """``(cache tier or None, SCM tier or None, DRAM tier config)`` of a supported hierarchy."""
    kinds = [t.kind for t in config.tiers]
    if config.pooled_cache_bytes or config.placement is not None:
        raise UnsupportedHierarchy(f"hierarchy {config.name!r}: the host model does not model a pooled-embedding "
                          f"cache or a placement; use a hierarchy without them")
    if kinds == ["dram"]:
        return None, None, config.tiers[0]
    if kinds == ["cache", "mmap"]:
        return config.tiers[0], config.tiers[1], config.tiers[0]
    raise UnsupportedHierarchy(f"hierarchy {config.name!r} has tiers {kinds}; the host model covers ['dram'] and "
                      f"['cache', 'mmap'] (the dram, sdm-nand and sdm-3dxp shapes)")


def _dram_device(tier, host: HostSpec):
    dev = get_device(tier.device)
    if host.dram_bandwidth_gbps is None:
        return dev
    return dataclasses.replace(dev, read_bandwidth_gbps=host.dram_bandwidth_gbps,
                               max_read_iops=host.dram_bandwidth_gbps * 1e9 / dev.access_bytes)


def device_of(spec, group: str, index: int | None = None) -> Device:
    """The :class:`Device` a profile holds for ``spec`` serving ``group`` (``index``: its place
    among the tier's devices, None for a tier of one)."""
    q = DeviceQueue(spec)
    name = spec.name if index is None else f"{spec.name}#{index}"
    return Device(name, group, q.latency_ns, q.spacing_ns)


def _host_config(config: HierarchyConfig, host: HostSpec, table_bytes: int) -> HierarchyConfig:
    """``config`` with the host's DRAM cache size and SCM device."""
    cache, scm, _ = _shape(config)
    if cache is not None:
        size = host.dram_cache_bytes
        if host.dram_cache_fraction is not None:
            size = max(1, int(host.dram_cache_fraction * table_bytes))
        if size is not None:
            config = with_options(config, cache_bytes=size)
    if scm is not None and host.scm and host.scm[0].device is not None:
        tiers = (config.tiers[0], dataclasses.replace(config.tiers[1], device=host.scm[0].device))
        config = dataclasses.replace(config, tiers=tiers)
    return config


def segment_block_ids(stream: KeyStream, mask, row_bytes: int, block_bytes: int) -> tuple:
    """``(ptr (S + 1,), ids)`` int64: per segment of ``stream`` (one table of one request) the
    distinct ``block_bytes`` blocks, ascending, covering the rows ``mask`` (per key, True: a
    DRAM hit) leaves to the SCM tier, each at ``HEADER_BYTES + row * row_bytes`` of its table's
    row file. Counting them by ``block % count`` gives :func:`segment_blocks`' striping."""
    nseg = stream.segments.shape[0] - 1
    seg = np.repeat(np.arange(nseg, dtype=np.int64), np.diff(stream.segments))
    miss = ~np.asarray(mask, dtype=np.bool_)
    seg = seg[miss]
    off = HEADER_BYTES + (stream.keys[miss] & _ROW_MASK).astype(np.int64) * row_bytes
    first = off // block_bytes
    span = (off + row_bytes - 1) // block_bytes - first + 1
    starts = np.cumsum(span) - span
    blk = np.repeat(first, span) + (np.arange(int(span.sum()), dtype=np.int64) - np.repeat(starts, span))
    seg = np.repeat(seg, span)
    order = np.lexsort((blk, seg))
    seg, blk = seg[order], blk[order]
    keep = np.ones(seg.shape[0], dtype=np.bool_)
    keep[1:] = (seg[1:] != seg[:-1]) | (blk[1:] != blk[:-1])
    seg, blk = seg[keep], blk[keep]
    ptr = np.concatenate(([0], np.cumsum(np.bincount(seg, minlength=nseg)))).astype(np.int64)
    return ptr, blk.astype(np.int64)


def _batches(stream: KeyStream, mask, config: HierarchyConfig, host: HostSpec, row_bytes: int):
    """The batch arrays of :class:`RequestProfile` and the devices they index, then ``(nb,)``
    bool: which batches read the SCM tier."""
    cache, scm, dram_tier = _shape(config)
    devices = [device_of(_dram_device(dram_tier, host), "dram")]
    nseg = stream.segments.shape[0] - 1
    count = host.scm[0].count if host.scm else 1
    if scm is not None:
        spec = get_device(scm.device)
        if config.io_mode == "direct":
            if host.direct_device is None:
                raise ConfigError(f"host {host.name!r} has no direct_device: direct IO reads a real disk, "
                                  f"so the model needs its calibration (sdm devices calibrate DIR -o "
                                  f"disk.toml, then --disk disk.toml)")
            spec = host.direct_device
        devices += [device_of(spec, scm.kind, i if count > 1 else None) for i in range(count)]
        blocks = np.empty((nseg, count), dtype=np.int64)
        segment_blocks(stream.keys, mask, stream.segments, np.int64(row_bytes), np.int64(HEADER_BYTES),
                       np.int64(spec.access_bytes), blocks)
        id_ptr, ids = segment_block_ids(stream, mask, row_bytes, spec.access_bytes)
    else:
        blocks = np.zeros((nseg, 0), dtype=np.int64)
        id_ptr = ids = None
    lines = -(-row_bytes // get_device(dram_tier.device).access_bytes)
    dram_reads = stream.segment_lookups * lines
    # Per segment: one SCM batch when it misses (its parts: the devices it reads), then one
    # DRAM batch when it looks anything up.
    has_scm = blocks.sum(axis=1) > 0 if count else np.zeros(nseg, dtype=bool)
    # Direct IO waits for the real disk only; the DRAM model's time is not waited for, and the
    # real DRAM time is inside the measured CPU time.
    has_dram = (dram_reads > 0) & (config.io_mode != "direct")
    per_seg = has_scm.astype(np.int64) + has_dram
    seg_ptr = np.concatenate(([0], np.cumsum(per_seg)))
    batch_qd, parts_dev, parts_reads, parts_len, batch_ids, batch_scm = [], [], [], [], [], []
    empty = np.zeros(0, dtype=np.int64)
    for s in range(nseg):  # a Python loop over segments: profiles are built once
        if has_scm[s]:
            used = np.flatnonzero(blocks[s])
            batch_qd.append(scm.queue_depth)
            parts_dev.append(used + 1)
            parts_reads.append(blocks[s, used])
            parts_len.append(used.shape[0])
            batch_ids.append(ids[id_ptr[s]:id_ptr[s + 1]])
            batch_scm.append(True)
        if has_dram[s]:
            batch_qd.append(dram_tier.queue_depth)
            parts_dev.append(np.zeros(1, dtype=np.int64))
            parts_reads.append(dram_reads[s:s + 1])
            parts_len.append(1)
            batch_ids.append(empty)
            batch_scm.append(False)
    tables = stream.num_tables
    batch_ptr = seg_ptr[::tables].astype(np.int64)
    sub_ptr = np.concatenate(([0], np.cumsum(parts_len))).astype(np.int64)

    def cat(parts):
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    if scm is None:
        block_ptr = block_ids = None
    else:
        block_ptr = np.concatenate(([0], np.cumsum([b.shape[0] for b in batch_ids]))).astype(np.int64)
        block_ids = cat(batch_ids)
    return (batch_ptr, np.asarray(batch_qd, dtype=np.int64), sub_ptr, cat(parts_dev), cat(parts_reads),
            devices, block_ptr, block_ids, np.asarray(batch_scm, dtype=np.bool_))


@contextmanager
def _one_kernel_thread():
    """Numba's parallel kernels on one thread (this thread's setting) inside the block."""
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(before)


def _timed_passes(one_pass) -> list:
    """``one_pass()``'s results, run at least :data:`_MIN_PASSES` times and then until
    :data:`_TIMED_S` seconds of wall time have passed (at most :data:`_MAX_PASSES` runs)."""
    runs, start = [], time.perf_counter()
    while len(runs) < _MIN_PASSES or (time.perf_counter() - start < _TIMED_S and len(runs) < _MAX_PASSES):
        runs.append(one_pass())
    return runs


def _measure_cold(st, bags, emb_ns, issues) -> tuple:
    """``(idle_ns (G + 1,), factor (G + 1,), share (K,), extra (K,), draws (S, G + 1))``
    float64: how much longer a request's ``embedding_bags`` takes in thread CPU time when
    this thread slept before it, and where that extra time falls.

    The trace is served in order once per gap of :data:`_COLD_GAPS_MS` (:data:`_COLD_ROUNDS`
    rounds, the gaps' order reversed every other round), sleeping that long before each of
    :data:`_COLD_REQUESTS` requests spread over it; a gap's factor is the median of their CPU
    time over the same request's warm median ``emb_ns``, at the median idle time measured
    (from the end of the previous call to the start of this one); ``draws[:, g]`` are all
    of them, ascending (``S`` = :data:`_COLD_REQUESTS` x :data:`_COLD_ROUNDS` at most). A
    request's slowdown after the same gap varies: for ``sdm-nand`` paced on the Zen 4 VM, after
    10 ms its q10, q50, q90 and max were 1.46, 1.66, 2.20 and 2.40, so the median alone leaves
    the tail of a lightly loaded host short (bench/RESULTS.md). In order, so that each
    timed request meets the cache in the state the warm passes served it in: with misses,
    a request served out of turn hits and misses other rows (served so, the 4 MiB-cache
    case of bench/validate_host.sh measured factors of 0.54-1.03 on the AMD EPYC VM). Gap 0
    has factor 1: ``emb_ns`` was timed back to back.

    Why: on this project's VMs (AMD EPYC, one Numba thread), the bundled trace's requests
    took 692-815 us of CPU back to back, 874-975 after 1 ms idle, 1,152-1,242 after 3 ms and
    1,444-1,557 after 10 ms: an idle core drops its clock and a sleeping thread comes back to
    caches others used. Live load at a low rate serves every request after such a gap.

    The extra time is not spread evenly: it falls early (the first code and data a request
    touches are the coldest). Each cold call records where its reads issue
    (:func:`sdm.tiers.clock.recorded_issues`) against the warm points ``issues``
    (:func:`_issue_points`); ``extra[k]`` is the median share of a call's extra wall time
    spent before a point ``share[k]`` of the way into its warm time, over calls at least
    :data:`_COLD_EXTRA_MIN` slower than warm (ascending, from (0, 0) to (1, 1); empty when
    none was). On the AMD EPYC VM, after 10 ms idle, 43% of the extra time came before the
    first read (14% of the warm time) and 86% before the last (79%).
    """
    picks = set(np.linspace(0, len(bags) - 1, min(_COLD_REQUESTS, len(bags))).astype(np.int64).tolist())
    ratios = {g: [] for g in _COLD_GAPS_MS}
    idle = {g: [] for g in _COLD_GAPS_MS}
    points = []  # (warm share, share of the extra time before it)
    for rnd in range(_COLD_ROUNDS):
        for g in (_COLD_GAPS_MS if rnd % 2 == 0 else _COLD_GAPS_MS[::-1]):
            for i, bag in enumerate(bags):  # in trace order, as the warm passes: the same cache states
                if i not in picks:
                    st.embedding_bags(bag)
                    continue
                warm = max(float(emb_ns[i]), 1.0)
                end = time.perf_counter_ns()
                time.sleep(g / 1e3)
                with recorded_issues() as log:
                    start = time.perf_counter_ns()
                    t0 = time.thread_time_ns()
                    st.embedding_bags(bag)
                    cpu = time.thread_time_ns() - t0
                    wall = time.perf_counter_ns() - start
                ratios[g].append(cpu / warm)
                idle[g].append(start - end)
                extra = wall - warm
                if extra >= _COLD_EXTRA_MIN * warm and [k for k, _ in log] == [k for k, _ in issues[i]]:
                    points += [(share, (at - start - share * warm) / extra)
                               for (_, share), (_, at) in zip(issues[i], log)]
    gap_ns = [0.0] + [float(np.median(idle[g])) for g in _COLD_GAPS_MS]
    factor = [1.0] + [float(np.median(ratios[g])) for g in _COLD_GAPS_MS]
    draws = np.column_stack([np.ones(len(ratios[_COLD_GAPS_MS[0]]))] + [np.sort(ratios[g]) for g in _COLD_GAPS_MS])
    order = np.argsort(gap_ns, kind="stable")  # np.interp needs the gaps ascending
    share, extra = _extra_curve(points)
    return np.asarray(gap_ns)[order], np.asarray(factor)[order], share, extra, draws[:, order]


def _extra_curve(points, bins: int = 10) -> tuple:
    """``(share (K,), extra (K,))``: the medians of ``points`` ``[(share, extra), ...]`` in
    ``bins`` equal bins of share, between (0, 0) and (1, 1), extra clipped to [0, 1] and made
    nondecreasing (time spent before a point is also before every later one); two empty
    arrays when there are no points."""
    if not points:
        return np.zeros(0), np.zeros(0)
    pts = np.asarray(points, dtype=np.float64)
    which = np.minimum((pts[:, 0] * bins).astype(np.int64), bins - 1)
    share, extra = [0.0], [0.0]
    for b in range(bins):
        inside = pts[which == b]
        if inside.size:
            share.append(float(np.median(inside[:, 0])))
            extra.append(float(np.clip(np.median(inside[:, 1]), 0.0, 1.0)))
    share.append(1.0)
    extra.append(1.0)
    share, extra = np.asarray(share), np.maximum.accumulate(np.asarray(extra))
    keep = np.concatenate(([True], np.diff(share) > 0))  # np.interp needs the shares ascending
    return share[keep], extra[keep]


def _issue_points(st, bags) -> list:
    """Per request of ``bags``, ``[(tier kind, share), ...]`` in the order its reads were
    charged: how far into its ``embedding_bags`` call each batch's reads issue, as a share of
    the call's wall time (served back to back in ``modeled`` mode, where wall time is CPU
    time); the median share over :data:`_ISSUE_PASSES` passes.

    A live store reaches a table's reads only after the work before them (validation, the
    tables before it, a cache's probe), so a paced request's reads cannot all start with its
    CPU work: on the AMD EPYC VM the bundled trace's ``dram`` requests had their last
    reads complete 1.42 ms after they started, hot, against a 1.29 ms chain of reads alone,
    and 1.62 ms at 150/s under two process workers, where their CPU work ran about 2x slower
    on cold cores."""
    passes = []
    for _ in range(_ISSUE_PASSES):
        shares = []
        for b in bags:
            with recorded_issues() as log:
                t0 = time.perf_counter_ns()
                st.embedding_bags(b)
                span = max(time.perf_counter_ns() - t0, 1)
            shares.append([(kind, min(max((at - t0) / span, 0.0), 1.0)) for kind, at in log])
        passes.append(shares)
    out = []
    for i, first in enumerate(passes[0]):
        runs = [p[i] for p in passes if [k for k, _ in p[i]] == [k for k, _ in first]]
        median = np.median(np.array([[f for _, f in run] for run in runs]), axis=0) if first else ()
        out.append([(kind, float(f)) for (kind, _), f in zip(first, median)])
    return out


def _batch_after(batch_ptr, batch_scm, issues, emb_ns, scm_kind) -> np.ndarray:
    """``(nb,)`` float64 ns: the embedding task's CPU time each profiled batch issues after,
    from :func:`_issue_points`' shares of each request's ``emb_ns``. The ``k``-th SCM (or
    DRAM) batch of a request takes the ``k``-th SCM (or DRAM) charge's point, or its group's
    last when the store charged fewer (a cache reads a fused request's misses at once)."""
    after = np.zeros(batch_scm.shape[0])
    for r, marks in enumerate(issues):  # a Python loop over requests: profiles are built once
        by_group = {True: [f for k, f in marks if k == scm_kind], False: [f for k, f in marks if k != scm_kind]}
        seen = {True: 0, False: 0}
        for b in range(batch_ptr[r], batch_ptr[r + 1]):
            group = bool(batch_scm[b])
            shares = by_group[group]
            if shares:
                after[b] = emb_ns[r] * shares[min(seen[group], len(shares) - 1)]
            seen[group] += 1
    return after


def _emb_cpu(st, bags, first: list) -> np.ndarray:
    """``(R,)`` float64: each request's ``embedding_bags`` over ``st`` in thread CPU time, the
    median of :func:`_timed_passes` after one warm pass; ``first`` gets the cache's counts
    before and after the first timed pass."""
    for b in bags:
        st.embedding_bags(b)
    first.append(st.stats()["tiers"][0])

    def emb_pass():
        ns = np.empty(len(bags))
        for i, b in enumerate(bags):
            t0 = time.thread_time_ns()
            st.embedding_bags(b)
            ns[i] = time.thread_time_ns() - t0
        if len(first) == 1:
            first.append(st.stats()["tiers"][0])
        return ns

    return np.median(np.stack(_timed_passes(emb_pass)), axis=0)


def _engine_reads(st) -> tuple[int, int, bool]:
    """``(pages read, CPU ns those reads cost, whether a request's own thread reads them)``
    so far by ``st``'s IO engines (zeros without direct IO): kernel AIO reads on the
    requesting thread, reader threads do not."""
    engines = [d["engine"] for d in st.stats()["devices"].values() if "engine" in d]
    return (sum(e["reads"] for e in engines), sum(e["read_cpu_ns"] for e in engines),
            any(e["submission"] == "aio" for e in engines))


def _direct_cpu(st, bags) -> tuple[np.ndarray, float, int]:
    """``(emb_ns (R,), read_cpu_ns, read_threads)`` over a ``direct`` store: each request's
    ``embedding_bags`` in the serving thread's CPU time less its reads', and the CPU time per
    page read that the threads reading them spent (the IO engine's own count: kernel AIO's in
    the request's thread, or the reader threads' including their wake-ups, mostly in the
    kernel), each the median of :func:`_timed_passes` after one warm pass.

    Served one request at a time, back to back. On the AMD EPYC VM (Zen 4), the 4 MiB-cache
    case of bench/validate_host.sh measured, with reader threads, 9-11 ms of the serving
    thread's CPU per request (its modeled store's: 2.2-4 ms; the rest splits pages into jobs,
    hands them over and wakes) and 15-18 us of reader CPU per read, against 12-14 us per read
    in ``sdm devices calibrate``'s bare loop at queue depth 16."""
    for b in bags:
        st.embedding_bags(b)
    own = _engine_reads(st)[2]  # the reads' CPU is the serving thread's: take it out

    def direct_pass():
        ns = np.empty(len(bags))
        reads0, cpu0, _ = _engine_reads(st)
        before = cpu0
        for i, b in enumerate(bags):
            t0 = time.thread_time_ns()
            st.embedding_bags(b)
            ns[i] = time.thread_time_ns() - t0
            if own:  # the engine's count is read outside the timed call
                after = _engine_reads(st)[1]
                ns[i] -= after - before
                before = after
        reads, cpu, _ = _engine_reads(st)
        return ns, (cpu - cpu0) / (reads - reads0) if reads > reads0 else 0.0

    runs = _timed_passes(direct_pass)
    return (np.median(np.stack([r[0] for r in runs]), axis=0), float(np.median([r[1] for r in runs])),
            int(own))


def _mlp_cpu(st, reqs, emb, model, seed, fit_model, *, overlap: bool) -> tuple:
    """``(bottom, top)`` ns of CPU per sample of ``model``'s MLPs (0, 0 without one), from
    its forward passes over the first requests with ``st``'s tables, as a serving worker
    runs them (``overlap``: the lookups on the forward's worker thread beside the bottom
    MLP). A pass's process CPU time less its lookups' (``emb``) is the MLPs'; it is split
    between the bottom MLP and the rest (interaction, top MLP) as their stage times. Taken
    so, the MLPs carry the overlap's own cost (the hand-off to the lookup thread and back;
    on the AMD EPYC VM an overlapped rm2 forward of a bundled-trace request took 1.9-2.1 ms
    of process CPU against 1.5-1.6 ms one stage after another)."""
    if model is None:
        return 0.0, 0.0
    from sdm.host.blas import one_blas_thread

    net = make_model(model, st, seed, fit=fit_model)
    # The simulation runs a request's MLP task on one core: time it on one BLAS thread.
    with one_blas_thread():
        try:
            rng = np.random.default_rng([seed, 17])
            timed = reqs[:_MODEL_SAMPLES]
            inputs = [(rng.random((r.samples, net.num_dense), dtype=np.float32),
                       list(zip(r.indices, r.offsets))) for r in timed]
            lookups = float(np.sum(emb[:len(timed)]))
            # One untimed pass first: the first call of a kernel in a process loads (or, after
            # an edit to sdm, compiles) it, which is no part of a request's cost.
            net.forward_profiled(*inputs[0], embeddings=st, overlap=overlap)

            def mlp_pass():
                cpu0 = time.process_time_ns()
                times = [net.forward_profiled(dense, sparse, embeddings=st, overlap=overlap)[1]
                         for dense, sparse in inputs]
                mlps = max(time.process_time_ns() - cpu0 - lookups, 0.0)
                bottom = sum(t.bottom_s for t in times)
                rest = sum(t.interaction_s + t.top_s for t in times)
                share = bottom / (bottom + rest) if bottom + rest > 0 else 0.5
                return mlps * share, mlps * (1 - share)

            bottom, top = np.median(np.array(_timed_passes(mlp_pass)), axis=0)
            samples = max(sum(r.samples for r in timed), 1)
        finally:
            net.close()
    return float(bottom) / samples, float(top) / samples


def _measure_cpu(tr, store_path, config, request_size, model, seed, fit_model=False, cold=False,
                 served="modeled"):
    """``(emb_ns (R,), live hits or None, bottom ns/sample, top ns/sample, (cold idle ns,
    cold factor, extra share, extra curve, cold draws), issue points, CPU ns per direct read)`` over a live store
    (modeled IO): after a warm pass, each request's ``embedding_bags`` timed in thread CPU
    time in passes over the trace for at least :data:`_TIMED_S` (:func:`_timed_passes`),
    keeping its median (hits counted in the first pass); where its reads issue
    (:func:`_issue_points`); with ``cold``, then how much a core
    idle before a request slows it (:func:`_measure_cold`; else five empty arrays); with a
    model, its MLPs (:func:`_mlp_cpu`).

    ``served="paced"``: the requests' CPU time (``emb_ns``) and the MLPs' are then timed
    again over a paced store, the way a serving worker in that mode spends it: a paced
    request's waits and its slots' ready times cost CPU that a modeled one does not (on the
    AMD EPYC VM, the bundled trace's all-hit requests took 1,140-1,220 us paced against
    910-940 us modeled under ``sdm-nand``, 535-575 against 415-445 under ``dram``), and its
    forward runs the lookups beside the bottom MLP. The issue points and the cold factors
    stay modeled, where wall time is CPU time.

    ``served="direct"``: the requests' CPU time is timed again over a direct store, apart from
    the CPU its reads cost (:func:`_direct_cpu`; 0 otherwise), which comes back as
    ``read_cpu``, ``(ns per read, read threads)``; the MLPs stay modeled (their reads are the
    lookups', already timed).

    The median of passes spread over seconds, not one pass or the least of a few: on this
    project's shared VMs the same requests' CPU time drifts with whatever else the host runs
    (caches and memory bandwidth taken, a busy sibling hyperthread), over phases of about a
    second. One process timing 15 passes of the bundled trace one after another measured
    593-876 us per request (AMD EPYC), and profiles built seconds apart took 575-951 us when
    each was the least of two back-to-back passes. Live load runs through those phases, so the
    median over them is both what it meets and stable from one profile to the next; a single
    pass's spike (one measured 12.1 ms against 7.4) is outvoted.

    The store's kernels run on one thread meanwhile (:func:`_one_kernel_thread`): a large
    table's lookups (``sdm.kernels.pooling.SERIAL_BELOW_LOOKUPS`` or more) are pooled by Numba's
    parallel threads, whose CPU time the calling thread's clock does not see (with 1,024 there,
    the bundled trace's requests measured 453 us of it against 714 us of the process's), and
    the simulation runs each request's task on one core."""
    with Store.open(store_path, config=with_io_mode(config, "modeled")) as st, _one_kernel_thread():
        names = check_store_tables(st, tr.table_sizes)
        reqs = list(iter_requests(tr, request_size))
        bags = [{n: (ix, of) for n, ix, of in zip(names, r.indices, r.offsets)} for r in reqs]
        first = []  # the cache's counts before and after the first timed pass
        emb = _emb_cpu(st, bags, first)
        live = first[1]["hits"] - first[0]["hits"] if first[1].get("kind") == "cache" else None
        issues = _issue_points(st, bags)
        slowed = _measure_cold(st, bags, emb, issues) if cold else (np.zeros(0),) * 4 + (np.zeros((0, 0)),)
        if served != "paced":
            bottom, top = _mlp_cpu(st, reqs, emb, model, seed, fit_model, overlap=False)
    read_cpu = (0.0, 0)
    if served != "modeled":
        with Store.open(store_path, config=with_io_mode(config, served)) as st, _one_kernel_thread():
            if served == "direct":
                emb, *read_cpu = _direct_cpu(st, bags)
            else:
                emb = _emb_cpu(st, bags, [])
                bottom, top = _mlp_cpu(st, reqs, emb, model, seed, fit_model, overlap=True)
    return emb, live, bottom, top, slowed, issues, read_cpu


def build_profile(trace, config="sdm-nand", host="this-machine", *, model: str | None = None,
                  dim: int = DEFAULT_DIM, fmt: str = "fp32", request_size: int | None = None,
                  store=None, seed: int = 0, workdir=None, disk=None, fit_model: bool = False,
                  threads: int | None = None, cpu_slots: int | None = None) -> RequestProfile:
    """Profile every request of ``trace`` (warm: its second pass) under ``config`` on ``host``.

    Args:
        trace: a trace path or an open :class:`sdm.trace.Trace`.
        config: a hierarchy (preset, TOML, :class:`HierarchyConfig`) of the ``dram`` or
            ``cache`` + ``mmap`` shape; its ``io_mode`` picks the SCM device in ``direct``
            mode (the host's ``direct_device``).
        host: a host (:func:`sdm.host.spec.resolve_host`); ``disk`` goes to ``this-machine``.
        model: a DLRM preset (its dim wins over ``dim``): also profile the MLPs. The trace's
            tables must be the preset's unless ``fit_model`` (as :func:`sdm.replay.live.replay`).
        store: an existing store matching the trace's tables; None builds one (``dim``, ``fmt``).
        threads: also measure one process's throughput with 1 to ``threads`` worker threads
            (:func:`sdm.host.threads.measure_threads`), for thread workers; ``this-machine`` only.
        cpu_slots: the store's bound on lookups running CPU work at once while the thread
            curve is measured (None: the cores, 0: no bound).

    Raises:
        ConfigError: an unsupported hierarchy or host. InvalidArgumentError: an empty trace.
    """
    host = resolve_host(host, disk=disk)
    config = resolve_config(config)
    request_size = check_request_size(request_size)
    if cpu_slots is not None:  # before any store is built or timed
        cpu_slots = check_int(cpu_slots, "cpu_slots", lo=0)
    if threads is not None:
        threads = check_int(threads, "workers (threads)", lo=1, hi=256)
        if host.name != THIS_MACHINE:
            raise ConfigError(f"thread workers are measured on this machine (their GIL is one process's), so they "
                              f"need host {THIS_MACHINE!r}, not {host.name!r}; model worker processes instead")
    if model is not None:
        from sdm.model import get_preset

        dim = get_preset(model).dim
    fmt = check_format(fmt)
    rb = row_bytes_of(fmt, int(dim))
    tr = trace if isinstance(trace, Trace) else load(trace)
    try:
        table_bytes = int(np.sum(np.asarray(tr.table_sizes, dtype=np.int64))) * rb
        config = _host_config(config, host, table_bytes)
        cache, scm, _ = _shape(config)
        stream = key_stream(tr, request_size)
        n_keys, R = stream.keys.shape[0], stream.num_requests
        if R == 0:
            raise InvalidArgumentError("the trace has no requests to profile")
        distinct = np.diff(stream.segments[::stream.num_tables])
        if cache is not None:
            rows = (cache.capacity_bytes // rb) if cache.capacity_bytes is not None else cache.capacity_rows
            rows = min(int(rows), table_bytes // rb)  # capped at the tables' rows, as a live cache is
            twice = np.concatenate((stream.keys, stream.keys))
            sim = simulate(twice, policy=cache.policy, capacity=max(1, int(rows)),
                           admission=cache.admission, return_mask=True)
            mask = np.ascontiguousarray(sim.hit_mask[n_keys:])
            ends = np.concatenate(([0], np.cumsum(sim.hit_mask, dtype=np.int64)))
            starts = stream.segments[::stream.num_tables]  # (R + 1,) each request's first key
            per_request = np.concatenate((ends[starts[1:]] - ends[starts[:-1]],
                                          ends[n_keys + starts[1:]] - ends[n_keys + starts[:-1]]))
            hits = per_request[R:]
            settles = hit_rate_settles_after(per_request, np.concatenate((distinct, distinct)))
            cache_bytes = rows * rb
        else:
            mask = np.ones(n_keys, dtype=np.bool_)
            hits = distinct.copy()
            settles, cache_bytes = 0, None
        batches = _batches(stream, mask, config, host, rb)
        with tempfile.TemporaryDirectory(prefix="sdm-host-", dir=workdir) as tmp:
            path = store if store is not None else build_store(os.path.join(tmp, "store"), tr.table_sizes,
                                                               dim=dim, fmt=fmt, seed=seed, progress=False)
            emb, live, bottom, top, cold, issues, read_cpu = _measure_cpu(
                tr, path, config, request_size, model, seed, fit_model, cold=host.name == THIS_MACHINE,
                served=config.io_mode if config.io_mode in ("paced", "direct") else "modeled")
            curve = None if threads is None else measure_threads(path, config, tr, request_size, threads,
                                                                 model=model, seed=seed, fit_model=fit_model,
                                                                 cpu_slots=cpu_slots)
    finally:
        if tr is not trace:
            tr.close()
    speed = host.core_speed
    samples = stream.samples.astype(np.int64)
    after = _batch_after(batches[0], batches[8], issues, emb, scm.kind if scm is not None else None)
    share, extra = cold[2], cold[3]
    if share.size:  # of a cold task's extra time, the part before each batch
        owner = np.repeat(np.arange(emb.shape[0]), np.diff(batches[0]))
        warm = np.maximum(emb[owner], 1.0)
        stretched = warm * np.interp(after / warm, share, extra)
    else:
        stretched = after
    return RequestProfile(
        trace=str(getattr(tr, "path", trace)), config=config.name, host=host, io_mode=config.io_mode,
        model=model, row_bytes=rb, cache_bytes=cache_bytes, samples=samples,
        lookups=stream.lookups.astype(np.int64), distinct=distinct.astype(np.int64), hits=hits.astype(np.int64),
        cpu_emb_ns=emb / speed, cpu_bottom_ns=samples * bottom / speed, cpu_top_ns=samples * top / speed,
        batch_ptr=batches[0], batch_qd=batches[1], sub_ptr=batches[2], sub_dev=batches[3],
        sub_reads=batches[4], settles_after=settles, live_hits=live,
        devices=[d if d.group == "dram" else dataclasses.replace(d, read_cpu_ns=read_cpu[0] / speed,
                                                                 read_threads=read_cpu[1])
                 for d in batches[5]],
        bottom_ns_per_sample=bottom / speed, top_ns_per_sample=top / speed,
        scm_block_ptr=batches[6], scm_block_ids=batches[7], cold_gap_ns=cold[0], cold_factor=cold[1],
        cold_draws=cold[4], batch_after_ns=after / speed, batch_cold_ns=stretched / speed, cold_issue_share=share,
        cold_issue_extra=extra, threads=curve)

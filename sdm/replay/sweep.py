"""Grid runs on the simulator alone (the control plane): policies x cache sizes x devices.

For a two-level hierarchy — a DRAM row cache over one SCM device, the shape of the
``sdm-nand`` and ``sdm-3dxp`` presets — each grid point replays the trace's cache key stream
(:func:`sdm.replay.requests.key_stream`, the same stream the store's cache sees) through
``sdm.simulate`` and turns each request's hits and misses into the device time the store
would charge:

* DRAM: every lookup reads its row from the cache's slots, ``ceil(row_bytes / 64)`` lines
  each, ``cache_queue_depth`` in flight (the store's cache tier charges it so);
* misses: the distinct SCM blocks covering the missed rows, laid out as the store's row
  file lays them (``HEADER_BYTES + id * row_bytes`` per table), at ``queue_depth``;

summed over the request's tables (the store serves tables one after another), so a point's
per-request service times equal a live replay's under the equivalent TOML config. From them
each point gets its modeled QPS at the SLA per device (:mod:`sdm.replay.queueing`). Belady's
policy is always simulated too: the lower bound of every miss-ratio curve.

Points run on a thread pool: the simulator's kernels release the GIL (``nogil=True`` in
:mod:`sdm.kernels.jit`), so ``workers`` points proceed at once.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from sdm.kernels.jit import jit
from sdm.store.config import HIERARCHY_PRESETS
from sdm.devices import get_device
from sdm.errors import InvalidArgumentError
from sdm.progress import progress_bar
from sdm.formats import check_dim, check_format, row_bytes as row_bytes_of
from sdm.policies import POLICIES, simulate
from sdm.policies.cache import check_policy
from sdm.replay.queueing import (DEFAULT_SLA_US, SlaError, check_sla_us, latency_percentiles_us,
                          qps_at_sla, service_ns_array)
from sdm.kernels.serve import TABLE_SHIFT
from sdm.replay.requests import KeyStream, check_request_size, key_stream
from sdm.tiers.rowfile import HEADER_BYTES
from sdm.tiers.metered import MAX_QUEUE_DEPTH
from sdm.trace.format import Trace, load
from sdm.validate import INT64_MAX, check_int

__all__ = ["SweepPoint", "SweepResult", "sweep", "request_service_ns", "DEFAULT_QUEUE_DEPTH",
           "parse_size", "segment_blocks"]

# The presets' queue depths (sdm.store.config): SCM reads and DRAM line reads in flight.
DEFAULT_QUEUE_DEPTH = HIERARCHY_PRESETS["sdm-nand"].tiers[1].queue_depth
DEFAULT_CACHE_QUEUE_DEPTH = HIERARCHY_PRESETS["sdm-nand"].tiers[0].queue_depth
_CACHE_DEVICE = "dram"
_ROW_MASK = (1 << TABLE_SHIFT) - 1
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40}


def parse_size(text) -> int:
    """Bytes from ``"67108864"``, ``"64M"``, ``"64MiB"``, ``"1.5G"`` (binary units)."""
    if isinstance(text, (int, np.integer)) and not isinstance(text, bool):
        value = int(text)
    else:
        s = str(text).strip().lower()
        num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = s[len(num):]
        try:
            value = int(float(num) * _UNITS[unit])
        except (ValueError, KeyError, OverflowError):
            raise InvalidArgumentError(f"size {text!r} is not a byte count like 1048576, 64M or 1GiB") from None
    if value < 1:
        raise InvalidArgumentError(f"size {text!r} must be at least 1 byte")
    if value > INT64_MAX:  # every byte count a kernel holds is an int64
        raise InvalidArgumentError(f"size {text!r} is {value} bytes, more than the largest size, 2**63 - 1")
    return value


@jit
def segment_blocks(keys, hit, segments, row_bytes, header, block_bytes, blocks):
    """Per segment (one table of one request, ids ascending): the distinct ``block_bytes``
    blocks covering the missed rows at ``header + id * row_bytes``, counted into
    ``blocks[segment, block % stripes]`` (``blocks`` ``(segments, stripes)`` int64: a tier's
    blocks striped over ``stripes`` devices by block number; one column for one device)."""
    stripes = blocks.shape[1]
    for s in range(segments.shape[0] - 1):
        for j in range(stripes):
            blocks[s, j] = 0
        reached = -1
        for i in range(segments[s], segments[s + 1]):
            if hit[i]:
                continue
            off = header + (keys[i] & _ROW_MASK) * row_bytes
            first = off // block_bytes
            last = (off + row_bytes - 1) // block_bytes
            if first <= reached:
                first = reached + 1
            for blk in range(first, last + 1):
                blocks[s, blk % stripes] += 1
            if last > reached:
                reached = last


def request_service_ns(stream: KeyStream, hit_mask: np.ndarray, *, row_bytes: int, device,
                       queue_depth: int = DEFAULT_QUEUE_DEPTH,
                       cache_queue_depth: int = DEFAULT_CACHE_QUEUE_DEPTH) -> tuple[np.ndarray, np.ndarray]:
    """Modeled device time of each request of ``stream`` given which keys hit the cache.

    Args:
        stream: the trace's :class:`~sdm.replay.requests.KeyStream`.
        hit_mask: ``(n,)`` bool, per key of ``stream.keys`` (``simulate(..., return_mask=True)``).
        row_bytes: bytes per row.
        device: the SCM device (preset name or :class:`~sdm.devices.DeviceSpec`).
        queue_depth, cache_queue_depth: reads in flight on the SCM device and in DRAM.

    Returns:
        ``(service_ns (R,) int64, device_blocks (R,) int64)``.
    """
    dev = get_device(device)
    dram = get_device(_CACHE_DEVICE)
    nseg = stream.segments.shape[0] - 1
    striped = np.empty((nseg, 1), dtype=np.int64)
    segment_blocks(stream.keys, np.ascontiguousarray(hit_mask, dtype=np.bool_), stream.segments,
                   np.int64(row_bytes), np.int64(HEADER_BYTES), np.int64(dev.access_bytes), striped)
    blocks = striped[:, 0]
    lines = -(-row_bytes // dram.access_bytes)
    per_seg = (service_ns_array(dram, stream.segment_lookups * lines, cache_queue_depth)
               + service_ns_array(dev, blocks, queue_depth))
    shape = (stream.num_requests, stream.num_tables)
    return per_seg.reshape(shape).sum(axis=1), blocks.reshape(shape).sum(axis=1)


@dataclass
class SweepPoint:
    """One grid point: a policy and a cache size, with every device's latency figures.

    ``seconds`` is the control-plane time of the point (simulation and per-request hit and
    block counting); ``model_seconds`` the queueing model's. ``devices`` maps a device name
    to ``{qps_at_sla, latency_us, device_reads, device_bytes, error}``.
    """

    policy: str
    cache_bytes: int
    capacity_rows: int
    hits: int
    misses: int
    seconds: float
    model_seconds: float
    lookups: int
    devices: dict = field(default_factory=dict)

    @property
    def miss_ratio(self) -> float:
        n = self.hits + self.misses
        return self.misses / n if n else 0.0

    @property
    def lookups_per_s(self) -> float:
        return self.lookups / self.seconds if self.seconds > 0 else float("inf")

    @property
    def keys_per_s(self) -> float:
        return (self.hits + self.misses) / self.seconds if self.seconds > 0 else float("inf")

    def to_json(self) -> dict:
        return {"policy": self.policy, "cache_bytes": self.cache_bytes,
                "capacity_rows": self.capacity_rows, "hits": self.hits, "misses": self.misses,
                "miss_ratio": self.miss_ratio, "seconds": self.seconds,
                "model_seconds": self.model_seconds, "lookups_per_s": _finite(self.lookups_per_s),
                "keys_per_s": _finite(self.keys_per_s), "devices": self.devices}


def _finite(x):
    return None if isinstance(x, float) and not math.isfinite(x) else x


@dataclass
class SweepResult:
    """A grid: ``points`` (policy-major, then cache size) and, per policy, its miss-ratio
    curve over ``cache_sizes`` (``curves[policy]`` a list of miss ratios; belady always
    included as the lower bound)."""

    trace: str
    lookups: int
    keys: int
    requests: int
    dim: int
    fmt: str
    row_bytes: int
    sla_us: float
    queue_depth: int
    cache_queue_depth: int
    policies: list
    cache_sizes: list
    devices: list
    points: list
    workers: int
    wall_s: float

    @property
    def curves(self) -> dict:
        out = {}
        for p in self.points:
            out.setdefault(p.policy, [None] * len(self.cache_sizes))
            out[p.policy][self.cache_sizes.index(p.cache_bytes)] = p.miss_ratio
        return out

    def to_json(self) -> dict:
        return {"trace": self.trace, "lookups": self.lookups, "keys": self.keys,
                "requests": self.requests, "dim": self.dim, "fmt": self.fmt,
                "row_bytes": self.row_bytes, "sla_us": self.sla_us, "queue_depth": self.queue_depth,
                "cache_queue_depth": self.cache_queue_depth,
                "policies": self.policies, "cache_sizes": self.cache_sizes, "devices": self.devices,
                "workers": self.workers, "wall_s": self.wall_s, "curves": self.curves,
                "points": [p.to_json() for p in self.points]}


def _run_point(stream: KeyStream, policy: str, cache_bytes: int, rows: int, row_bytes: int,
               devices: list, queue_depth: int, cache_queue_depth: int, sla_us: float) -> SweepPoint:
    t0 = time.perf_counter()
    sim = simulate(stream.keys, policy=policy, capacity=rows, return_mask=True)
    counted = {d: request_service_ns(stream, sim.hit_mask, row_bytes=row_bytes, device=d,
                                     queue_depth=queue_depth, cache_queue_depth=cache_queue_depth)
               for d in devices}
    t1 = time.perf_counter()
    out = {}
    for d, (service, blocks) in counted.items():
        entry = {"latency_us": latency_percentiles_us(service), "device_reads": int(blocks.sum()),
                 "device_bytes": int(blocks.sum()) * get_device(d).access_bytes,
                 "qps_at_sla": None, "error": None}
        try:
            sla = qps_at_sla(service, sla_us)
            entry["qps_at_sla"], entry["error"] = _finite(sla.qps), sla.reason
        except SlaError as exc:
            entry["error"] = str(exc)
        out[d] = entry
    return SweepPoint(policy, cache_bytes, rows, sim.hits, sim.misses, t1 - t0,
                      time.perf_counter() - t1, stream.num_lookups, out)


def _load_kernels(policies, devices, row_bytes, queue_depth, cache_queue_depth) -> None:
    """Run every kernel a point needs once on a toy stream. Numba loads (or compiles) a
    kernel under a process-wide lock, so threads that all meet cold kernels at once run one
    at a time (measured: no speedup on 2 threads without this, 1.8x with it)."""
    one = np.ones(1, dtype=np.int64)
    toy = KeyStream(np.arange(4, dtype=np.int64), np.array([0, 4], dtype=np.int64), 4 * one, 4 * one,
                    one, 1)
    for p in policies:
        sim = simulate(toy.keys, policy=p, capacity=2, return_mask=True)
    for d in devices:
        service, _ = request_service_ns(toy, sim.hit_mask, row_bytes=row_bytes, device=d,
                                        queue_depth=queue_depth, cache_queue_depth=cache_queue_depth)
    qps_at_sla(service + 1, float(service.max() + 1) / 1e3 * 2, min_arrivals=16)


def sweep(trace, *, policies=("lru",), cache_sizes=(64 << 20,), devices=("nand-p4500",),
          dim: int = 64, fmt: str = "fp32", sla_us: float = DEFAULT_SLA_US,
          request_size: int | None = None, queue_depth: int = DEFAULT_QUEUE_DEPTH,
          cache_queue_depth: int = DEFAULT_CACHE_QUEUE_DEPTH,
          workers: int | None = None, progress: bool | None = None) -> SweepResult:
    """Run the grid ``policies x cache_sizes`` on the simulator, each point against every
    device in ``devices``.

    Args:
        trace: a trace path or an open :class:`sdm.trace.Trace`.
        policies: names of ``sdm.POLICIES``; ``belady`` is added when missing.
        cache_sizes: DRAM cache sizes in bytes (ints or strings like ``"64M"``); a cache holds
            ``size // row_bytes`` rows, at most the trace's tables' rows, as the store's cache
            tier does.
        devices: SCM device preset names (``sdm.DEVICES``).
        dim, fmt: the row shape, which fixes ``row_bytes``.
        sla_us: the p99 bound of the QPS model (a device whose zero-load p99 exceeds it
            reports ``qps_at_sla: 0`` and the reason in ``error``).
        request_size: see :mod:`sdm.replay.requests`.
        queue_depth: SCM reads in flight per request and table.
        cache_queue_depth: DRAM line reads in flight (the presets' cache tier value).
        workers: threads running points (default: every core).

    Raises:
        InvalidArgumentError / ConfigError: an unknown policy or device, a bad size or shape.
        TraceNotFoundError, TraceFormatError: the trace.
    """
    for name, value in (("policies", policies), ("cache_sizes", cache_sizes), ("devices", devices)):
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
            raise InvalidArgumentError(f"{name} must be a list, got {value!r}")
    policies = list(dict.fromkeys(str(p).lower() for p in policies))
    if not policies:
        raise InvalidArgumentError(f"give at least one policy of {POLICIES}")
    for p in policies:
        check_policy(p)
    if "belady" not in policies:
        policies.append("belady")
    sizes = list(dict.fromkeys(parse_size(s) for s in cache_sizes))
    if not sizes:
        raise InvalidArgumentError("give at least one cache size")
    devices = list(dict.fromkeys(devices))
    if not devices:
        raise InvalidArgumentError("give at least one device")
    for d in devices:
        get_device(d)
    fmt = check_format(fmt)
    dim = check_dim(dim)
    queue_depth, cache_queue_depth = (check_int(qd, name, lo=1, hi=MAX_QUEUE_DEPTH) for name, qd in
                                      (("queue_depth", queue_depth), ("cache_queue_depth", cache_queue_depth)))
    sla_us = check_sla_us(sla_us)
    request_size = check_request_size(request_size)
    rb = row_bytes_of(fmt, dim)
    for s in sizes:
        if s < rb:
            raise InvalidArgumentError(f"cache size {s} bytes holds no row of {rb} bytes ({fmt}, dim {dim})")
    workers = check_int((os.cpu_count() or 1) if workers is None else workers, "workers", lo=1)
    owned = not isinstance(trace, Trace)
    tr = load(trace) if owned else trace
    try:
        stream = key_stream(tr, request_size)
        path = tr.path
        # a cache never holds more rows than the trace's tables have, as the store's does
        table_rows = int(np.sum(tr.table_sizes, dtype=np.int64))
    finally:
        if owned:
            tr.close()
    grid = [(p, s) for p in policies for s in sizes]
    t0 = time.perf_counter()
    if workers > 1 and len(grid) > 1:
        _load_kernels(policies, devices, rb, queue_depth, cache_queue_depth)
    bar = progress_bar(total=len(grid), unit="point", desc="sweep", show=progress)

    def one(job):
        p, s = job
        point = _run_point(stream, p, s, min(s // rb, table_rows), rb, devices, queue_depth, cache_queue_depth,
                           sla_us)
        bar.update(1)
        return point

    try:
        if workers > 1 and len(grid) > 1:
            with ThreadPoolExecutor(max_workers=min(workers, len(grid))) as pool:
                points = list(pool.map(one, grid))
        else:
            points = [one(j) for j in grid]
    finally:
        bar.close()
    return SweepResult(path, stream.num_lookups, int(stream.keys.shape[0]), stream.num_requests,
                       dim, fmt, rb, sla_us, queue_depth, cache_queue_depth, policies, sizes,
                       devices, points,
                       workers, time.perf_counter() - t0)

"""Trace replay through a live store: what a hierarchy does to hit rates, IO, latency and QPS.

``replay(trace, config)`` serves every request of a trace (:mod:`sdm.replay.requests` defines a
request) with one ``Store.embedding_bags`` call — or one DLRM forward when a model is given —
and records, per request, the modeled device time the call charged (the difference of
``store.modeled_ns()`` around it) and the process CPU time it took. From those it reports
per-tier counters, modeled latency percentiles, the QPS a latency SLA allows
(:mod:`sdm.replay.queueing`), CPU time per request, device utilization and energy.

The store is either built for the trace in a temporary directory (tables ``emb_0 ...`` of
the trace's sizes, deterministic random rows) or an existing one whose tables, in creation
order, cover the trace's ids.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from sdm.progress import progress_bar
from sdm.store.config import HierarchyConfig, resolve_config, with_io_mode
from sdm.devices import DEVICES, DeviceSpec
from sdm.errors import ConfigError, InvalidArgumentError
from sdm.formats import check_dim, check_format
from sdm.replay.queueing import DEFAULT_SLA_US, SlaError, check_sla_us, latency_percentiles_us
from sdm.replay.requests import check_request_size, iter_requests
from sdm.store.build import build_store, check_space, store_bytes, table_names
from sdm.store.store import Store
from sdm.trace.format import Trace, load
from sdm.validate import check_int

__all__ = ["ReplayResult", "replay", "build_store", "dram_hit_rate", "DEFAULT_DIM", "table_names", "COUNTERS",
           "config_devices", "SlaError"]

DEFAULT_DIM = 64
_MAX_CURVE_POINTS = 256
#: Tier counters that accumulate (a replay reports their change over the measured requests);
#: every other field of a tier's stats is reported as it stands at the end.
COUNTERS = ("hits", "misses", "reads", "bytes_read", "useful_bytes", "modeled_ns", "energy_j",
            "wall_ns", "not_admitted", "prefetched", "prefetch_already_cached", "prefetch_skipped",
            "prefetch_used", "prefetch_wasted")


@dataclass
class ReplayResult:
    """What one replay measured.

    Scalars: ``trace``, ``config``, ``io_mode``, ``model`` (preset or None), ``dim``, ``fmt``,
    ``batches``, ``requests``, ``samples``, ``lookups`` (measured requests only),
    ``wall_s`` (serving calls), ``cpu_us_per_request``, ``hit_rate`` (share of row reads
    served from DRAM, :func:`dram_hit_rate`), ``sla`` and ``host``: the QPS at the SLA and the
    host it is for, set by the host model (:func:`sdm.host.replay_on_host`; a replay alone
    serves one request at a time, which says nothing of a host's QPS), else None.

    ``tiers``: per tier (fast to slow, as ``Store.stats()``) its counters over the measured
    requests, ``read_amplification`` recomputed from them, ``utilization`` (busy share of
    the modeled time) and, with an SLA, ``utilization_at_sla`` and
    ``energy_j_per_request_at_sla``.

    Arrays: ``service_ns`` ``(R,)`` int64 modeled device time per request; ``cpu_ns``
    ``(R,)`` int64 process CPU time per request; ``wall_ns`` ``(R,)`` int64 wall-clock time
    of each serving call; ``request_lookups`` ``(R,)`` int64 lookups of each request;
    ``curve`` ``(k, 2)`` float64 rows of
    (requests served, running hit rate).

    ``request_definition``: ``"batch"`` (one request per trace batch), ``"request_ids"``
    (one per request id of an inference trace) or ``"N samples"``.

    ``extra``: further per-run counters (prefetch, placement, model ...), copied into the
    JSON as they are.

    ``pooled``: with a pooled-embedding cache, its counters over the measured requests
    (``bags``, ``hits``, ``served_lookups`` ...), ``bag_share`` (hits / non-empty bags) and
    ``lookup_share`` (served lookups / lookups); None without one.
    """

    trace: str
    config: str
    io_mode: str
    model: str | None
    dim: int
    fmt: str
    request_size: int | None
    batches: int
    requests: int
    samples: int
    lookups: int
    wall_s: float
    tiers: list
    service_ns: np.ndarray
    cpu_ns: np.ndarray
    wall_ns: np.ndarray
    request_lookups: np.ndarray
    curve: np.ndarray
    sla: object = None  # sdm.host.simulate.SlaPoint: .qps, .to_json()
    sla_us: float | None = None
    host: str | None = None
    request_definition: str = "batch"
    extra: dict = field(default_factory=dict)
    pooled: dict | None = None

    @property
    def latency_us(self) -> dict:
        """Modeled per-request latency percentiles ``p50 p95 p99 p999`` (µs, zero load)."""
        return latency_percentiles_us(self.service_ns)

    @property
    def measured_latency_us(self) -> dict:
        """Wall-clock time of each serving call, percentiles as :attr:`latency_us` (µs): what
        the devices really took under ``direct`` and ``paced``, CPU time under ``modeled``."""
        return latency_percentiles_us(self.wall_ns)

    @property
    def cpu_us_per_request(self) -> float:
        return float(self.cpu_ns.mean()) / 1e3 if self.cpu_ns.size else 0.0

    @property
    def lookups_per_s(self) -> float:
        return self.lookups / self.wall_s if self.wall_s > 0 else float("inf")

    @property
    def lookups_per_s_after_first(self) -> float:
        """Replay speed without the first request, which pays the store's per-open setup
        (verifying SCM row files, first touches of the cache slots)."""
        if self.requests < 2:
            return self.lookups_per_s
        rest = float(self.wall_ns[1:].sum()) / 1e9
        return float(self.request_lookups[1:].sum()) / rest if rest > 0 else float("inf")

    @property
    def modeled_s(self) -> float:
        return float(self.service_ns.sum()) / 1e9

    @property
    def hit_rate(self) -> float:
        return dram_hit_rate(self.tiers, self.pooled["served_lookups"] if self.pooled else 0)

    @property
    def qps_at_sla(self) -> float | None:
        return None if self.sla is None else self.sla.qps

    @property
    def energy_j(self) -> float:
        return float(sum(t.get("energy_j", 0.0) for t in self.tiers))

    def set_sla(self, sla, host: str, devices: dict) -> None:
        """Take the host model's QPS at the SLA (``sla.qps``) for ``host``, and per tier the
        busy share and energy per request at that rate: busy time per request x QPS; active
        watts while busy, idle the rest (``devices``: device name -> DeviceSpec)."""
        self.sla, self.host = sla, host
        qps = sla.qps
        if not math.isfinite(qps) or qps <= 0 or not self.requests:
            return
        period_ns = 1e9 / qps
        for t in self.tiers:
            busy = t.get("modeled_ns", 0) / self.requests
            t["utilization_at_sla"] = busy / period_ns
            device = devices.get(t.get("device"))
            if device is not None:
                t["energy_j_per_request_at_sla"] = device.energy_j(busy, max(period_ns, busy))

    def to_json(self) -> dict:
        """A JSON-ready dict (no arrays; infinities as null)."""
        def finite(x):
            return None if isinstance(x, float) and not math.isfinite(x) else x

        return {
            "trace": self.trace, "config": self.config, "io_mode": self.io_mode,
            "model": self.model, "dim": self.dim, "fmt": self.fmt,
            "request_size": self.request_size, "request_definition": self.request_definition,
            "batches": self.batches,
            "requests": self.requests, "samples": self.samples, "lookups": self.lookups,
            "wall_s": self.wall_s, "lookups_per_s": finite(self.lookups_per_s),
            "lookups_per_s_after_first": finite(self.lookups_per_s_after_first),
            "hit_rate": self.hit_rate, "tiers": [dict(t) for t in self.tiers],
            "latency_us": self.latency_us, "measured_latency_us": self.measured_latency_us,
            "modeled_s": self.modeled_s,
            "sla_us": self.sla_us, "qps_at_sla": finite(self.qps_at_sla), "host": self.host,
            "sla": None if self.sla is None else self.sla.to_json(),
            "cpu_us_per_request": self.cpu_us_per_request, "energy_j": self.energy_j,
            "pooled_cache": self.pooled, "extra": self.extra,
        }


def _diff(after: dict, before: dict | None) -> dict:
    out = dict(after)
    if before is not None:
        for k in COUNTERS:
            if k in after and k in before:
                out[k] = after[k] - before[k]
    useful = out.get("useful_bytes", 0)
    if "bytes_read" in out:
        out["read_amplification"] = out["bytes_read"] / useful if useful else 0.0
    return out


def dram_hit_rate(tiers: list, served_whole: int = 0) -> float:
    """Share of the row reads a hierarchy served from DRAM: resident ``dram`` tiers (the
    ``dram`` preset, tables pinned whole) count as hits, then the first cache's hits and
    misses; a backing tier read directly counts as misses. ``served_whole``: lookups of bags
    a pooled-embedding cache served whole, each a row served from DRAM (so a pooled cache,
    which takes hot bags away from the tiers, never lowers the rate)."""
    hits = total = served_whole
    for t in tiers:
        h = t.get("hits", 0)
        if t.get("kind") == "dram":
            hits += h
            total += h
            continue
        total += h
        if t.get("kind") == "cache":
            hits += h
            total += t.get("misses", 0)
        break
    return hits / total if total else 0.0


def config_devices(config: HierarchyConfig) -> dict[str, DeviceSpec]:
    """Device name -> spec: the presets and ``config``'s own devices."""
    found = dict(DEVICES)
    found.update({tc.device.name: tc.device for tc in config.tiers})
    return found


def _open_trace(trace):
    if isinstance(trace, Trace):
        return trace, False
    return load(trace), True


def check_store_tables(store: Store, table_sizes) -> list[str]:
    """Names of ``store``'s tables, matched in order to the trace's; ConfigError unless each
    covers its trace table's ids."""
    specs = list(store.tables.values())
    if len(specs) != len(table_sizes):
        raise ConfigError(f"store {store.path} holds {len(specs)} tables but the trace has "
                          f"{len(table_sizes)}; tables are matched in order")
    for t, (spec, rows) in enumerate(zip(specs, table_sizes)):
        if spec.num_rows < rows:
            raise ConfigError(f"store table {spec.name!r} has {spec.num_rows} rows but trace table {t} "
                              f"has ids up to {int(rows) - 1}")
    return [s.name for s in specs]


def _shape(sizes) -> str:
    sizes = [int(x) for x in sizes]
    shown = ", ".join(f"{x:,}" for x in sizes[:4]) + (", ..." if len(sizes) > 4 else "")
    return f"{len(sizes)} table{'' if len(sizes) == 1 else 's'} ({shown} rows)"


def check_workdir(workdir) -> None:
    """InvalidArgumentError unless ``workdir`` (where temporary stores are built) is None or
    a directory."""
    if workdir is not None and not os.path.isdir(workdir):
        raise InvalidArgumentError(f"workdir {os.fspath(workdir)!r} is not a directory")


def make_model(preset: str, store: Store, seed: int, table_sizes=None, *, fit: bool = False):
    """A seeded DLRM of ``preset``'s MLPs whose embedding tables are ``store``'s (their dim
    must be the preset's).

    ``table_sizes``: the rows the trace's tables need. Unless ``fit``, they must match the
    preset's tables (as many, each within the preset's rows): a model is never silently
    given other tables. With ``fit``, the preset's MLPs are rebuilt over the store's tables."""
    from sdm.model import DLRM, get_preset
    from sdm.model.sparse import SparseArch

    p = get_preset(preset)
    specs = list(store.tables.values())
    dims = sorted({s.dim for s in specs})
    if dims != [p.dim]:
        raise ConfigError(f"model preset {p.name!r} has dim {p.dim} but the store's tables have dim "
                          f"{dims}; build the store with --dim {p.dim}")
    need = [s.num_rows for s in specs] if table_sizes is None else [int(x) for x in table_sizes]
    if not fit and (len(need) != len(p.table_sizes) or any(n > m for n, m in zip(need, p.table_sizes))):
        raise ConfigError(f"model preset {p.name!r} has {_shape(p.table_sizes)} but the trace has "
                          f"{_shape(need)}; pass --fit-model (fit_model=True) to rebuild the preset's "
                          f"MLPs over the trace's tables")
    arch = dataclasses.replace(p, table_sizes=tuple(s.num_rows for s in specs))
    model = DLRM.random(arch, seed=seed, materialize=False)
    model.sparse = SparseArch(table_sizes=arch.table_sizes, dim=p.dim, seed=seed,
                              names=[s.name for s in specs])
    return model


def replay(trace, config="dram", *, store=None, model: str | None = None, dim: int = DEFAULT_DIM,
           fmt: str = "fp32", io_mode: str | None = None, sla_us: float | None = DEFAULT_SLA_US,
           request_size: int | None = None, warmup_batches: int = 0, max_batches: int | None = None,
           seed: int = 0, progress: bool | None = None, workdir=None, warm: bool = True,
           checksum: bool = False, fit_model: bool = False) -> ReplayResult:
    """Replay ``trace`` through a store under hierarchy ``config``.

    Args:
        trace: a trace path or an open :class:`sdm.trace.Trace`.
        config: a hierarchy preset name, a TOML path or a :class:`HierarchyConfig`.
        store: an existing store directory whose tables (in creation order) cover the trace's
            tables; None builds one in a temporary directory (under ``workdir``) with ``dim``
            columns (the model preset's dim when ``model`` is given) in row format ``fmt``.
        model: a DLRM preset name (``sdm.model.PRESETS``): requests run the whole forward
            (bottom MLP, lookups through the store, interaction, top MLP); dense features
            come from the trace, or seeded random ones when it has none of the right width.
            The trace's tables must be the preset's (ConfigError naming both) unless
            ``fit_model``, which rebuilds the preset's MLPs over the trace's tables (the
            result says so: ``extra["model_tables"]``).
        io_mode: override the config's ``modeled`` / ``paced`` / ``direct``.
        sla_us: the p99 latency bound (recorded; the host model finds the QPS within it).
        request_size: samples per request, or None (see :mod:`sdm.replay.requests`).
        warmup_batches: batches served first but left out of every reported number.
        max_batches: stop after this many measured batches.
        progress: show a progress bar with the running hit rate (None: only on a terminal).
        warm: first serve one request through a throwaway open of the store, so one-time
            setup (SCM row files derived from LMDB, kernels loaded from the JIT cache, the
            page cache) is not timed; the measured open starts cold as configured.
        checksum: record in ``extra["checksum"]`` the SHA-256 (hex) of the bytes of every
            pooled ``(B, dim)`` array (tables in store order; with a model, every ``(B,)``
            probability array) of the measured requests, in request order: equal across
            hierarchies serving the same store exactly when their results are bit for bit equal.

    Raises:
        TraceNotFoundError, TraceFormatError: the trace. ConfigError: the config, the model
        preset, or a store whose tables do not match. SlaError: an SLA that is not a number
        > 0. An SLA no rate meets is a result: ``sla.qps`` 0 and ``sla.reason``.
    """
    config = resolve_config(config)
    if io_mode is not None:
        config = with_io_mode(config, io_mode)
    if sla_us is not None:
        sla_us = check_sla_us(sla_us)
    request_size = check_request_size(request_size)
    warmup_batches = check_int(warmup_batches, "warmup_batches", lo=0)
    if max_batches is not None:
        max_batches = check_int(max_batches, "max_batches (None: every batch)", lo=1)
    if seed is not None:
        seed = check_int(seed, "seed", lo=0)
    if model is not None:
        from sdm.model import get_preset

        dim = get_preset(model).dim
    dim, fmt = check_dim(dim), check_format(fmt)
    check_workdir(workdir)
    tr, owned = _open_trace(trace)
    try:
        if warmup_batches >= len(tr):
            raise InvalidArgumentError(f"warmup_batches {warmup_batches} leaves no batch to measure: "
                                       f"the trace has {len(tr)} batches")
        with tempfile.TemporaryDirectory(prefix="sdm-replay-", dir=workdir) as tmp:
            if store is None:
                _check_space(tmp, tr.table_sizes, dim, fmt, config)
                store = build_store(os.path.join(tmp, "store"), tr.table_sizes, dim=dim, fmt=fmt,
                                    seed=seed, progress=progress)
            if warm:
                _warm(tr, store, config, request_size)
            with Store.open(store, config=config) as st:
                return _replay(tr, st, config, model, request_size, warmup_batches, max_batches,
                               sla_us, seed, progress, checksum, fit_model)
    finally:
        if owned:
            tr.close()


def _check_space(directory, table_sizes, dim, fmt, config) -> None:
    """Refuse a store the disk cannot hold: the LMDB copy of every row, and as much again
    for the SCM row files of an ``mmap`` tier."""
    need = store_bytes(table_sizes, dim, fmt) * (2 if any(tc.kind == "mmap" for tc in config.tiers) else 1)
    check_space(directory, need, hint=f"dim {dim}, {fmt}; use a smaller --dim, --fmt int8, "
                                      f"another --workdir, or an existing --store")


def _warm(tr, path, config, request_size) -> None:
    with Store.open(path, config=config) as st:
        names = check_store_tables(st, tr.table_sizes)
        for req in iter_requests((tr[i] for i in range(min(1, len(tr)))), request_size):
            st.embedding_bags({n: (ix, of) for n, ix, of in zip(names, req.indices, req.offsets)})
            return


def _replay(tr, st: Store, config, model_name, request_size, warmup, max_batches, sla_us, seed,
            progress, checksum, fit_model) -> ReplayResult:
    names = check_store_tables(st, tr.table_sizes)
    specs = list(st.tables.values())
    model = (make_model(model_name, st, seed, tr.table_sizes, fit=fit_model)
             if model_name is not None else None)
    last = len(tr) if max_batches is None else min(len(tr), warmup + max_batches)
    total = int(tr.batch_lookups[warmup:last].sum())
    for name in names:  # load resident tables and row files now, not inside the first request
        st.lookup(name, np.empty(0, dtype=np.int64))
    service, cpu, walls, sizes, curve = [], [], [], [], []
    before = pooled_before = None
    lookups = samples = 0
    wall = 0.0
    step = max(1, total // _MAX_CURVE_POINTS)
    next_sample = step
    rng = np.random.default_rng([seed, 7])
    probs = 0.0
    digest = hashlib.sha256() if checksum else None
    bar = progress_bar(total=total, unit="lookup", unit_scale=True, desc=f"replay {config.name}",
                       show=progress)
    try:
        batches = (tr[i] for i in range(last))
        for req in iter_requests(batches, request_size):
            measured = req.batch >= warmup
            if measured and before is None:
                first = st.stats()
                before, pooled_before = first["tiers"], first.get("pooled_cache")
            if model is not None:
                dense = req.dense
                if dense is None or dense.ndim != 2 or dense.shape[1] != model.num_dense:
                    dense = rng.random((req.samples, model.num_dense), dtype=np.float32)
                sparse = list(zip(req.indices, req.offsets))
            else:
                bags = {n: (ix, of) for n, ix, of in zip(names, req.indices, req.offsets)}
            t0 = time.perf_counter()
            c0 = time.process_time_ns()
            m0 = st.modeled_ns()
            if model is not None:
                p = model.forward(dense, sparse, embeddings=st)
            else:
                pooled = st.embedding_bags(bags)
            m1 = st.modeled_ns()
            c1 = time.process_time_ns()
            t1 = time.perf_counter()
            if not measured:
                continue
            if model is not None:
                probs += float(p.sum(dtype=np.float64))
            if digest is not None:
                for out in ([p] if model is not None else [pooled[n] for n in names]):
                    digest.update(np.ascontiguousarray(out).data)
            wall += t1 - t0
            walls.append(int((t1 - t0) * 1e9))
            service.append(m1 - m0)
            cpu.append(c1 - c0)
            n = req.lookups
            sizes.append(n)
            lookups += n
            samples += req.samples
            bar.update(n)
            if lookups >= next_sample:
                next_sample = lookups + step
                now = st.stats()
                rate = dram_hit_rate(_diff_list(now["tiers"], before), _served(now, pooled_before))
                curve.append((len(service), rate))
                bar.set_postfix_str(f"hit rate {rate:.3f}", refresh=False)
    finally:
        bar.close()
        if model is not None:
            model.close()
    stats = st.stats()
    tiers = _diff_list(stats["tiers"], before)
    pooled = _pooled_diff(stats.get("pooled_cache"), pooled_before, lookups)
    if not curve or curve[-1][0] != len(service):
        curve.append((len(service), dram_hit_rate(tiers, _served(stats, pooled_before))))
    service_ns = np.asarray(service, dtype=np.int64)
    result = ReplayResult(
        trace=tr.path, config=config.name, io_mode=config.io_mode, model=model_name,
        dim=specs[0].dim, fmt=specs[0].fmt, request_size=request_size,
        batches=max(0, last - warmup), requests=len(service), samples=samples, lookups=lookups,
        wall_s=wall, tiers=tiers, service_ns=service_ns, cpu_ns=np.asarray(cpu, dtype=np.int64),
        wall_ns=np.asarray(walls, dtype=np.int64), request_lookups=np.asarray(sizes, dtype=np.int64),
        curve=np.asarray(curve, dtype=np.float64).reshape(-1, 2), sla_us=sla_us, pooled=pooled)
    if request_size is not None:
        result.request_definition = f"{request_size} samples"
    elif warmup < last and tr[warmup].request_ids is not None:
        result.request_definition = "request_ids"
    if model is not None:
        result.extra["mean_click_probability"] = probs / samples if samples else 0.0
        if fit_model:
            result.extra["model_tables"] = (f"{model_name}'s MLPs rebuilt over the trace's "
                                            f"{_shape(tr.table_sizes)} (--fit-model)")
    if checksum:
        result.extra["checksum"] = digest.hexdigest()
    modeled = int(service_ns.sum())
    for t in tiers:
        t["utilization"] = t.get("modeled_ns", 0) / modeled if modeled else 0.0
    return result


def _served(stats: dict, pooled_before: dict | None) -> int:
    """Lookups the pooled cache served whole since ``pooled_before`` (0 without one)."""
    now = stats.get("pooled_cache")
    if now is None:
        return 0
    return now["served_lookups"] - (pooled_before["served_lookups"] if pooled_before else 0)


_POOLED_COUNTERS = ("bags", "empty", "cache_hits", "batch_repeats", "hits", "misses", "inserted",
                    "evicted", "served_lookups")


def _pooled_diff(after: dict | None, before: dict | None, lookups: int) -> dict | None:
    """The pooled cache's counters over the measured requests, with the shares it served."""
    if after is None:
        return None
    out = {k: after[k] - (before[k] if before else 0) for k in _POOLED_COUNTERS}
    out.update(bytes_used=after["bytes_used"], capacity_bytes=after["capacity_bytes"],
               entries=after["entries"])
    nonempty = out["bags"] - out["empty"]
    out["bag_share"] = out["hits"] / nonempty if nonempty else 0.0
    out["lookup_share"] = out["served_lookups"] / lookups if lookups else 0.0
    return out


def _diff_list(after: list, before: list | None) -> list:
    if before is None:
        return [_diff(a, None) for a in after]
    by_name = {b["name"]: b for b in before}
    return [_diff(a, by_name.get(a["name"])) for a in after]

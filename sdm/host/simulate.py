"""The host simulation over a request profile: latency against load, QPS at an SLA, the bottleneck.

:class:`HostSimulation` holds a :class:`~sdm.host.profile.RequestProfile` and one seeded
stream of unit-mean exponential gaps; a rate ``lambda`` scales the same gaps by
``1 / lambda`` (common random numbers), so latency grows with the rate and a bisection on it
is well defined. Each run is :func:`sdm.kernels.hostsim.simulate_host` over ``arrivals``
requests cycling the profile in trace order; the first ``warmup`` share of them is left out
of the percentiles (the host starts empty).

The host's :class:`~sdm.host.platform.PlatformNoise` (``this-machine``'s is measured) adds
stalls to each arrival's CPU tasks and wake-ups to its start and its last device wait, drawn
once per simulation from their own seeded stream, so every rate sees the same ones. The
profile's cold-core factors (measured on ``this-machine``) slow a task on a core idle before
it, each arrival drawing its rank among the measured slowdowns once, from its own seeded
stream; with a ``paced`` profile a request's reads start with its embedding task, each batch
once the task's CPU work reaches it (the profile's issue points), as the live paced store
issues them and waits once at the request's end.

With ``threads``, the ``workers`` are threads of one process and the simulation is
:func:`sdm.kernels.threadsim.simulate_threads` over the profile's measured
:class:`~sdm.host.threads.ThreadCurve` instead: the process as one server whose speed
depends on the requests in it (GIL, cores and devices together, as measured), each request's
work its profiled CPU over the mean, a request that finds the process idle slowed by the
cold-core factors (on its CPU share: its profiled CPU over its time alone, 1 / X(1)), and
later by a draw from the curve's measured wake-up lateness when others hold a worker at its
arrival (one draw per arrival, made once from its own seeded stream, the same at every
rate). The platform's stalls and wake-ups are not drawn again (the closed-loop curve has them in its
mean). Its utilization: ``cores`` from the curve's CPU per request, ``workers`` the threads
in service, ``gil`` the rate served over the process's throughput with every thread in
service (the bottleneck ``gil`` when that is the busiest: the threads, not the cores, limit
the rate).

Utilization is busy time over the span of the arrivals: core busy time (stalls and direct
reads' CPU included) over ``cores x span``; with a limited pool of workers, the time requests
held one over ``workers x span``; a device's reads x spacing (the unit-ns its reads held, over
its units: :mod:`sdm.kernels.devqueue`) over the span (1 = saturated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sdm.errors import InvalidArgumentError
from sdm.host.profile import RequestProfile
from sdm.kernels.hostsim import simulate_host
from sdm.kernels.threadsim import simulate_threads
from sdm.replay.queueing import PERCENTILES, SlaError, check_sla_us, percentile_of
from sdm.validate import check_int, check_number

__all__ = ["HostSimulation", "SimPoint", "SlaPoint", "DEFAULT_ARRIVALS", "LATENCY_FLOOR", "BUSY"]

DEFAULT_ARRIVALS = 100_000
LATENCY_FLOOR = "latency floor"
_WARMUP = 0.02
#: Below this utilization of every resource at the QPS at the SLA, no resource limits the
#: rate: the zero-load latency is so close to the SLA that little queueing breaks it.
BUSY = 0.5


@dataclass
class SimPoint:
    """One offered rate: ``latency_us`` (``p50 p95 p99 p999``), ``utilization`` (``cores``,
    then per device group the busiest device's), ``device_utilization`` per device."""

    offered_qps: float
    latency_us: dict
    utilization: dict
    device_utilization: dict
    achieved_qps: float

    def to_json(self) -> dict:
        return {"offered_qps": self.offered_qps, "achieved_qps": self.achieved_qps,
                "latency_us": dict(self.latency_us), "utilization": dict(self.utilization),
                "device_utilization": dict(self.device_utilization)}


@dataclass
class SlaPoint:
    """The QPS at the SLA: the highest rate whose ``percentile`` stays within ``sla_us``, the
    point simulated there, the zero-load latency and the resource that limits the rate."""

    sla_us: float
    percentile: float
    qps: float
    zero_load_us: float
    saturation_qps: float
    bottleneck: str
    point: SimPoint | None

    @property
    def reason(self) -> str:
        """Why the QPS is what it is, in words."""
        if self.bottleneck == LATENCY_FLOOR and self.qps == 0:
            return (f"SLA {self.sla_us:g} us is below the p{self.percentile:g} latency of "
                    f"{self.zero_load_us:,.1f} us per request at zero load; no request rate meets it")
        if self.bottleneck == LATENCY_FLOOR:
            return (f"the p{self.percentile:g} at zero load, {self.zero_load_us:,.1f} us, is "
                    f"{self.zero_load_us / self.sla_us:.0%} of the SLA: a little queueing breaks it while "
                    f"no resource is {BUSY:.0%} busy")
        return f"p{self.percentile:g} reaches the SLA at this rate; the busiest resource is {self.bottleneck}"

    def to_json(self) -> dict:
        return {"sla_us": self.sla_us, "percentile": self.percentile, "qps": self.qps, "reason": self.reason,
                "zero_load_us": self.zero_load_us,
                "saturation_qps": None if not math.isfinite(self.saturation_qps) else self.saturation_qps,
                "bottleneck": self.bottleneck, "point": None if self.point is None else self.point.to_json()}


def _groups(profile: RequestProfile) -> dict:
    """Resource name -> device indices: ``dram bandwidth``, then each SCM tier's devices."""
    out: dict = {}
    for i, d in enumerate(profile.devices):
        out.setdefault("dram bandwidth" if d.group == "dram" else f"{d.group} tier", []).append(i)
    return out


def _platform_draws(profile: RequestProfile, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(n, 3)`` stalls of each arrival's CPU tasks and ``(n, 2)`` wake-ups, ns: the host's
    platform noise, or zeros when it has none."""
    platform = profile.host.platform
    if platform is None:
        return np.zeros((n, 3)), np.zeros((n, 2))
    r = np.arange(n) % profile.requests
    cpu = np.stack([profile.cpu_emb_ns[r], profile.cpu_bottom_ns[r], profile.cpu_top_ns[r]], axis=1)
    return platform.draw(np.random.default_rng([seed, 1]), cpu, 2)


class HostSimulation:
    """Simulations of one host over ``profile``: ``cores`` (default the profile's host's) and
    at most ``workers`` requests in service at once (None: no limit, as a host whose every
    request has a worker process); with ``threads``, the ``workers`` are threads of one
    process, simulated over the profile's thread curve (this module's docstring).

    Raises:
        InvalidArgumentError: ``threads`` without ``workers``, or more workers than the
        profile's thread curve measured (or none).
    """

    def __init__(self, profile: RequestProfile, *, arrivals: int = DEFAULT_ARRIVALS, seed: int = 0,
                 cores: int | None = None, workers: int | None = None, warmup: float = _WARMUP,
                 threads: bool = False):
        self.profile = profile
        self.n = check_int(arrivals, "arrivals (simulated requests)", lo=1, hi=100_000_000)
        self.cores = profile.host.cores if cores is None else check_int(cores, "cores", lo=1)
        self.workers = 0 if workers is None else check_int(workers, "workers", lo=1, hi=1_000_000)
        self.warmup = check_number(warmup, "warmup (share of arrivals left out)", lo=0, hi=1, hi_open=True)
        self.gaps = np.cumsum(np.random.default_rng(seed).standard_exponential(self.n))
        self.gaps -= self.gaps[0]
        self.stall_ns, self.wake_ns = _platform_draws(profile, self.n, seed)
        self.latency_ns = np.empty(self.n)
        self.reads = np.zeros(len(profile.devices), dtype=np.int64)
        self.busy = np.zeros(len(profile.devices) + 2)
        p = profile
        self._args = (np.int64(p.requests), p.cpu_emb_ns, p.cpu_bottom_ns, p.cpu_top_ns, p.batch_ptr,
                      p.batch_qd, p.sub_ptr, p.sub_dev, p.sub_reads,
                      np.array([d.latency_ns for d in p.devices]), np.array([d.spacing_ns for d in p.devices]),
                      np.array([d.read_cpu_ns for d in p.devices]),
                      np.array([d.read_threads for d in p.devices], dtype=np.int64))
        # A paced store's reads run while its request pools (sdm.kernels.hostsim's overlap),
        # each batch once the request's CPU work reaches it.
        after = p.batch_after_ns if p.batch_after_ns is not None else np.zeros(p.batch_qd.shape[0])
        cold = p.batch_cold_ns if p.batch_cold_ns is not None else after
        # A request on a cold core draws a rank among the measured slowdowns (a row of the
        # table: the s-th smallest at every gap), the same for all its tasks; the medians
        # alone left the tail of a lightly loaded host short
        self.cold_table = p.cold_table()
        self.cold_row = np.random.default_rng([seed, 3]).integers(0, self.cold_table.shape[0], self.n)
        self._machine = (np.bool_(p.io_mode == "paced"), after, cold, p.cold_gap_ns, self.cold_table)
        self.groups = _groups(profile)
        self.runs = 0  # simulations run so far
        self.threads = bool(threads)
        if self.threads:
            self._thread_arrays(profile, seed)
        self._load_kernel()

    def _thread_arrays(self, p: RequestProfile, seed: int) -> None:
        curve = p.threads
        if self.workers == 0:
            raise InvalidArgumentError("thread workers need a number of workers (workers=N)")
        if curve is None or curve.workers < self.workers:
            got = "no thread curve" if curve is None else f"a thread curve to {curve.workers} threads"
            raise InvalidArgumentError(f"{self.workers} thread workers need the profile measured with "
                                       f"threads >= {self.workers}; it has {got}")
        self.rate_of_k = curve.rate_of_k(self.workers)
        self.cpu_of_k = curve.cpu_of_k(self.workers)
        cost = p.cpu_emb_ns + p.cpu_bottom_ns + p.cpu_top_ns
        mean = float(cost.mean())
        self.work = cost / mean if mean > 0 else np.ones_like(cost)
        # Of a request served alone, the share the cold factors stretch: its profiled CPU,
        # the serving thread's own work they were measured on. Not its direct reads' CPU,
        # which no cold factor applies to (as in the cores-and-devices simulation), nor the
        # curve's process CPU, which with reader threads is mostly theirs in the kernel
        # (about 80 ms a request against 2.4 ms profiled, the 4 MiB-cache case).
        self.cpu_share = min(1.0, mean * float(self.rate_of_k[1]))
        self.k_busy = np.zeros(self.workers + 1)
        # An arrival's thread waking among others waits for the GIL, as the closed loop
        # measured it: one quantile drawn per arrival, the same at every rate.
        self.late = curve.wake_late_of_k(self.workers)
        self.late_q = np.random.default_rng([seed, 2]).integers(0, self.late.shape[1], self.n)

    def _thread_args(self) -> tuple:
        p = self.profile
        return (self.work, self.rate_of_k, np.int64(self.workers), p.cold_gap_ns, self.cold_table, self.cpu_share,
                self.late)

    def _load_kernel(self) -> None:
        """Compile (or load) the kernel on one toy arrival, so no timed run pays for it."""
        if self.threads:
            simulate_threads(np.zeros(1), *self._thread_args(), self.late_q[:1], self.cold_row[:1], np.empty(1),
                             self.k_busy.copy())
            return
        simulate_host(np.zeros(1), *self._args, np.int64(1), np.int64(0), np.zeros((1, 3)), np.zeros((1, 2)),
                      *self._machine, self.cold_row[:1], np.empty(1), self.reads.copy(), self.busy.copy())

    # -- one rate ----------------------------------------------------------------------

    def run(self, rate_per_s: float) -> np.ndarray:
        """Latency (ns) of every arrival at ``rate_per_s``, warm-up included ``(N,)``."""
        arrivals = self.gaps * (1e9 / rate_per_s)
        self.runs += 1
        self.span_ns = max(float(arrivals[-1]), 1.0)
        if self.threads:
            self.last_ns = simulate_threads(arrivals, *self._thread_args(), self.late_q, self.cold_row,
                                            self.latency_ns, self.k_busy)
            return self.latency_ns
        self.last_ns = simulate_host(arrivals, *self._args, np.int64(self.cores),
                                     np.int64(self.workers), self.stall_ns, self.wake_ns, *self._machine,
                                     self.cold_row, self.latency_ns,
                                     self.reads, self.busy)
        return self.latency_ns

    def measured(self) -> np.ndarray:
        return self.latency_ns[int(self.warmup * self.n):]

    def point(self, rate_per_s: float) -> SimPoint:
        rate = check_number(rate_per_s, "rate (requests/s)", lo=0, lo_open=True)
        self.run(rate)
        measured = self.measured()
        lat = [percentile_of(measured, q) for q in PERCENTILES.values()]  # sdm's one definition
        achieved = self.n / (self.last_ns - 0.0) * 1e9 if self.last_ns > 0 else 0.0
        latency_us = {k: float(v) / 1e3 for k, v in zip(PERCENTILES, lat)}
        if self.threads:
            served = self.k_busy * self.rate_of_k  # requests served with k in service
            util = {"cores": float(served @ self.cpu_of_k) / (self.cores * self.span_ns),
                    "workers": float(self.k_busy @ np.arange(self.workers + 1)) / (self.workers * self.span_ns),
                    "gil": float(served.sum()) / (float(self.rate_of_k[-1]) * self.span_ns)}
            return SimPoint(rate, latency_us, util, {}, achieved)
        util = {"cores": float(self.busy[-2]) / (self.cores * self.span_ns)}
        if self.workers > 0:  # a pool of workers is a resource too (sdm load --workers)
            util["workers"] = float(self.busy[-1]) / (self.workers * self.span_ns)
        per_device = {d.name: float(self.busy[i]) / self.span_ns for i, d in enumerate(self.profile.devices)}
        for name, idx in self.groups.items():
            util[name] = max(float(self.busy[i]) / self.span_ns for i in idx)
        return SimPoint(rate, latency_us, util, per_device, achieved)

    def percentile_ns(self, rate_per_s: float, q: float) -> float:
        self.run(rate_per_s)
        return percentile_of(self.measured(), q)

    # -- capacity and the SLA -----------------------------------------------------------

    def demand_ns(self) -> dict:
        """Resource name -> work per request (ns): core time (its reads' CPU too) / cores, device work per device;
        with threads, ``gil``: the process's time per request with every thread in service,
        as under a queue (fewer in service may serve faster, but a queue fills them all)."""
        if self.threads:
            return {"gil": 1.0 / float(self.rate_of_k[-1])}
        p = self.profile
        out = {"cores": (p.cpu_ns_per_request() + float(self.stall_ns.sum()) / self.n) / self.cores}
        reads = p.reads_per_request()
        for name, idx in self.groups.items():
            out[name] = max(reads[i] * p.devices[i].spacing_ns for i in idx)
        return out

    def saturation_qps(self) -> float:
        """The rate at which the busiest resource is saturated (inf when requests cost nothing)."""
        worst = max(self.demand_ns().values())
        return 1e9 / worst if worst > 0 else math.inf

    def qps_at_sla(self, sla_us, *, percentile: float = 99.0, rtol: float = 1e-3) -> SlaPoint:
        """Bisection for the highest rate whose ``percentile`` latency is within ``sla_us``.

        Raises:
            SlaError: ``sla_us`` not a number > 0.
        """
        sla_us = check_sla_us(sla_us)
        if not 0.0 < float(percentile) < 100.0:
            raise InvalidArgumentError(f"percentile must be in (0, 100), got {percentile!r}")
        sla_ns = sla_us * 1e3
        saturation = self.saturation_qps()
        if not math.isfinite(saturation):
            return SlaPoint(sla_us, percentile, math.inf, 0.0, saturation, "none: requests cost nothing", None)
        # zero load: a rate so low that no two requests overlap
        zero = self.percentile_ns(saturation * 1e-6, percentile)
        if zero > sla_ns:
            return SlaPoint(sla_us, percentile, 0.0, zero / 1e3, saturation, LATENCY_FLOOR, None)
        lo, hi = 0.0, saturation
        while self.percentile_ns(hi, percentile) <= sla_ns:  # a finite run may fit past saturation
            lo, hi = hi, hi * 2.0
            if hi > 1e6 * saturation:
                raise SlaError(f"SLA {sla_us:g} us is met even at {hi:.3g} requests/s; it does not bound the rate")
        while hi - lo > rtol * hi:
            mid = 0.5 * (lo + hi)
            if self.percentile_ns(mid, percentile) <= sla_ns:
                lo = mid
            else:
                hi = mid
        point = self.point(lo) if lo > 0 else None
        return SlaPoint(sla_us, percentile, lo, zero / 1e3, saturation, self.bottleneck(point), point)

    def bottleneck(self, point: SimPoint | None) -> str:
        """The busiest resource at ``point``: ``cores``, ``dram bandwidth``, ``<tier> tier`` or,
        with a limited pool, ``workers`` (each blocked in its request's reads), with threads
        ``gil``; the latency floor when there is no point or no resource is :data:`BUSY` busy."""
        if point is None or max(point.utilization.values()) < BUSY:
            return LATENCY_FLOOR
        return max(point.utilization, key=point.utilization.get)

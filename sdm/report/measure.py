"""The host model behind a report: per-host QPS at the SLA and hit rate of every configuration.

For a scenario with a ``[workload]`` (:class:`~sdm.report.scenario.WorkloadSpec`),
:class:`Measurer` runs :mod:`sdm.host` for each configuration on the host the fleet model
bills for: the workload's host preset with the configuration's DRAM cache
(``dram_fraction`` of the trace's table bytes, as the scenario's cache is of the model's), its
SCM device and a count of them per host. Which count: the one of least fleet power among
:func:`sdm.report.fleet.scm_device_counts` (from what holding the rows needs up to the host's
``ssd_slots``), each run here (:meth:`Measurer.resolve`, through
:func:`sdm.report.fleet.choose_scm_devices`); a sensitivity re-run keeps the count chosen at
the nominal inputs (``scm_devices=``), it does not choose again. Every count of a
configuration shares one request profile: the trace is served (and its CPU costs measured)
once, and :func:`sdm.host.variants.with_scm_devices` stripes the same block reads over each
count of devices. The DRAM-only baseline is run the same way, with every row in DRAM. Each run gives the QPS at
the scenario's SLA, the hit rate it was simulated at, the bottleneck, the utilizations and
(for the nominal inputs) the latency-load curve; :meth:`Measurer.miss_ratio_curve` gives the
workload's warm miss ratio against the cache's share of the rows.

The sensitivity analysis asks for runs with inputs scaled (:data:`HOST_FACTORS`): a cache
size is a new profile (the trace served again with that cache); CPU speed and the SCM
device's latency and IOPS reuse the nominal profile with those costs scaled
(:func:`sdm.host.variants.vary_profile`). Every run is kept in the result cache
(:mod:`sdm.report.cache`) under a digest of its inputs, so a second report reads them back.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from sdm.errors import ConfigError
from sdm.replay.queueing import SlaError
from sdm.report.cache import ResultCache, file_digest
from sdm.report.scenario import ConfigSpec, Scenario, WorkloadSpec

__all__ = ["HostRun", "Measurer", "HOST_FACTORS", "MRC_FRACTIONS"]

#: Inputs of the host model the sensitivity analysis scales (the cache size enters through
#: the scenario's ``dram_fraction``, the others through the profile).
HOST_FACTORS = ("cache_size", "device_latency", "device_iops", "cpu_speed")
#: Cache shares of the trace's rows at which the miss-ratio curve is simulated (plus the
#: scenario's own).
MRC_FRACTIONS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class HostRun:
    """One host-model run for one configuration: ``qps_at_sla`` (requests/s, 0 when no rate
    meets the SLA), ``hit_rate`` (DRAM hits over distinct rows, warm), ``bottleneck`` and
    ``reason`` (:class:`sdm.host.simulate.SlaPoint`), ``zero_load_us`` (the p99 at zero load),
    ``utilization`` at the QPS at the SLA, ``curve`` (``{offered_qps, latency_us}`` per rate;
    empty for sensitivity runs), the host (``host``, ``cores``, ``scm_devices``,
    ``cache_fraction``), ``factors`` (scaled inputs, 1 = nominal), ``seconds`` the run took
    when computed, ``cached`` whether it was read back."""

    config: str
    hierarchy: str
    qps_at_sla: float
    hit_rate: float
    bottleneck: str
    reason: str
    zero_load_us: float
    utilization: dict
    curve: tuple
    host: str
    cores: int
    scm_devices: int
    cache_fraction: float | None
    factors: dict
    seconds: float
    cached: bool = False
    cpu_us_per_request: float | None = None
    requests_profiled: int | None = None

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["curve"] = [dict(p) for p in self.curve]
        return out

    @classmethod
    def from_json(cls, data: dict) -> "HostRun":
        data = dict(data)
        data["curve"] = tuple(data.get("curve") or ())
        data["cached"] = True
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def _measured(c: ConfigSpec, run: HostRun) -> ConfigSpec:
    """``c`` with the per-host QPS, hit rate and bottleneck of ``run``."""
    return dataclasses.replace(c, qps_per_host=run.qps_at_sla, qps_ratio=None, hit_rate=run.hit_rate,
                               qps_source="host-model", bottleneck=run.bottleneck)


def _saturation(profile, sla_us: float, w: WorkloadSpec, curve: bool) -> tuple:
    """The run's figures when the SLA bounds no rate (:class:`sdm.replay.queueing.SlaError`):
    a run of ``w.arrivals`` requests drains within the SLA however fast they arrive (a small
    host's short run), so the bisection finds no edge. A steady rate cannot pass the busiest
    resource's saturation rate, so that rate is the per-host QPS, named as such in the reason."""
    from sdm.host.predict import CURVE_FRACTIONS
    from sdm.host.simulate import HostSimulation

    sim = HostSimulation(profile, arrivals=w.arrivals, seed=w.seed)
    sat = sim.saturation_qps()
    demand = sim.demand_ns()
    busiest = max(demand, key=demand.get)
    zero_us = sim.percentile_ns(sat * 1e-6, 99.0) / 1e3
    point = sim.point(sat)
    reason = (f"the p99 stays within the SLA of {sla_us:g} us at any rate over {w.arrivals} simulated "
              f"requests; the QPS is the saturation rate of the busiest resource, {busiest}")
    points = [sim.point(f * sat) for f in CURVE_FRACTIONS] if curve else []
    return sat, busiest, reason, zero_us, dict(point.utilization), points


def _finite(x) -> float:
    x = float(x)
    return x if math.isfinite(x) else 0.0


class Measurer:
    """Runs the host model for scenarios' configurations, through ``cache``.

    ``progress``: an object with ``update(n)`` (a :func:`sdm.progress.progress_bar`) advanced
    once per run asked for, cached or not. Holds temporary stores until :meth:`close` (also
    a context manager)."""

    def __init__(self, cache: ResultCache | None = None, *, progress=None, workdir=None):
        self.cache = cache if cache is not None else ResultCache(enabled=False)
        self.progress = progress
        self._tmp = tempfile.TemporaryDirectory(prefix="sdm-report-", dir=workdir)
        self._stores: dict = {}
        self._profiles: dict = {}
        self._traces: dict = {}
        self._memo: dict = {}
        self.computed = 0
        self.seconds = 0.0

    def close(self) -> None:
        self._profiles.clear()
        self._tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- inputs ----------------------------------------------------------------------------

    def trace(self, w: WorkloadSpec) -> str:
        """The workload's trace file: its own, or the generator's output (cached by its
        parameters, so every report reuses one file)."""
        if w.trace is not None:
            return w.trace
        params = {"profile": w.profile, "seed": w.seed, "scale": dict(w.scale)}
        key = self.cache.key("trace", params)
        if key in self._traces:
            return self._traces[key]
        from sdm.trace.generate import generate_to

        path = (self.cache.file("traces", key, "npz") if self.cache.enabled
                else os.path.join(self._tmp.name, f"trace-{key[:16]}.npz"))
        if not os.path.isfile(path):
            tmp = f"{path}.tmp-{os.getpid()}.npz"
            generate_to(tmp, w.profile, seed=w.seed, **{k: (str(v) if k == "table_size" else v)
                                                        for k, v in w.scale})
            os.replace(tmp, path)
        self._traces[key] = str(path)
        return str(path)

    def _host(self, s: Scenario, c: ConfigSpec, scm_devices: int):
        """The host the fleet bills for: the workload's, with ``c``'s cache and SCM devices."""
        from sdm.devices import get_device
        from sdm.host.spec import ScmSlot, resolve_host

        base = resolve_host(s.workload.host)
        if c.is_baseline:
            return dataclasses.replace(base, dram_cache_fraction=None, dram_cache_bytes=None, scm=())
        return dataclasses.replace(base, dram_cache_fraction=c.dram_fraction, dram_cache_bytes=None,
                                   scm=(ScmSlot(get_device(c.device), max(1, scm_devices)),))

    def _config(self, c: ConfigSpec):
        from sdm.store.config import resolve_config

        return resolve_config(c.hierarchy_name)

    def _store(self, trace: str, w: WorkloadSpec, fmt: str, table_sizes) -> str:
        key = (file_digest(trace), w.dim, fmt)
        if key not in self._stores:
            from sdm.replay.live import build_store

            path = os.path.join(self._tmp.name, f"store-{len(self._stores)}")
            build_store(path, table_sizes, dim=w.dim, fmt=fmt, seed=w.seed, progress=False)
            self._stores[key] = path
        return self._stores[key]

    def _inputs(self, s: Scenario, c: ConfigSpec, scm_devices: int) -> dict:
        w = s.workload
        trace = self.trace(w)
        host = self._host(s, c, scm_devices)
        return {"trace_sha256": file_digest(trace), "request_size": w.request_size, "model": w.model,
                "dim": w.dim, "fmt": s.model.fmt, "seed": w.seed,
                "hierarchy": dataclasses.asdict(self._config(c)), "host": host.to_json()}

    # -- runs ------------------------------------------------------------------------------

    def run(self, s: Scenario, c: ConfigSpec, *, scm_devices: int, factors: dict | None = None,
            curve: bool = False) -> HostRun:
        """The host model for configuration ``c`` of ``s`` (which must have a workload) on a
        host with ``scm_devices`` SCM devices, with ``factors`` (:data:`HOST_FACTORS` but
        ``cache_size``, which the caller applies to ``c.dram_fraction``) scaling its inputs."""
        if s.workload is None:
            raise ConfigError(f"scenario {s.name!r} has no [workload]: nothing for the host model to serve")
        factors = {k: float(v) for k, v in (factors or {}).items() if k != "cache_size" and float(v) != 1.0}
        if c.is_baseline:  # no SCM device to scale
            factors.pop("device_latency", None)
            factors.pop("device_iops", None)
        inputs = self._inputs(s, c, scm_devices)
        key = self.cache.key("host-run", {**inputs, "sla_us": s.traffic.sla_p99_us,
                                          "arrivals": s.workload.arrivals, "factors": factors, "curve": curve})
        if self.progress is not None:
            self.progress.update(1)
        if key in self._memo:
            return dataclasses.replace(self._memo[key], config=c.name)
        got = self.cache.get("host-run", key)
        if got is not None:
            run = HostRun.from_json(got)
        else:
            run = self._compute(s, c, scm_devices, factors, curve, inputs)
            self.cache.put("host-run", key, run.to_json())
        self._memo[key] = run
        return dataclasses.replace(run, config=c.name)

    def _profile(self, s: Scenario, c: ConfigSpec, scm_devices: int, inputs: dict):
        """The request profile of ``c`` on a host of ``scm_devices`` SCM devices: one profile
        per configuration and cache (built for the first count asked), striped again for
        every other count."""
        from sdm.host.profile import build_profile
        from sdm.host.variants import with_scm_devices
        from sdm.trace.format import load

        # the count of devices is no input of the profile's trace pass or CPU costs
        key = self.cache.key("profile", self._inputs(s, c, 1))
        if key not in self._profiles:
            w = s.workload
            trace = self.trace(w)
            with load(trace) as tr:
                store = self._store(trace, w, s.model.fmt, tr.table_sizes)
                self._profiles[key] = build_profile(
                    tr, self._config(c), self._host(s, c, scm_devices), model=w.model, dim=w.dim,
                    fmt=s.model.fmt, request_size=w.request_size, store=store, seed=w.seed,
                    workdir=self._tmp.name, fit_model=True)
            while len(self._profiles) > 8:  # a profile holds arrays per request; keep the recent
                self._profiles.pop(next(iter(self._profiles)))
        profile = self._profiles[key]
        return profile if c.is_baseline else with_scm_devices(profile, max(1, scm_devices))

    def _compute(self, s, c, scm_devices, factors, curve, inputs) -> HostRun:
        from sdm.host.predict import predict
        from sdm.host.variants import vary_profile

        start = time.perf_counter()
        profile = self._profile(s, c, scm_devices, inputs)
        if factors:
            profile = vary_profile(profile, None if c.is_baseline else c.device,
                                   core_speed=factors.get("cpu_speed", 1.0),
                                   scm_latency=factors.get("device_latency", 1.0),
                                   scm_iops=factors.get("device_iops", 1.0))
        w = s.workload
        try:
            found = predict(None, profile=profile, sla_us=s.traffic.sla_p99_us, arrivals=w.arrivals, seed=w.seed,
                            rates=None if curve else [])
            got = (found.qps_at_sla, found.bottleneck, found.sla.reason, found.sla.zero_load_us,
                   dict(found.utilization), found.curve)
        except SlaError:  # the SLA was validated when the scenario loaded: it bounds no rate here
            got = _saturation(profile, s.traffic.sla_p99_us, w, curve)
        qps, bottleneck, reason, zero_us, utilization, curve_points = got
        seconds = time.perf_counter() - start
        self.computed += 1
        self.seconds += seconds
        points = tuple({"offered_qps": p.offered_qps, "latency_us": dict(p.latency_us)} for p in curve_points)
        host = profile.host
        return HostRun(
            config=c.name, hierarchy=c.hierarchy_name, qps_at_sla=_finite(qps),
            hit_rate=float(profile.hit_rate), bottleneck=bottleneck, reason=reason,
            zero_load_us=float(zero_us), utilization=utilization, curve=points,
            host=host.name, cores=host.cores, scm_devices=0 if c.is_baseline else max(1, scm_devices),
            cache_fraction=None if c.is_baseline else c.dram_fraction, factors=dict(factors), seconds=seconds,
            cpu_us_per_request=profile.cpu_ns_per_request() / 1e3, requests_profiled=profile.requests)

    # -- the workload's miss-ratio curve -----------------------------------------------------

    def miss_ratio_curve(self, s: Scenario, c: ConfigSpec) -> dict:
        """``{"fractions", "miss_ratios", "policy", "chosen"}``: the warm miss ratio (the second
        of two passes, as the host model profiles) of ``c``'s cache policy on the workload's
        key stream, at :data:`MRC_FRACTIONS` of the trace's rows and at ``c.dram_fraction``."""
        from sdm.host.profile import _shape
        from sdm.formats import row_bytes
        from sdm.policies import simulate
        from sdm.replay.requests import key_stream
        from sdm.trace.format import load

        w = s.workload
        trace = self.trace(w)
        cache_tier, _, _ = _shape(self._config(c))
        if cache_tier is None:
            raise ConfigError(f"configuration {c.name!r} has no DRAM cache: it has no miss-ratio curve")
        fractions = sorted(set(MRC_FRACTIONS) | {float(c.dram_fraction)})
        inputs = {"trace_sha256": file_digest(trace), "request_size": w.request_size, "policy": cache_tier.policy,
                  "admission": str(cache_tier.admission), "fractions": fractions, "dim": w.dim, "fmt": s.model.fmt}
        key = self.cache.key("mrc", inputs)
        got = self.cache.get("mrc", key)
        if got is None:
            rb = row_bytes(s.model.fmt, w.dim)
            with load(trace) as tr:
                stream = key_stream(tr, w.request_size)
                rows = int(np.sum(np.asarray(tr.table_sizes, dtype=np.int64)))
            n = stream.keys.shape[0]
            twice = np.concatenate((stream.keys, stream.keys))
            ratios = []
            for f in fractions:
                # the profile's rounding: the cache's bytes, in whole rows, capped at the tables'
                cap = min(max(1, int(f * rows * rb)) // rb, rows)
                sim = simulate(twice, policy=cache_tier.policy, capacity=max(1, cap),
                               admission=cache_tier.admission, return_mask=True)
                ratios.append(1.0 - float(np.count_nonzero(sim.hit_mask[n:])) / n if n else 0.0)
            got = {"fractions": fractions, "miss_ratios": ratios, "policy": cache_tier.policy}
            self.cache.put("mrc", key, got)
        return {**got, "chosen": float(c.dram_fraction)}

    # -- a scenario's configurations ---------------------------------------------------------

    def resolve(self, s: Scenario, factors: dict | None = None, *, curve: bool = False,
                scm_devices: dict | None = None):
        """``(scenario, runs)``: ``s`` with every configuration's per-host QPS and hit rate
        set, and ``{config name: HostRun}`` for those the host model measured (an SCM
        configuration's at its chosen count). A configuration with a typed QPS keeps it
        (``qps_source = "override"``); without a workload every configuration is one.

        SCM devices per host of each measured SCM configuration: ``scm_devices[name]`` when
        given (clamped into what its rows need and the host's slots; the sensitivity passes
        the nominal choice), else chosen by :func:`sdm.report.fleet.choose_scm_devices`, one
        host-model run per count tried (``scm_devices`` and ``scm_devices_choice`` of the
        configuration say which and why)."""
        from sdm.report.fleet import choose_scm_devices, layout

        runs: dict = {}
        configs = []
        sources = dict(s.sources)
        for c in s.configs:
            if c.measured_by is not None:  # a replay's host-model figures, kept as they are
                configs.append(c)
                continue
            if s.workload is None or c.has_override:
                configs.append(dataclasses.replace(c, qps_source="override"))
                continue
            _, need, infeasible = layout(s, c)
            tried: dict = {}

            def measure(d, c=c, tried=tried):
                tried[d] = self.run(s, c, scm_devices=d, factors=factors, curve=curve)
                return _measured(c, tried[d])

            if c.is_baseline or infeasible is not None:
                chosen = measure(need)
            elif scm_devices is not None and c.name in scm_devices:
                d = min(max(int(scm_devices[c.name]), need), max(need, s.host.ssd_slots))
                chosen = dataclasses.replace(measure(d), scm_devices=d, scm_devices_choice={
                    "chosen": d, "capacity_need": need, "ssd_slots": s.host.ssd_slots, "candidates": [],
                    "reason": f"{d} x {c.device}: kept from the choice at the nominal inputs (not chosen "
                              f"again for these)"})
            else:
                chosen = choose_scm_devices(s, c, measure)
            run = tried[need if chosen.scm_devices is None else chosen.scm_devices]
            runs[c.name] = run
            where = (f"sdm.host: {s.workload.describe()}, {c.hierarchy_name}"
                     + ("" if c.is_baseline else f" with {c.device} x {run.scm_devices} and a DRAM cache of "
                                                 f"{c.dram_fraction:g} of the rows"))
            sources[f"configs.{c.name}.qps_per_host"] = f"host model ({where}): QPS at the p99 SLA"
            sources[f"configs.{c.name}.hit_rate"] = f"host model ({where}): warm DRAM hits / distinct rows"
            configs.append(chosen)
        return dataclasses.replace(s, configs=tuple(configs), sources=tuple(sorted(sources.items()))), runs

"""``predict``: the QPS one host sustains within a latency SLA, from a trace and a hierarchy.

It profiles the trace's requests warm on this machine (:mod:`sdm.host.profile`), simulates
the host serving them as open-loop Poisson traffic (:mod:`sdm.host.simulate`), finds the QPS
at the SLA by bisection and traces the latency-load curve around it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from sdm.errors import InvalidArgumentError
from sdm.host.profile import RequestProfile, build_profile
from sdm.host.simulate import DEFAULT_ARRIVALS, HostSimulation, SimPoint, SlaPoint
from sdm.replay.live import DEFAULT_DIM
from sdm.replay.queueing import DEFAULT_SLA_US
from sdm.validate import check_number

__all__ = ["HostResult", "predict", "CURVE_FRACTIONS"]

#: Offered loads of the default curve, as fractions of the QPS at the SLA.
CURVE_FRACTIONS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25)


@dataclass
class HostResult:
    """What :func:`predict` found: the profile, the SLA point, the curve (one
    :class:`~sdm.host.simulate.SimPoint` per offered rate, ascending), the simulated
    ``arrivals`` per rate, ``workers`` (None: no limit), whether they are ``threads`` of one
    process (else processes) and the simulation's own cost:
    ``seconds`` and ``device_reads`` simulated during the QPS search."""

    profile: RequestProfile
    sla: SlaPoint
    curve: list
    arrivals: int
    workers: int | None
    seconds: float
    device_reads: int
    threads: bool = False

    @property
    def qps_at_sla(self) -> float:
        return self.sla.qps

    @property
    def bottleneck(self) -> str:
        return self.sla.bottleneck

    @property
    def utilization(self) -> dict:
        """At the QPS at the SLA (empty when no rate meets it)."""
        return {} if self.sla.point is None else dict(self.sla.point.utilization)

    def to_json(self) -> dict:
        p = self.profile
        return {"trace": p.trace, "config": p.config, "io_mode": p.io_mode, "model": p.model,
                "host": p.host.to_json(), "sla_us": self.sla.sla_us, "percentile": self.sla.percentile,
                "qps_at_sla": self.qps_at_sla if math.isfinite(self.qps_at_sla) else None,
                "bottleneck": self.bottleneck, "utilization": self.utilization,
                "device_utilization": {} if self.sla.point is None else self.sla.point.device_utilization,
                "hit_rate": p.hit_rate, "zero_load_us": self.sla.zero_load_us,
                "saturation_qps": self.sla.to_json()["saturation_qps"], "workers": self.workers,
                "worker_kind": None if self.workers is None else ("threads" if self.threads else "processes"),
                "arrivals": self.arrivals, "simulation_seconds": self.seconds,
                "simulated_device_reads_per_s": self.device_reads / self.seconds if self.seconds > 0 else None,
                "profile": p.summary(), "curve": [c.to_json() for c in self.curve]}


def predict(trace, config="sdm-nand", host="this-machine", *, model: str | None = None,
            sla_us: float = DEFAULT_SLA_US, percentile: float = 99.0, rates=None, workers: int | None = None,
            arrivals: int = DEFAULT_ARRIVALS, seed: int = 0, dim: int = DEFAULT_DIM, fmt: str = "fp32",
            request_size: int | None = None, store=None, workdir=None, disk=None,
            fit_model: bool = False, profile: RequestProfile | None = None, threads: bool = False,
            cpu_slots: int | None = None) -> HostResult:
    """The QPS ``host`` sustains serving ``trace`` under ``config`` within ``sla_us`` at
    ``percentile``, and its latency-load curve.

    Args:
        trace, config, host, model, dim, fmt, request_size, store, workdir, disk, fit_model: as
            :func:`sdm.host.profile.build_profile` (ignored when ``profile`` is given).
        rates: offered rates (requests/s) of the curve; default :data:`CURVE_FRACTIONS` of
            the QPS at the SLA (of the saturation rate when no rate meets the SLA).
        workers: at most this many requests in service at once, as ``sdm load --workers``
            (None: no limit): worker processes, or with ``threads`` threads of one process
            (``this-machine`` only; the profile then measures the process's thread curve,
            :mod:`sdm.host.threads`).
        arrivals: simulated requests per rate (the profile cycled in trace order).
        cpu_slots: with ``threads``, the store's bound the thread curve is measured under
            (:meth:`sdm.Store.open`; None: the cores, 0: no bound).

    Raises:
        SlaError: an SLA that is not a number > 0. ConfigError, InvalidArgumentError: as
        :func:`~sdm.host.profile.build_profile`, and ``threads`` without ``workers``.
    """
    if threads and workers is None:
        raise InvalidArgumentError("thread workers need a number of workers (workers=N)")
    if cpu_slots is not None and not threads:
        raise InvalidArgumentError("cpu_slots bounds thread workers; it needs threads=True and workers=N")
    if profile is None:
        profile = build_profile(trace, config, host, model=model, dim=dim, fmt=fmt, request_size=request_size,
                                store=store, seed=seed, workdir=workdir, disk=disk, fit_model=fit_model,
                                threads=workers if threads else None, cpu_slots=cpu_slots)
    sim = HostSimulation(profile, arrivals=arrivals, seed=seed, workers=workers, threads=threads)
    start = time.perf_counter()
    sla = sim.qps_at_sla(sla_us, percentile=percentile)
    seconds = time.perf_counter() - start
    reads = int(sim.runs * sim.n * profile.reads_per_request().sum())
    if rates is None:
        base = sla.qps if sla.qps > 0 else sla.saturation_qps
        rates = [f * base for f in CURVE_FRACTIONS] if math.isfinite(base) else []
    rates = sorted(check_number(r, "rate (requests/s)", lo=0, lo_open=True) for r in rates)
    curve: list[SimPoint] = [sim.point(r) for r in rates]
    return HostResult(profile, sla, curve, sim.n, workers, seconds, reads, bool(threads))

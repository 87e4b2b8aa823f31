"""Sensitivity of the savings to the uncertain inputs: each varied by +-p% (the scenario's
``[sensitivity] percent``, default 20%), one at a time, then all together.

The inputs:

* ``cache_size`` — the DRAM cache of every SCM configuration (its ``dram_fraction``): the
  host model serves the workload again with that cache (new hit rate, new QPS) and the fleet
  holds that much DRAM;
* ``device_latency``, ``device_iops`` — the SCM device's read latency and random-read IOPS,
  through the host model;
* ``cpu_speed`` — the host's core speed (every configuration's, the baseline's too),
  through the host model;
* ``dram_w_per_gb`` — DRAM watts per GB (fleet model);
* ``base_watts`` — the host's power without DRAM and SCM (fleet model);
* ``device_watts`` — watts of every SCM device (fleet model).

Nothing here models how an input moves the per-host QPS: the four host-model inputs re-run
:mod:`sdm.host` (through a ``resolve`` function, :meth:`sdm.report.measure.Measurer.resolve`),
and the fleet model takes the QPS and hit rate that run gives. A configuration whose QPS is a
typed override does not move with them. The low and high ends are the savings at
``input x (1 - p)`` and ``input x (1 + p)``; ``corners`` gives, per configuration, the savings
with every input at its unfavourable end and at its favourable end (found from the
one-at-a-time ends), beside the nominal.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sdm.report.fleet import evaluate
from sdm.report.scenario import Scenario

__all__ = ["INPUTS", "HOST_INPUTS", "SensitivityRow", "Sensitivity", "sensitivity", "vary"]

#: Input key -> label, in the order the report lists them.
INPUTS = {
    "cache_size": "DRAM cache size (host model)",
    "device_latency": "SCM read latency (host model)",
    "device_iops": "SCM IOPS (host model)",
    "cpu_speed": "CPU speed (host model)",
    "dram_w_per_gb": "DRAM W/GB",
    "base_watts": "host base watts",
    "device_watts": "SCM device watts",
}
#: The inputs the host model is re-run for.
HOST_INPUTS = ("cache_size", "device_latency", "device_iops", "cpu_speed")


def vary(scenario: Scenario, factors: dict[str, float]) -> Scenario:
    """``scenario`` with the fleet inputs of ``factors`` (keys of :data:`INPUTS`) multiplied by
    their factors, and every SCM configuration's ``dram_fraction`` by ``cache_size``'s (capped
    at 1). The other host-model inputs are left to the ``resolve`` step."""
    s = scenario
    host = s.host
    if "dram_w_per_gb" in factors:
        host = dataclasses.replace(host, dram_w_per_gb=host.dram_w_per_gb * factors["dram_w_per_gb"])
    if "base_watts" in factors:
        host = dataclasses.replace(host, base_watts=host.base_watts * factors["base_watts"])
    devices = s.devices
    if "device_watts" in factors:
        devices = tuple(dataclasses.replace(d, watts=d.watts * factors["device_watts"]) for d in devices)
    configs = s.configs
    if factors.get("cache_size", 1.0) != 1.0 and s.workload is not None:  # typed figures: not re-measured
        configs = tuple(c if c.is_baseline or c.measured_by is not None or c.has_override else
                        dataclasses.replace(c, dram_fraction=min(1.0, c.dram_fraction * factors["cache_size"]))
                        for c in configs)
    return dataclasses.replace(s, host=host, devices=devices, configs=configs)


def _typed(scenario: Scenario, factors: dict) -> Scenario:
    """The ``resolve`` of a scenario whose QPS are all typed: nothing to re-run."""
    return scenario


@dataclass(frozen=True)
class SensitivityRow:
    """Savings of ``config`` (fractions) with ``input`` at ``x (1 - p)`` (``low``) and
    ``x (1 + p)`` (``high``); None where the configuration cannot serve. ``qps_low`` /
    ``qps_high`` and ``hit_low`` / ``hit_high``: its per-host QPS and hit rate there."""

    config: str
    input: str
    label: str
    low: float | None
    high: float | None
    qps_low: float | None = None
    qps_high: float | None = None
    hit_low: float | None = None
    hit_high: float | None = None


@dataclass(frozen=True)
class Sensitivity:
    """``rows``: one per (SCM config, input). ``nominal``: savings per config. ``corners``:
    per config the (min, max) savings over the nominal and every input at once at its
    unfavourable, then its favourable end. ``largest``: per config the input whose +-p moves
    the savings most, with the spread (high minus low savings, in points)."""

    percent: float
    nominal: dict
    rows: tuple[SensitivityRow, ...]
    corners: dict
    largest: dict

    def to_json(self) -> dict:
        return {"percent": self.percent, "nominal": self.nominal,
                "rows": [dataclasses.asdict(r) for r in self.rows],
                "corners": {k: list(v) for k, v in self.corners.items()}, "largest": self.largest}


def _evaluate(s: Scenario, factors: dict, resolve) -> dict:
    host = {k: v for k, v in factors.items() if k in HOST_INPUTS and k != "cache_size"}
    resolved = resolve(vary(s, factors), host)
    return {r.name: r for r in evaluate(resolved).configs}


def sensitivity(scenario: Scenario, resolve=_typed, percent: float | None = None) -> Sensitivity:
    """Vary every input of :data:`INPUTS` by ``+-percent`` (default: the scenario's).

    ``resolve(scenario, host_factors) -> scenario``: sets every configuration's per-host QPS
    and hit rate for a scenario (its cache already scaled) and the host-model factors
    ``{device_latency, device_iops, cpu_speed}`` (default: the scenario's typed figures)."""
    p = (scenario.sensitivity_percent if percent is None else percent) / 100.0
    names = [c.name for c in scenario.configs if not c.is_baseline]
    nominal = {n: r.savings_vs_dram for n, r in _evaluate(scenario, {}, resolve).items() if n in names}
    ends = {key: (_evaluate(scenario, {key: 1.0 - p}, resolve), _evaluate(scenario, {key: 1.0 + p}, resolve))
            for key in INPUTS}
    rows = []
    for n in names:
        for key, label in INPUTS.items():
            lo, hi = ends[key][0][n], ends[key][1][n]
            rows.append(SensitivityRow(n, key, label, lo.savings_vs_dram, hi.savings_vs_dram,
                                       lo.qps_per_host, hi.qps_per_host, lo.hit_rate, hi.hit_rate))
    corners, largest = {}, {}
    for n in names:
        worst, best = {}, {}
        for key in INPUTS:
            lo, hi = ends[key][0][n].savings_vs_dram, ends[key][1][n].savings_vs_dram
            if lo is None or hi is None or lo == hi:
                continue
            worst[key], best[key] = (1.0 - p, 1.0 + p) if lo < hi else (1.0 + p, 1.0 - p)
        got = [nominal[n]] + [_evaluate(scenario, f, resolve)[n].savings_vs_dram for f in (worst, best) if f]
        got = [g for g in got if g is not None]
        corners[n] = (min(got), max(got)) if got else (None, None)
        spread = {key: abs(ends[key][1][n].savings_vs_dram - ends[key][0][n].savings_vs_dram)
                  for key in INPUTS if ends[key][0][n].savings_vs_dram is not None
                  and ends[key][1][n].savings_vs_dram is not None}
        top = max(spread, key=spread.get) if spread else None
        largest[n] = {"input": top, "label": INPUTS.get(top), "spread": spread.get(top)}
    return Sensitivity(p * 100.0, nominal, tuple(rows), corners, largest)

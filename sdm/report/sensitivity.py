"""Sensitivity of the savings to the uncertain inputs: each varied by +-p% (the scenario's
``[sensitivity] percent``, default 20%), one at a time, then all at once (every corner).

The inputs (REFERENCES.md gives most of them as parameters, not measurements):

* ``dram_w_per_gb`` — DRAM watts per GB (host);
* ``device_watts`` — watts of every SCM device;
* ``base_watts`` — the host's power without DRAM and SCM;
* ``miss_ratio`` — ``1 - hit_rate`` of every SCM configuration's DRAM cache. First-order
  model: a host's request time is the baseline's plus an SCM part proportional to the miss
  ratio, so with per-host QPS ratio ``r`` (to the baseline) the SCM part is ``1/r - 1``
  baseline request times and a miss ratio ``m' = m (1 +- p)`` gives
  ``r' = 1 / (1 + (1/r - 1) m' / m)``. A configuration whose SCM part is zero (ratio 1) or
  without a hit rate does not move;
* ``qps_per_host`` — per-host QPS of every SCM configuration (the baseline's held fixed),
  never raised above the baseline's (an SCM host does at least the DRAM host's work).

The low and high ends are the savings at ``input x (1 - p)`` and ``input x (1 + p)``.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from sdm.report.fleet import evaluate, qps_per_host
from sdm.report.scenario import Scenario

__all__ = ["INPUTS", "SensitivityRow", "Sensitivity", "sensitivity", "vary"]

#: Input key -> label, in the order the report lists them.
INPUTS = {
    "dram_w_per_gb": "DRAM W/GB",
    "device_watts": "SCM device watts",
    "base_watts": "host base watts",
    "miss_ratio": "DRAM cache miss ratio (1 - hit rate)",
    "qps_per_host": "per-host QPS of SCM configs",
}


def vary(scenario: Scenario, factors: dict[str, float]) -> Scenario:
    """``scenario`` with each input of ``factors`` (keys of :data:`INPUTS`) multiplied by
    its factor (miss ratios capped at 1)."""
    s = scenario
    host = s.host
    if "dram_w_per_gb" in factors:
        host = dataclasses.replace(host, dram_w_per_gb=host.dram_w_per_gb * factors["dram_w_per_gb"])
    if "base_watts" in factors:
        host = dataclasses.replace(host, base_watts=host.base_watts * factors["base_watts"])
    devices = s.devices
    if "device_watts" in factors:
        devices = tuple(dataclasses.replace(d, watts=d.watts * factors["device_watts"]) for d in devices)
    configs = []
    for c in s.configs:
        if c.is_baseline:
            configs.append(c)
            continue
        q = qps_per_host(s, c)
        base_q = qps_per_host(s, s.baseline)
        f = factors.get("miss_ratio", 1.0)
        if f != 1.0 and c.hit_rate is not None and c.hit_rate < 1.0 and q > 0:
            m = 1.0 - c.hit_rate
            m2 = min(1.0, m * f)
            scm_part = max(0.0, base_q / q - 1.0)
            q = base_q / (1.0 + scm_part * m2 / m)
            c = dataclasses.replace(c, hit_rate=1.0 - m2)
        # Never above the baseline's: an SCM host does at least the DRAM host's work.
        q = min(q * factors.get("qps_per_host", 1.0), max(base_q, q))
        configs.append(dataclasses.replace(c, qps_per_host=q, qps_ratio=None))
    return dataclasses.replace(s, host=host, devices=devices, configs=tuple(configs))


@dataclass(frozen=True)
class SensitivityRow:
    """Savings of ``config`` (fractions) with ``input`` at ``x (1 - p)`` (``low``) and
    ``x (1 + p)`` (``high``); None where the configuration cannot serve."""

    config: str
    input: str
    label: str
    low: float | None
    high: float | None


@dataclass(frozen=True)
class Sensitivity:
    """``rows``: one per (SCM config, input). ``nominal``: savings per config. ``corners``:
    per config the (min, max) savings over every combination of inputs at +-p."""

    percent: float
    nominal: dict
    rows: tuple[SensitivityRow, ...]
    corners: dict

    def to_json(self) -> dict:
        return {"percent": self.percent, "nominal": self.nominal,
                "rows": [dataclasses.asdict(r) for r in self.rows],
                "corners": {k: list(v) for k, v in self.corners.items()}}


def _savings(s: Scenario) -> dict:
    return {r.name: r.savings_vs_dram for r in evaluate(s).configs}


def sensitivity(scenario: Scenario, percent: float | None = None) -> Sensitivity:
    """Vary every input of :data:`INPUTS` by ``+-percent`` (default: the scenario's)."""
    p = (scenario.sensitivity_percent if percent is None else percent) / 100.0
    names = [c.name for c in scenario.configs if not c.is_baseline]
    nominal = _savings(scenario)
    ends = {key: (_savings(vary(scenario, {key: 1.0 - p})), _savings(vary(scenario, {key: 1.0 + p})))
            for key in INPUTS}
    rows = [SensitivityRow(n, key, label, ends[key][0][n], ends[key][1][n])
            for n in names for key, label in INPUTS.items()]
    corners = {n: [] for n in names}
    for signs in itertools.product((1.0 - p, 1.0 + p), repeat=len(INPUTS)):
        got = _savings(vary(scenario, dict(zip(INPUTS, signs))))
        for n in names:
            if got[n] is not None:
                corners[n].append(got[n])
    return Sensitivity(p * 100.0, {n: nominal[n] for n in names}, tuple(rows),
                       {n: (min(v), max(v)) if v else (None, None) for n, v in corners.items()})

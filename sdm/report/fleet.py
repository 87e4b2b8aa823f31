"""The fleet model: hosts, watts and dollars a scenario needs under each hierarchy.

Pure functions of a :class:`~sdm.report.scenario.Scenario` (no I/O). For a configuration
with DRAM share ``f`` of a model of ``M`` GB, SCM device of ``C`` GB, per-host QPS ``q`` and
a fleet target of ``Q`` requests per second:

* **capacity** — a replica holds one copy of every row, sharded evenly over its hosts. DRAM
  must hold ``D = f * M`` GB (the baseline: ``f = 1``; an SCM configuration: its cache, the
  size at which the replay measured its hit rate), SCM holds every row, ``S = M`` GB (the
  store's SCM tier holds all rows; the DRAM cache is a copy). A host offers
  ``dram_slots * gb_per_dimm - dram_reserved_gb`` GB of DRAM to rows and
  ``ssd_slots * C`` GB of SCM, so
  ``hosts_per_replica = max(1, ceil(D / dram_per_host), ceil(S / scm_per_host))``;
* **throughput** — the work of a request divides over the shards (table-wise sharding with
  load balancing, as in ZionEX), so a replica of ``n`` hosts serves ``n * q`` requests per
  second: ``replicas = ceil(Q / (n * q))`` and ``hosts = n * replicas``. The fleet is
  *capacity-bound* when holding the rows costs hosts the traffic alone would not need
  (``hosts > ceil(Q / q)``: a replica larger than the traffic needs, or the rounding up
  to whole replicas), else *QPS-bound*;
* **per host** — DIMMs ``max(min_dimms, ceil((D / n + dram_reserved_gb) / gb_per_dimm))``,
  SCM devices ``d``: at least the capacity need ``ceil(S / n / C)``, at most ``ssd_slots``
  (see *SCM devices per host* below); watts ``base_watts + dimms * gb_per_dimm * dram_w_per_gb
  + devices * device_watts``; dollars ``base_usd + DRAM GB * dram_usd_per_gb + devices *
  device_usd``;
* **fleet** — power ``hosts * watts`` (W), capital cost ``hosts * dollars``, operating cost
  ``power * 8760 h * years * pue * usd_per_kwh / 1000``; savings versus the DRAM-only
  baseline ``1 - power / baseline_power`` (the SDM paper's metric: power), and the same for
  total cost.

QPS per host and hit rate: the host model's (:mod:`sdm.report.measure` runs it for the host
the fleet bills for: the scenario's cache share and the SCM devices per host computed here),
which :mod:`sdm.report.build` puts in each configuration before evaluating, so the hit rate a
configuration reports is the one its per-host QPS was simulated at. A hand-typed
``qps_per_host`` (or ``qps_ratio`` times the baseline's) is an override, marked
``qps_source = "override"``. What bounds the host count (``bound``): ``capacity`` when holding
the rows costs hosts the traffic alone would not need, else ``qps`` when a resource of the
host (cores, DRAM bandwidth, an SCM tier) limits its rate, or ``sla`` when the latency floor
does (the host's p99 at zero load sits so near the SLA, or above it, that the SLA and not a
resource sets the rate). Every result is a model estimate, not a measurement of a fleet.

SCM devices per host: a host holds the rows with the capacity need, but a host whose
devices bound its rate serves more with more of them. :func:`choose_scm_devices` tries the
counts of :func:`scm_device_counts` — the capacity need ``d0``, then ``2 d0, 4 d0, ...``
below ``ssd_slots``, then ``ssd_slots`` (at most ``2 + log2(ssd_slots)`` host-model runs,
all over one request profile) — with the host model's per-host QPS at each, and keeps the
count with the lowest fleet power (ties: lower cost, then fewer devices). Every count of the
list is run, none skipped when the QPS stops rising: the list then depends only on the
capacity need and the slots, not on what the host model measures, so an input that never
raises any count's per-host QPS (a smaller cache, a slower device) never lowers the chosen
fleet's power either (a minimum over the same counts of powers that each do not fall).
Counts between those of the list (3, 5, 6, 7 of 8 slots) are not tried. A typed QPS, a
replayed one or a configuration the host model did not run keeps the capacity need.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from sdm.errors import ConfigError
from sdm.report.scenario import ConfigSpec, Scenario

__all__ = ["ConfigResult", "ScenarioResult", "evaluate", "qps_per_host", "layout", "HOURS_PER_YEAR", "BOUNDS",
           "with_model_scale", "PAPER_SAVINGS_RANGE", "paper_position", "scm_device_counts",
           "choose_scm_devices", "config_fleet"]

HOURS_PER_YEAR = 8760.0  # 365 days x 24 h
#: The SDM paper's power savings across its real-world scenarios (Ardestani et al., arXiv
#: 2110.11489, abstract; REFERENCES.md seed paper 1): 5% to 29%.
PAPER_SAVINGS_RANGE = (0.05, 0.29)
_EPS = 1e-9  # absorbs float noise in ceil(4000 / 2000.0000000001)
#: What can bound a fleet's host count (``ConfigResult.bound``).
BOUNDS = ("capacity", "qps", "sla")
_LATENCY_FLOOR = "latency floor"  # sdm.host.simulate.LATENCY_FLOOR (the fleet imports no host model)


def _ceil(x: float) -> int:
    return max(0, math.ceil(x - _EPS))


@dataclass(frozen=True)
class ConfigResult:
    """One configuration's fleet. Watts are fleet totals unless named ``per_host``; GB are
    10^9 bytes; dollars are USD. ``hosts`` and the money and power figures are None when
    the configuration cannot serve (``infeasible`` gives the reason)."""

    name: str
    device: str | None
    regime: str                    # "qps-bound" | "capacity-bound" | "infeasible"
    qps_per_host: float
    qps_source: str                # "host-model" | "override"
    hit_rate: float | None         # the DRAM cache's, the one the per-host QPS was measured at
    bound: str                     # "capacity" | "qps" | "sla": what sets the host count
    bottleneck: str | None         # the host model's limiting resource (None: an override)
    dram_gb_needed: float          # per replica: rows that must stay in DRAM
    scm_gb_needed: float           # per replica: rows on SCM
    hosts_per_replica: int | None = None
    hosts_for_qps: int | None = None
    replicas: int | None = None
    hosts: int | None = None
    dimms_per_host: int | None = None
    dram_gb_per_host: float | None = None
    scm_devices_per_host: int | None = None
    watts_per_host: dict | None = None   # {"base", "dram", "scm"} W
    power_watts: float | None = None
    power_breakdown: dict | None = None  # {"base", "dram", "scm"} W, fleet
    capex_usd: float | None = None
    opex_usd: float | None = None
    cost_usd: float | None = None
    savings_vs_dram: float | None = None
    cost_savings_vs_dram: float | None = None
    infeasible: str | None = None
    # how scm_devices_per_host was chosen: {"chosen", "capacity_need", "ssd_slots", "candidates":
    # [{"devices", "qps_per_host", "hit_rate", "bottleneck", "hosts", "power_watts", "cost_usd"}],
    # "reason"}; None: the capacity need, not chosen (a baseline, a typed or replayed QPS)
    scm_devices_choice: dict | None = None

    @property
    def feasible(self) -> bool:
        return self.infeasible is None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ScenarioResult:
    """Every configuration of one scenario, the baseline first as given in the file."""

    scenario: Scenario
    configs: tuple[ConfigResult, ...]

    @property
    def baseline(self) -> ConfigResult:
        name = self.scenario.baseline.name
        return next(c for c in self.configs if c.name == name)

    def config(self, name: str) -> ConfigResult:
        for c in self.configs:
            if c.name == name:
                return c
        raise KeyError(name)


def qps_per_host(scenario: Scenario, config: ConfigSpec) -> float:
    """Requests per second one host of ``config`` serves within the SLA: its ``qps_per_host``
    (the host model's, or typed), else the baseline's times ``qps_ratio`` (an override)."""
    base = scenario.baseline
    if config.qps_per_host is not None:
        return config.qps_per_host
    if base.qps_per_host is None:
        raise ConfigError(f"scenario {scenario.name!r}: configs.{base.name}.qps_per_host is missing: "
                          f"the DRAM-only baseline has no per-host QPS (give the scenario a [workload] "
                          f"for the host model, or type one as an override)")
    if config.is_baseline:
        return base.qps_per_host
    if config.qps_ratio is None and scenario.workload is not None:
        raise ConfigError(f"scenario {scenario.name!r}: configs.{config.name} has no per-host QPS: the host "
                          f"model was not run for it (type qps_per_host / qps_ratio to override it)")
    # Without a workload every figure is typed; a missing ratio is 1 (the SCM host is assumed
    # to meet the SLA at the DRAM host's rate), as scenarios have always read.
    return base.qps_per_host * (1.0 if config.qps_ratio is None else config.qps_ratio)


def layout(s: Scenario, c: ConfigSpec) -> tuple[int, int, str | None]:
    """``(hosts_per_replica, scm_devices_per_host, infeasible reason or None)`` of ``c``: what
    holding the rows takes, before any traffic (the host the host model is run for)."""
    host, model_gb = s.host, s.model.table_gb
    dram_gb = model_gb * c.dram_fraction
    scm_gb = 0.0 if c.is_baseline else model_gb
    n = max(1, _ceil(dram_gb / host.table_dram_gb))
    if c.is_baseline:
        return n, 0, None
    dev = s.device(c.device)
    if host.ssd_slots == 0:
        return n, 0, f"host {host.name!r} has no SSD slots for {c.device}"
    n = max(n, _ceil(scm_gb / (host.ssd_slots * dev.capacity_gb)))
    return n, _ceil(scm_gb / n / dev.capacity_gb), None


def scm_device_counts(s: Scenario, c: ConfigSpec) -> tuple[int, ...]:
    """SCM devices per host :func:`choose_scm_devices` tries for ``c``, ascending: the capacity
    need ``d0`` (:func:`layout`), ``2 d0, 4 d0, ...`` below the host's ``ssd_slots``, and
    ``ssd_slots``. Empty for the baseline and for a configuration whose rows no host holds."""
    if c.is_baseline:
        return ()
    _, need, infeasible = layout(s, c)
    if infeasible is not None:
        return ()
    slots = s.host.ssd_slots
    out, d = [], max(1, need)
    while d < slots:
        out.append(d)
        d *= 2
    out.append(max(slots, need))
    return tuple(out)


def _choice_reason(c: ConfigSpec, tried: list, best: int, slots: int) -> str:
    m, r = tried[best]
    d, dev = m.scm_devices, c.device
    counts = ", ".join(str(x.scm_devices) for x, _ in tried)
    bound = m.bottleneck or "its typed QPS"
    scm_bound = bool(m.bottleneck) and m.bottleneck.endswith(" tier")
    head = f"{d} x {dev}"
    if len(tried) == 1:
        return f"{head}: the capacity need already fills the host's {slots} slots (bottleneck {bound})"
    if best == len(tried) - 1:
        why = ("every slot filled, and the SCM devices still bound the host" if scm_bound else
               f"every slot filled; bottleneck {bound}")
        return f"{head}: {why} (lowest fleet power of {counts} devices per host)"
    nm, nr = tried[best + 1]
    rise = nm.qps_per_host / m.qps_per_host if m.qps_per_host else math.inf
    if rise < 1.05:
        why = f"more devices stop raising QPS (x{rise:.2f} at {nm.scm_devices}), bottleneck {bound}"
    elif nr.feasible and r.feasible:
        why = (f"{nm.scm_devices} raise QPS x{rise:.2f} but the fleet would draw "
               f"{nr.power_watts / 1e3:,.1f} kW, not {r.power_watts / 1e3:,.1f} kW (bottleneck {bound})")
    else:
        why = f"bottleneck {bound}"
    return f"{head}: {why} (lowest fleet power of {counts} devices per host)"


def choose_scm_devices(s: Scenario, c: ConfigSpec, measure) -> ConfigSpec:
    """``c`` with the SCM devices per host of least fleet power (module docstring).

    ``measure(devices) -> ConfigSpec``: ``c`` with the per-host QPS, hit rate and bottleneck
    the host model gives a host of ``devices`` SCM devices; called once per count of
    :func:`scm_device_counts`, ascending. Returns the measured spec of the chosen count with
    ``scm_devices`` and ``scm_devices_choice`` (the counts tried, their QPS, hosts, power and
    cost, and the reason in words) set; ``measure(capacity need)`` as it is for a
    configuration with no count to choose (the baseline, rows no host holds)."""
    counts = scm_device_counts(s, c)
    if not counts:
        _, need, _ = layout(s, c)
        return measure(need)
    tried = []
    for d in counts:
        m = dataclasses.replace(measure(d), scm_devices=d, scm_devices_choice=None)
        tried.append((m, _config(s, m)))

    def rank(i):
        r = tried[i][1]
        return ((r.power_watts, r.cost_usd) if r.feasible else (math.inf, math.inf)) + (counts[i],)

    best = min(range(len(tried)), key=rank)
    choice = {"chosen": counts[best], "capacity_need": counts[0], "ssd_slots": s.host.ssd_slots,
              "candidates": [{"devices": m.scm_devices, "qps_per_host": r.qps_per_host, "hit_rate": m.hit_rate,
                              "bottleneck": m.bottleneck, "hosts": r.hosts, "power_watts": r.power_watts,
                              "cost_usd": r.cost_usd} for m, r in tried],
              "reason": _choice_reason(c, tried, best, s.host.ssd_slots)}
    return dataclasses.replace(tried[best][0], scm_devices_choice=choice)


def config_fleet(s: Scenario, c: ConfigSpec) -> ConfigResult:
    """One configuration through the fleet model (no savings: :func:`evaluate` adds them)."""
    return _config(s, c)


def _bound(regime: str, bottleneck: str | None) -> str:
    if regime == "capacity-bound":
        return "capacity"
    return "sla" if bottleneck == _LATENCY_FLOOR or regime == "infeasible" else "qps"


def _config(s: Scenario, c: ConfigSpec) -> ConfigResult:
    host, model_gb = s.host, s.model.table_gb
    q = qps_per_host(s, c)
    dram_gb = model_gb * c.dram_fraction
    scm_gb = 0.0 if c.is_baseline else model_gb
    partial = dict(name=c.name, device=c.device, qps_per_host=q, qps_source=c.qps_source,
                   hit_rate=1.0 if c.is_baseline and c.hit_rate is None else c.hit_rate,
                   bottleneck=c.bottleneck, dram_gb_needed=dram_gb, scm_gb_needed=scm_gb,
                   scm_devices_choice=c.scm_devices_choice)
    n, devices, infeasible = layout(s, c)
    if not q > 0:
        why = "no request rate meets the SLA (per-host QPS 0)"
        if c.bottleneck == _LATENCY_FLOOR:
            why += ": the p99 at zero load is already above it"
        return ConfigResult(regime="infeasible", bound="sla", infeasible=why, **partial)
    if infeasible is not None:
        return ConfigResult(regime="infeasible", bound="capacity", infeasible=infeasible, **partial)
    dev = None if c.is_baseline else s.device(c.device)
    if dev is not None and c.scm_devices is not None:
        if not devices <= c.scm_devices <= max(devices, host.ssd_slots):
            raise ConfigError(f"configs.{c.name}: {c.scm_devices} SCM devices per host is outside "
                              f"[{devices}, {host.ssd_slots}] (what its rows need, the host's ssd_slots)")
        devices = c.scm_devices
    for_qps = max(1, _ceil(s.traffic.target_qps / q))
    replicas = max(1, _ceil(s.traffic.target_qps / (n * q)))
    hosts = n * replicas
    dimms = max(host.min_dimms, _ceil((dram_gb / n + host.dram_reserved_gb) / host.gb_per_dimm))
    dimms = min(dimms, host.dram_slots)  # n was chosen so the rows fit; guards float noise
    host_dram_gb = dimms * host.gb_per_dimm
    per_host = {"base": host.base_watts, "dram": host_dram_gb * host.dram_w_per_gb,
                "scm": devices * (dev.watts if dev else 0.0)}
    power = hosts * sum(per_host.values())
    host_usd = host.base_usd + host_dram_gb * host.dram_usd_per_gb + devices * (dev.usd if dev else 0.0)
    capex = hosts * host_usd
    opex = power / 1e3 * HOURS_PER_YEAR * s.cost.years * s.cost.pue * s.cost.usd_per_kwh
    regime = "capacity-bound" if hosts > for_qps else "qps-bound"
    return ConfigResult(
        regime=regime, bound=_bound(regime, c.bottleneck),
        hosts_per_replica=n, hosts_for_qps=for_qps, replicas=replicas, hosts=hosts,
        dimms_per_host=dimms, dram_gb_per_host=host_dram_gb, scm_devices_per_host=devices,
        watts_per_host=per_host, power_watts=power,
        power_breakdown={k: v * hosts for k, v in per_host.items()},
        capex_usd=capex, opex_usd=opex, cost_usd=capex + opex, **partial)


def evaluate(scenario: Scenario) -> ScenarioResult:
    """Every configuration of ``scenario`` through the fleet model, with savings versus the
    DRAM-only baseline (None when either side cannot serve)."""
    raw = [_config(scenario, c) for c in scenario.configs]
    base = next(r for r, c in zip(raw, scenario.configs) if c.is_baseline)
    out = []
    for r in raw:
        if r.feasible and base.feasible:
            r = dataclasses.replace(r, savings_vs_dram=1.0 - r.power_watts / base.power_watts
                                    if base.power_watts > 0 else 0.0,
                                    cost_savings_vs_dram=1.0 - r.cost_usd / base.cost_usd
                                    if base.cost_usd > 0 else 0.0)
        out.append(r)
    return ScenarioResult(scenario, tuple(out))


def with_model_scale(scenario: Scenario, factor: float) -> Scenario:
    """``scenario`` with tables ``factor`` times as large (everything else unchanged)."""
    return dataclasses.replace(scenario, model=scenario.model.scaled(factor))


def paper_position(savings: float | None) -> str:
    """``below`` / ``within`` / ``above`` the paper's 5%-29% power savings (``n/a`` for None)."""
    if savings is None:
        return "n/a"
    lo, hi = PAPER_SAVINGS_RANGE
    return "below" if savings < lo else "above" if savings > hi else "within"

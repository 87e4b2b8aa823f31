"""Power/cost scenarios: a TOML file turned into frozen dataclasses, every value with its source.

A scenario describes one deployment question: a model, the traffic it must serve, the host
it runs on, the SCM devices on offer, the price of energy, and the hierarchies to compare
(one DRAM-only baseline and any number of DRAM-cache-over-SCM configurations). Units are in
the key names; GB is 10^9 bytes throughout (as :class:`sdm.devices.DeviceSpec`).

TOML layout (unknown keys are errors; every section may carry a ``sources`` table mapping
its keys to where their numbers come from, printed beside each input in the report)::

    name = "qps-bound"                 # optional, defaults to the file's stem
    description = "..."                # optional

    [model]                            # exactly one of preset / tables_gb / table_rows
    preset = "mlperf-dlrm"             # a name of sdm.model.PRESETS (rows x dim of its tables)
    table_rows = [1000000, 50000]      # or rows per table, with dim
    dim = 64
    tables_gb = 4000.0                 # or the total table bytes, in GB
    fmt = "fp32"                       # row format (sdm.ROW_FORMATS), default fp32
    scale = 1.0                        # multiplies the tables (model growth), default 1

    [traffic]
    target_qps = 400000.0              # requests per second the fleet must serve
    sla_p99_us = 30000.0               # p99 latency bound the per-host QPS was measured at
    replay_qps = "ratio"               # ratio (default) | absolute | scenario: how replay QPS is used

    [host]
    name = "2-socket server"
    base_watts = 400.0                 # host power at the operating utilization, without DRAM and SCM
    base_usd = 10000.0                 # host price without DRAM and SCM devices
    dram_slots = 24
    gb_per_dimm = 32.0
    min_dimms = 4                      # DIMMs always installed (memory channels), default 1
    dram_reserved_gb = 64.0            # DRAM not available to tables (OS, dense model), default 0
    dram_w_per_gb = 0.25
    dram_usd_per_gb = 3.0
    ssd_slots = 8                      # bays for SCM devices

    [devices.nand-p4500]               # optional overrides of an sdm.DEVICES preset
    watts = 12.0                       # per device at the operating load (default: active_watts)
    usd = 500.0                        # per device (default: usd_per_gb x capacity_gb)
    capacity_gb = 2000.0               # default: the preset's capacity_gb

    [cost]
    usd_per_kwh = 0.10
    years = 3.0
    pue = 1.0                          # facility power per IT watt, default 1

    [sensitivity]
    percent = 20.0                     # each uncertain input varied by +-percent, default 20

    [workload]                         # what the host model serves (sdm.host); without it every
                                       # config needs a hand-typed qps (an override)
    trace = "../traces/default.npz"    # a trace file (relative to the scenario file), or
    profile = "meta-2021"              # a generator profile of sdm trace gen, with
    seed = 0                           # its seed and
    scale = {table_size = 20000, batch_size = 256, batches = 32}   # its size (get_profile's overrides)
    model = "rm2"                      # the DLRM preset each request runs (its MLPs refit over the
                                       # trace's tables; optional: embeddings only)
    host = "2-socket"                  # a host preset of sdm.host or a host .toml
    request_size = 32                  # samples per request (default: the trace's own requests)
    dim = 64                           # row width of the store profiled (default: the model's, else 64)
    arrivals = 20000                   # simulated requests per offered rate (default 20000)

    [[configs]]                        # exactly one config without a device: the DRAM baseline
    name = "dram"
    qps_per_host = 2000.0              # an override of the host model's per-host QPS at the SLA
                                       # (required without a [workload])

    [[configs]]
    name = "sdm-nand"                  # also the replay config name it takes results from
    device = "nand-p4500"              # the SCM device (a preset of sdm.DEVICES)
    dram_fraction = 0.1                # DRAM cache as a share of the model's bytes
    hit_rate = 0.9                     # share of row reads the DRAM cache serves (no [workload]
                                       # only: with one, the host model measures it)
    qps_ratio = 0.9                    # override: per-host QPS relative to the baseline's, or
    # qps_per_host = 1800.0            # override: an absolute per-host QPS
    hierarchy = "sdm-nand"             # the hierarchy the host model serves (default: the name if it
                                       # is a preset, else dram / sdm-nand); its SCM device is `device`

With a ``[workload]``, a configuration without ``qps_per_host`` / ``qps_ratio`` takes its
per-host QPS and hit rate from the host model (``qps_source = "host-model"``); one with them
keeps the typed figure, marked ``qps_source = "override"`` in the report.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field

from sdm.store.config import read_toml
from sdm.devices import DEVICES
from sdm.errors import ConfigError
from sdm.validate import check_choice, check_int, check_number
from sdm.formats import MAX_DIM, ROW_FORMATS, row_bytes

__all__ = ["ModelSpec", "TrafficSpec", "HostSpec", "DeviceCost", "ConfigSpec", "CostSpec",
           "WorkloadSpec", "Scenario", "QPS_SOURCES", "DEFAULT_ARRIVALS", "GENERATOR_SCALE_KEYS", "load_scenario", "scenario_from_dict", "REPLAY_QPS_MODES",
           "DEFAULT_SENSITIVITY_PERCENT", "GB"]

GB = 1e9
REPLAY_QPS_MODES = ("ratio", "absolute", "scenario")
#: Where a configuration's per-host QPS comes from in the report.
QPS_SOURCES = ("host-model", "override")
#: Simulated requests per offered rate of the report's host-model runs: the p99 of 20,000
#: arrivals rests on 200 requests above it, enough for a bisection to 0.1%; the host model's
#: own default (100,000) costs five times as long for every run of the sensitivity analysis.
DEFAULT_ARRIVALS = 20_000
#: Generator overrides a workload's ``scale`` may give (those of sdm.trace.generate.get_profile).
GENERATOR_SCALE_KEYS = ("tables", "table_size", "pooling", "alpha", "batch_size", "batches", "requests",
                        "max_rows", "items_per_request", "dense")
# Assumption: +-20% spans the DRAM W/GB and device-watt ranges REFERENCES.md gives as
# parameters (e.g. 0.05-0.4 W/GB is wider; the report says so) without flipping signs.
DEFAULT_SENSITIVITY_PERCENT = 20.0
_DEFAULT = "default"
_FILE = "scenario file (no source given)"


@dataclass(frozen=True)
class ModelSpec:
    """The embedding tables to serve. ``table_bytes``: total bytes after ``scale``;
    ``row_bytes`` bytes per row (None when given as ``tables_gb``)."""

    name: str
    table_bytes: float
    fmt: str
    dim: int | None
    num_tables: int | None
    scale: float
    row_bytes: int | None = None
    kind: str = "tables_gb"        # how the file gave it: preset | tables_gb | table_rows

    @property
    def table_gb(self) -> float:
        """Total table size in GB (10^9 bytes)."""
        return self.table_bytes / GB

    def scaled(self, factor: float) -> "ModelSpec":
        """The same model with its tables ``factor`` times as large."""
        return ModelSpec(self.name, self.table_bytes * factor, self.fmt, self.dim,
                         self.num_tables, self.scale * factor, self.row_bytes, self.kind)


@dataclass(frozen=True)
class TrafficSpec:
    """``target_qps``: requests per second the fleet serves; ``sla_p99_us``: the p99 bound
    (µs); ``replay_qps``: how a replay's QPS enters (``ratio`` to the baseline's replay,
    ``absolute`` requests per second, or ``scenario``: not at all, the per-host QPS stays the
    scenario's and replays give hit rates and cache shares only)."""

    target_qps: float
    sla_p99_us: float
    replay_qps: str = "ratio"


@dataclass(frozen=True)
class HostSpec:
    """A server type. Watts at the operating utilization; DRAM in GB (10^9 bytes)."""

    name: str
    base_watts: float
    base_usd: float
    dram_slots: int
    gb_per_dimm: float
    dram_w_per_gb: float
    dram_usd_per_gb: float
    ssd_slots: int
    min_dimms: int = 1
    dram_reserved_gb: float = 0.0

    @property
    def max_dram_gb(self) -> float:
        """DRAM a fully populated host holds (GB)."""
        return self.dram_slots * self.gb_per_dimm

    @property
    def table_dram_gb(self) -> float:
        """DRAM available to embedding rows on a full host (GB)."""
        return self.max_dram_gb - self.dram_reserved_gb


@dataclass(frozen=True)
class DeviceCost:
    """An SCM device as the fleet model sees it: ``watts`` per device at the operating
    load, ``usd`` per device, ``capacity_gb`` (10^9 bytes)."""

    name: str
    watts: float
    usd: float
    capacity_gb: float


@dataclass(frozen=True)
class ConfigSpec:
    """A hierarchy to compare. ``device`` None marks the DRAM-only baseline (all rows in
    DRAM, ``dram_fraction`` 1). Otherwise DRAM holds ``dram_fraction`` of the model's bytes
    as a cache and ``device`` holds every row. Per-host QPS is ``qps_per_host`` or the
    baseline's times ``qps_ratio``. ``hit_rate`` (share of row reads the DRAM cache
    serves) scales the SCM share of request time in the sensitivity analysis.
    ``replay_name``: the replay config whose results apply (default ``name``)."""

    name: str
    device: str | None
    dram_fraction: float
    hit_rate: float | None = None
    qps_ratio: float | None = None
    qps_per_host: float | None = None
    replay_name: str | None = None
    hierarchy: str | None = None
    qps_source: str = "override"
    bottleneck: str | None = None     # the host model's, for its QPS (None: an override)
    measured_by: str | None = None    # a replay result that gave the QPS and hit rate (not re-run)
    # SCM devices per host the fleet bills (None: what holding the rows needs) and how they were
    # chosen (sdm.report.fleet.choose_scm_devices); set by the host model's resolve step
    scm_devices: int | None = None
    scm_devices_choice: dict | None = None

    @property
    def is_baseline(self) -> bool:
        return self.device is None

    @property
    def has_override(self) -> bool:
        """A hand-typed per-host QPS (``qps_per_host`` or ``qps_ratio``) in the file."""
        return self.measured_by is None and (self.qps_per_host is not None or self.qps_ratio is not None)

    @property
    def hierarchy_name(self) -> str:
        """The hierarchy the host model serves: ``hierarchy``, else the name when it is a
        hierarchy preset, else ``dram`` (baseline) or ``sdm-nand`` (its device replaced)."""
        if self.hierarchy is not None:
            return self.hierarchy
        from sdm.store.config import HIERARCHY_PRESETS

        if self.name in HIERARCHY_PRESETS:
            return self.name
        return "dram" if self.is_baseline else "sdm-nand"


@dataclass(frozen=True)
class WorkloadSpec:
    """What the host model serves for a scenario: a trace (``trace``, an absolute path) or a
    generator profile (``profile`` with ``seed`` and ``scale``, the overrides of
    :func:`sdm.trace.generate.get_profile` as sorted pairs); ``model``: the DLRM preset each
    request runs (None: embeddings only); ``host``: a host preset or .toml path of
    :mod:`sdm.host.spec`; ``request_size``: samples per request (None: the trace's own);
    ``dim``: row width of the store profiled; ``arrivals``: simulated requests per rate."""

    host: str
    dim: int
    trace: str | None = None
    profile: str | None = None
    seed: int = 0
    scale: tuple[tuple[str, object], ...] = ()
    model: str | None = None
    request_size: int | None = None
    arrivals: int = DEFAULT_ARRIVALS

    def describe(self) -> str:
        what = (f"trace {os.path.basename(self.trace)}" if self.trace else
                f"generated {self.profile} (seed {self.seed}"
                + "".join(f", {k} {v}" for k, v in self.scale) + ")")
        req = "" if self.request_size is None else f", requests of {self.request_size} samples"
        return f"{what}{req}, model {self.model or 'none (embeddings only)'}, host {self.host}"


@dataclass(frozen=True)
class CostSpec:
    """Operating cost: ``usd_per_kwh`` energy price, over ``years``, times ``pue``."""

    usd_per_kwh: float
    years: float
    pue: float = 1.0


@dataclass(frozen=True)
class Scenario:
    """A whole scenario. ``sources`` pairs a dotted input key (``host.base_watts``,
    ``configs.sdm-nand.hit_rate``) with where its value comes from; ``notes`` lists what
    was derived or defaulted, for the report."""

    name: str
    description: str
    model: ModelSpec
    traffic: TrafficSpec
    host: HostSpec
    devices: tuple[DeviceCost, ...]
    configs: tuple[ConfigSpec, ...]
    cost: CostSpec
    sensitivity_percent: float = DEFAULT_SENSITIVITY_PERCENT
    sources: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    path: str | None = None
    notes: tuple[str, ...] = ()
    workload: WorkloadSpec | None = None

    @property
    def baseline(self) -> ConfigSpec:
        return next(c for c in self.configs if c.is_baseline)

    def device(self, name: str) -> DeviceCost:
        for d in self.devices:
            if d.name == name:
                return d
        raise ConfigError(f"scenario {self.name!r}: device {name!r} is not among {[d.name for d in self.devices]}")

    def source(self, key: str) -> str:
        return dict(self.sources).get(key, _FILE)

    def inputs(self) -> list[dict]:
        """Every input as ``{"key", "value", "unit", "source"}``, in report order."""
        m, t, h, c = self.model, self.traffic, self.host, self.cost
        rows = [("model", m.name, "", f"model.{m.kind}"),
                ("model.table_gb", m.table_gb, "GB", f"model.{m.kind}"),
                ("model.fmt", m.fmt, "", "model.fmt"),
                ("model.scale", m.scale, "x", "model.scale"),
                ("traffic.target_qps", t.target_qps, "requests/s", "traffic.target_qps"),
                ("traffic.sla_p99_us", t.sla_p99_us, "us", "traffic.sla_p99_us"),
                ("traffic.replay_qps", t.replay_qps, "", "traffic.replay_qps"),
                ("host.name", h.name, "", "host.name")]
        for key, unit in (("base_watts", "W"), ("base_usd", "USD"), ("dram_slots", "DIMMs"),
                          ("gb_per_dimm", "GB"), ("min_dimms", "DIMMs"), ("dram_reserved_gb", "GB"),
                          ("dram_w_per_gb", "W/GB"), ("dram_usd_per_gb", "USD/GB"), ("ssd_slots", "devices")):
            rows.append((f"host.{key}", getattr(h, key), unit, f"host.{key}"))
        for d in self.devices:
            for key, unit in (("watts", "W"), ("usd", "USD"), ("capacity_gb", "GB")):
                rows.append((f"devices.{d.name}.{key}", getattr(d, key), unit, f"devices.{d.name}.{key}"))
        for key, unit in (("usd_per_kwh", "USD/kWh"), ("years", "years"), ("pue", "")):
            rows.append((f"cost.{key}", getattr(c, key), unit, f"cost.{key}"))
        rows.append(("sensitivity.percent", self.sensitivity_percent, "%", "sensitivity.percent"))
        w = self.workload
        if w is not None:
            wrows = [("workload.trace", w.trace, "")] if w.trace else [
                ("workload.profile", w.profile, ""), ("workload.seed", w.seed, "")] + [
                (f"workload.scale.{k}", v, "") for k, v in w.scale]
            wrows += [("workload.model", w.model or "none (embeddings only)", ""),
                      ("workload.host", w.host, ""), ("workload.request_size", w.request_size or
                                                      "the trace's own requests", "samples"),
                      ("workload.dim", w.dim, "columns"), ("workload.arrivals", w.arrivals, "requests per rate")]
            rows += [(k, v, u, k) for k, v, u in wrows]
        for cf in self.configs:
            k = f"configs.{cf.name}"
            rows.append((f"{k}.device", cf.device or "none (DRAM-only baseline)", "", f"{k}.device"))
            if self.workload is not None and not cf.has_override:
                rows.append((f"{k}.hierarchy", cf.hierarchy_name, "", f"{k}.hierarchy"))
            for key, unit in (("dram_fraction", "of model bytes"), ("hit_rate", ""),
                              ("qps_ratio", "x baseline"), ("qps_per_host", "requests/s")):
                value = getattr(cf, key)
                if value is None or (cf.is_baseline and key == "dram_fraction"):
                    continue
                rows.append((f"{k}.{key}", value, unit, f"{k}.{key}"))
        src = dict(self.sources)
        out = []
        for key, value, unit, skey in rows:
            source = src.get(skey, _FILE)
            if key == "model.table_gb" and m.kind != "tables_gb":
                source = f"derived: rows x {m.row_bytes} B per {m.fmt} row x scale; {source}"
            elif key == "model.table_gb":
                source = f"{source} (x scale)"
            if key.endswith(".device") and value == "none (DRAM-only baseline)":
                source = _DEFAULT
            out.append({"key": key, "value": value, "unit": unit, "source": source})
        return out


# -- reading ---------------------------------------------------------------------------------


class _Reader:
    """Takes typed, range-checked values out of one TOML table, recording their sources."""

    def __init__(self, data, where: str, sources: dict, prefix: str):
        if not isinstance(data, dict):
            raise ConfigError(f"{where} must be a table, got {type(data).__name__}")
        self.data = dict(data)
        self.where = where
        self.prefix = prefix
        self.out_sources = sources
        given = self.data.pop("sources", {})
        if not isinstance(given, dict) or not all(isinstance(v, str) for v in given.values()):
            raise ConfigError(f"{where}.sources must be a table of strings")
        self.given = given
        self.seen = {"sources"}

    def _key(self, key):
        return f"{self.prefix}.{key}" if self.prefix else key

    def has(self, key) -> bool:
        return key in self.data

    def _missing(self, key, name) -> ConfigError:
        """A required ``key`` is absent: name a key of the table that looks like it misspelt."""
        like = difflib.get_close_matches(key, sorted(set(self.data) - self.seen), n=1, cutoff=0.75)
        return ConfigError(f"{name} is missing (required)" + (
            f"; the table has an unknown key {like[0]!r}: a misspelling of {key!r}?" if like else ""))

    def number(self, key, *, default=None, required=True, minimum=None, above=None,
               maximum=None, integer=False, default_source=_DEFAULT):
        self.seen.add(key)
        name = f"{self.where}.{key}"
        if key not in self.data:
            if default is None and required:
                raise self._missing(key, name)
            if default is not None:
                self.out_sources[self._key(key)] = default_source
            return default
        value = self.data[key]
        if integer:
            value = check_int(value, name, lo=minimum, hi=maximum, error=ConfigError)
        else:
            value = check_number(value, name, lo=minimum if above is None else above, hi=maximum,
                                 lo_open=above is not None, error=ConfigError)
        self.out_sources[self._key(key)] = self.given.get(key, _FILE)
        return value

    def string(self, key, *, default=None, choices=None, default_source=_DEFAULT):
        self.seen.add(key)
        name = f"{self.where}.{key}"
        if key not in self.data:
            if default is None:
                raise self._missing(key, name)
            if default:
                self.out_sources[self._key(key)] = default_source
            return default
        value = self.data[key]
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{name} must be a non-empty string, got {value!r}")
        if choices is not None:
            check_choice(value, name, choices, error=ConfigError)
        self.out_sources.setdefault(self._key(key), self.given.get(key, _FILE))
        return value

    def finish(self, *, sections=()):
        """ConfigError on any key not read; the allowed keys listed are those read and the
        ``sections`` (tables) the caller reads elsewhere."""
        unknown = sorted(set(self.data) - self.seen)
        if unknown:
            allowed = sorted((self.seen - {"sources"}) | set(sections))
            raise ConfigError(f"{self.where}: unknown key(s) {unknown}; allowed: {allowed}")
        unsourced = sorted(set(self.given) - self.seen)
        if unsourced:
            raise ConfigError(f"{self.where}.sources names unknown key(s) {unsourced}")


def load_scenario(path) -> Scenario:
    """Read and validate a scenario TOML file (layout in this module's docstring).

    Raises:
        ConfigError: a missing file, malformed TOML, or any field missing, of the wrong type,
        out of range, unknown, or naming an unknown device / model preset; the message names
        the field.
    """
    path, data = read_toml(path, "scenario file")
    data.setdefault("name", os.path.splitext(os.path.basename(path))[0])
    return scenario_from_dict(data, path=path)


def scenario_from_dict(data: dict, *, path: str | None = None) -> Scenario:
    """Validate a scenario given as a dict (the parsed TOML). See :func:`load_scenario`."""
    sources: dict[str, str] = {}
    where = f"scenario {path}" if path else "scenario"
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a table, got {type(data).__name__}")
    top = _Reader({k: v for k, v in data.items() if not isinstance(v, (dict, list))}, where, sources, "")
    sections = {k: v for k, v in data.items() if isinstance(v, (dict, list))}
    name = top.string("name", default="scenario")
    description = top.string("description", default="-")
    allowed = {"model", "traffic", "host", "devices", "cost", "sensitivity", "configs", "workload"}
    top.finish(sections=allowed)
    where = f"scenario {name!r}"
    unknown = sorted(set(sections) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown section(s) {unknown}; allowed: {sorted(allowed)}")
    for required in ("model", "traffic", "host", "cost", "configs"):
        if required not in sections:
            raise ConfigError(f"{where}: section [{required}] is missing (required)")
    notes: list[str] = []
    model = _model(sections["model"], f"{where}: model", sources)
    traffic = _traffic(sections["traffic"], f"{where}: traffic", sources)
    host = _host(sections["host"], f"{where}: host", sources)
    cost = _cost(sections["cost"], f"{where}: cost", sources)
    percent = DEFAULT_SENSITIVITY_PERCENT
    if "sensitivity" in sections:
        r = _Reader(sections["sensitivity"], f"{where}: sensitivity", sources, "sensitivity")
        percent = r.number("percent", default=DEFAULT_SENSITIVITY_PERCENT, above=0, maximum=90,
                           default_source="assumption: default +-20%")
        r.finish()
    else:
        sources["sensitivity.percent"] = "assumption: default +-20%"
    configs = _configs(sections["configs"], f"{where}: configs", sources)
    workload = None
    if "workload" in sections:
        workload = _workload(sections["workload"], f"{where}: workload", sources, path, model)
    _check_qps(configs, workload, where, sources)
    overrides = sections.get("devices", {})
    if not isinstance(overrides, dict):
        raise ConfigError(f"{where}: devices must be a table of device tables ([devices.NAME])")
    used = [c.device for c in configs if c.device is not None]
    names = list(dict.fromkeys(used + sorted(overrides)))
    devices = tuple(_device(n, overrides.get(n, {}), f"{where}: devices.{n}", sources) for n in names)
    return Scenario(name, description, model, traffic, host, devices, configs, cost, percent,
                    tuple(sorted(sources.items())), path, tuple(notes), workload)


def _workload(data, where, sources, path, model: ModelSpec) -> WorkloadSpec:
    """The ``[workload]`` table: a trace or a generator profile, the model, the host."""
    from sdm.host.spec import HOST_PRESETS, THIS_MACHINE
    from sdm.model.presets import PRESETS

    r = _Reader(data, where, sources, "workload")
    given = [k for k in ("trace", "profile") if r.has(k)]
    if len(given) != 1:
        raise ConfigError(f"{where}: give exactly one of trace (a trace file) or profile (a generator "
                          f"profile with seed and scale); got {given or 'none'}")
    here = os.path.dirname(os.path.abspath(path)) if path else os.getcwd()
    trace = profile = None
    seed, scale = 0, ()
    if given[0] == "trace":
        trace = os.path.normpath(os.path.join(here, r.string("trace")))
        if not os.path.isfile(trace):
            raise ConfigError(f"{where}.trace {data['trace']!r} is not a file (looked at {trace!r}; a "
                              f"relative path is relative to the scenario file)")
    else:
        from sdm.trace.generate import PROFILES, get_profile

        profile = r.string("profile", choices=sorted(PROFILES))
        seed = r.number("seed", integer=True, minimum=0, default=0, default_source="default: seed 0")
        r.seen.add("scale")
        raw = data.get("scale", {})
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}.scale must be a table of generator overrides "
                              f"({', '.join(GENERATOR_SCALE_KEYS)}), got {raw!r}")
        bad = sorted(set(raw) - set(GENERATOR_SCALE_KEYS))
        if bad:
            raise ConfigError(f"{where}.scale: unknown key(s) {bad}; allowed: {list(GENERATOR_SCALE_KEYS)}")
        scale = tuple(sorted(raw.items()))
        if "scale" in r.given:
            sources["workload.scale"] = r.given["scale"]
        try:  # the generator's own checks, now rather than after the first replays
            get_profile(profile, **dict(scale))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}.scale {dict(scale)!r}: {exc}") from None
    mname = r.string("model", default="") or None
    if mname is not None and mname not in PRESETS:
        raise ConfigError(f"{where}.model {mname!r} is not one of sdm.model.PRESETS {sorted(PRESETS)}")
    host = r.string("host")
    if host not in HOST_PRESETS and host != THIS_MACHINE:
        if not host.endswith(".toml"):
            raise ConfigError(f"{where}.host {host!r} is neither a host preset "
                              f"{sorted([THIS_MACHINE, *HOST_PRESETS])} nor a .toml file")
        host = os.path.normpath(os.path.join(here, host))
        if not os.path.isfile(host):
            raise ConfigError(f"{where}.host {data['host']!r} is not a file (looked at {host!r})")
    request_size = r.number("request_size", integer=True, minimum=1, maximum=1 << 20, required=False)
    default_dim = PRESETS[mname].dim if mname else (model.dim or 64)
    dim = r.number("dim", integer=True, minimum=1, maximum=MAX_DIM, default=default_dim,
                   default_source="default: the model preset's dim" if mname else
                   "default: the scenario model's dim, else 64")
    if mname is not None and dim != PRESETS[mname].dim:
        raise ConfigError(f"{where}.dim {dim} differs from model preset {mname!r}'s dim {PRESETS[mname].dim}; "
                          f"leave dim out")
    arrivals = r.number("arrivals", integer=True, minimum=1000, maximum=10_000_000, default=DEFAULT_ARRIVALS,
                        default_source=f"default: {DEFAULT_ARRIVALS:,} simulated requests per rate")
    r.finish(sections=("scale",))
    return WorkloadSpec(host=host, dim=dim, trace=trace, profile=profile, seed=seed, scale=scale, model=mname,
                        request_size=request_size, arrivals=arrivals)


def _check_qps(configs, workload, where, sources) -> None:
    """Without a workload every configuration's QPS is typed; with one, hit rates are measured."""
    base = next(c for c in configs if c.is_baseline)
    if workload is None:
        if base.qps_per_host is None:
            raise ConfigError(f"{where}: configs.{base.name}.qps_per_host is missing (required without a "
                              f"[workload] section: give one so the host model measures it)")
        return
    for c in configs:
        if c.hit_rate is not None and not c.is_baseline and not c.has_override:
            raise ConfigError(f"{where}: configs.{c.name}.hit_rate is measured by the host model from "
                              f"[workload]; remove it (or type the QPS too, an override)")
        if c.has_override:
            sources.setdefault(f"configs.{c.name}.qps_source", "override: typed in the scenario file")


def _model(data, where, sources) -> ModelSpec:
    r = _Reader(data, where, sources, "model")
    given = [k for k in ("preset", "tables_gb", "table_rows") if r.has(k)]
    if len(given) != 1:
        raise ConfigError(f"{where}: give exactly one of preset, tables_gb, table_rows; got {given or 'none'}")
    fmt = r.string("fmt", default="fp32", choices=ROW_FORMATS)
    if "fmt" not in data:
        sources["model.fmt"] = "default: fp32 rows"
    scale = r.number("scale", default=1.0, above=0, default_source="default: no growth")
    kind = given[0]
    if kind == "preset":
        from sdm.model.presets import PRESETS

        preset = r.string("preset")
        if preset not in PRESETS:
            raise ConfigError(f"{where}.preset {preset!r} is not one of {sorted(PRESETS)}")
        p = PRESETS[preset]
        sources["model.preset"] = f"sdm.model.PRESETS: {p.source or preset}"
        rb = row_bytes(fmt, p.dim)
        rows = sum(p.table_sizes)
        r.finish()
        return ModelSpec(preset, float(rows * rb) * scale, fmt, p.dim, len(p.table_sizes), scale, rb, "preset")
    if kind == "tables_gb":
        gb = r.number("tables_gb", above=0)
        r.finish()
        return ModelSpec(f"{gb:g} GB of tables", gb * GB * scale, fmt, None, None, scale, None, "tables_gb")
    rows = data["table_rows"]
    r.seen.add("table_rows")
    if not isinstance(rows, list) or not rows or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in rows):
        raise ConfigError(f"{where}.table_rows must be a non-empty list of integers >= 1, got {rows!r}")
    sources["model.table_rows"] = r.given.get("table_rows", _FILE)
    dim = r.number("dim", integer=True, minimum=1, maximum=MAX_DIM)
    r.finish()
    rb = row_bytes(fmt, dim)
    return ModelSpec(f"{len(rows)} tables x dim {dim}", float(sum(rows) * rb) * scale, fmt, dim,
                     len(rows), scale, rb, "table_rows")


def _traffic(data, where, sources) -> TrafficSpec:
    r = _Reader(data, where, sources, "traffic")
    out = TrafficSpec(r.number("target_qps", above=0), r.number("sla_p99_us", above=0),
                      r.string("replay_qps", default="ratio", choices=REPLAY_QPS_MODES))
    r.finish()
    return out


def _host(data, where, sources) -> HostSpec:
    r = _Reader(data, where, sources, "host")
    host = HostSpec(
        name=r.string("name", default="host"),
        base_watts=r.number("base_watts", minimum=0),
        base_usd=r.number("base_usd", minimum=0),
        dram_slots=r.number("dram_slots", integer=True, minimum=1, maximum=1024),
        gb_per_dimm=r.number("gb_per_dimm", above=0),
        dram_w_per_gb=r.number("dram_w_per_gb", minimum=0),
        dram_usd_per_gb=r.number("dram_usd_per_gb", minimum=0),
        ssd_slots=r.number("ssd_slots", integer=True, minimum=0, maximum=1024),
        min_dimms=r.number("min_dimms", integer=True, minimum=0, default=1,
                           default_source="default: one DIMM"),
        dram_reserved_gb=r.number("dram_reserved_gb", minimum=0, default=0.0,
                                  default_source="default: no reserved DRAM"),
    )
    r.finish()
    if host.min_dimms > host.dram_slots:
        raise ConfigError(f"{where}.min_dimms {host.min_dimms} exceeds dram_slots {host.dram_slots}")
    if host.table_dram_gb <= 0:
        raise ConfigError(f"{where}.dram_reserved_gb {host.dram_reserved_gb:g} leaves no DRAM for tables "
                          f"(limit: below dram_slots x gb_per_dimm = {host.max_dram_gb:g} GB)")
    return host


def _cost(data, where, sources) -> CostSpec:
    r = _Reader(data, where, sources, "cost")
    out = CostSpec(r.number("usd_per_kwh", minimum=0), r.number("years", minimum=0),
                   r.number("pue", minimum=1.0, maximum=5.0, default=1.0,
                            default_source="default: IT power only (PUE 1)"))
    r.finish()
    return out


def _device(name, data, where, sources) -> DeviceCost:
    if name not in DEVICES:
        raise ConfigError(f"{where}: device {name!r} is not a preset of sdm.DEVICES {sorted(DEVICES)}")
    spec = DEVICES[name]
    r = _Reader(data, where, sources, f"devices.{name}")
    cap = r.number("capacity_gb", above=0, default=spec.capacity_gb,
                   default_source=f"sdm.DEVICES[{name!r}]: {spec.source('capacity_gb') or 'preset'}")
    watts = r.number("watts", minimum=0, default=spec.active_watts,
                     default_source=f"sdm.DEVICES[{name!r}] active_watts: {spec.source('active_watts') or 'preset'}")
    usd = r.number("usd", minimum=0, default=spec.usd_per_gb * cap,
                   default_source=f"sdm.DEVICES[{name!r}] usd_per_gb x capacity_gb: "
                                  f"{spec.source('usd_per_gb') or 'preset'}")
    r.finish()
    return DeviceCost(name, watts, usd, cap)


def _configs(data, where, sources) -> tuple[ConfigSpec, ...]:
    if not isinstance(data, list) or not data or not all(isinstance(c, dict) for c in data):
        raise ConfigError(f"{where} must be a non-empty array of tables ([[configs]])")
    out, names = [], set()
    for i, c in enumerate(data):
        label = c.get("name") if isinstance(c.get("name"), str) else f"[{i}]"
        r = _Reader(c, f"{where}[{i}]", sources, f"configs.{label}")
        name = r.string("name")
        if name in names:
            raise ConfigError(f"{where}[{i}].name {name!r} is used twice")
        names.add(name)
        device = r.string("device", default="") or None
        if device is not None and "device" not in r.given:
            sources[f"configs.{label}.device"] = "a preset of sdm.DEVICES named by the scenario"
        if device is not None and device not in DEVICES:
            raise ConfigError(f"{where}[{i}].device {device!r} is not a preset of sdm.DEVICES {sorted(DEVICES)}")
        replay_name = r.string("replay_name", default=name)
        hierarchy = r.string("hierarchy", default="") or None
        if hierarchy is not None:
            from sdm.store.config import HIERARCHY_PRESETS

            if hierarchy not in HIERARCHY_PRESETS and not hierarchy.endswith(".toml"):
                raise ConfigError(f"{where}[{i}].hierarchy {hierarchy!r} is neither a hierarchy preset "
                                  f"{sorted(HIERARCHY_PRESETS)} nor a .toml file")
        hit = r.number("hit_rate", required=False, minimum=0, maximum=1)
        if device is None:
            for key in ("dram_fraction", "qps_ratio"):
                if key in c:
                    raise ConfigError(f"{where}[{i}].{key} does not apply to the DRAM-only baseline "
                                      f"{name!r} (no device)")
            qph = r.number("qps_per_host", required=False, above=0)
            r.finish()
            if hit is None:
                sources[f"configs.{label}.hit_rate"] = "DRAM-only: every row read is served from DRAM"
            out.append(ConfigSpec(name, None, 1.0, 1.0 if hit is None else hit, None, qph, replay_name,
                                  hierarchy))
            continue
        frac = r.number("dram_fraction", above=0, maximum=1)
        if "qps_ratio" in c and "qps_per_host" in c:
            raise ConfigError(f"{where}[{i}]: give qps_ratio or qps_per_host, not both")
        ratio = r.number("qps_ratio", required=False, above=0)
        qph = r.number("qps_per_host", required=False, above=0)
        r.finish()
        out.append(ConfigSpec(name, device, frac, hit, ratio, qph, replay_name, hierarchy))
    baselines = [c.name for c in out if c.is_baseline]
    if len(baselines) != 1:
        raise ConfigError(f"{where}: exactly one config must have no device (the DRAM-only baseline), "
                          f"got {len(baselines)}: {baselines}")
    return tuple(out)

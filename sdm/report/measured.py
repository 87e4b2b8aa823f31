"""Replay results (``sdm replay`` / ``sdm sweep`` JSON) as inputs of a scenario.

What a result gives a configuration:

* ``hit_rate`` — the first (DRAM cache) tier's ``hits / (hits + misses)``;
* per-host QPS — ``qps_at_sla``. In the scenario's default ``ratio`` mode it enters as a
  ratio to the baseline's replayed QPS, applied to the scenario's baseline ``qps_per_host``
  (the replay's request and model are the replay's, the scenario's traffic its own); the
  ratio is capped at 1, since an SCM host does at least the DRAM host's work. In
  ``absolute`` mode the replayed QPS is the per-host QPS and the target QPS counts the
  replay's requests; in ``scenario`` mode it is not used (the per-host QPS stays the
  scenario's): a replay's QPS at SLA models requests one at a time on one device queue at
  the tier's queue depth, which is a host's QPS only when the replay models that host;
* ``dram_fraction`` — the cache size as a share of the trace's rows, when the replay names
  a trace file that can be read: ``min(capacity_rows, cached_rows) / rows`` (a cache that
  never filled behaves as one just large enough for what it held).

For a scenario with a ``[workload]`` (the shipped ones) a matching result instead takes
the host model's place for that configuration: its ``qps_at_sla`` (the host model's, for the
result's host) and hit rate are the configuration's, ``qps_source = "host-model"``, and the
sensitivity does not re-run it (``sdm run`` feeds its own replays this way, so its power
table uses its replay table's QPS).

A replay applies to the configuration whose ``replay_name`` (default its ``name``) equals
the replay's ``config``; a sweep applies, through its point with policy ``lru`` (else its
first policy) at its largest cache, to every configuration whose device it modeled.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass

from sdm.errors import ConfigError
from sdm.report.scenario import Scenario

__all__ = ["Measured", "load_results", "apply_results"]


@dataclass(frozen=True)
class Measured:
    """One hierarchy's measured figures. ``config``: the replay's config name (None for a
    sweep point, matched by ``device``); ``qps_at_sla``: requests/s (None: the SLA was not
    met); ``sla_us``: the SLA it was measured at; ``dram_fraction``: None when unknown."""

    source: str
    config: str | None
    device: str | None
    hit_rate: float
    qps_at_sla: float | None
    sla_us: float | None
    dram_fraction: float | None
    requests: int | None = None
    lookups: int | None = None
    host: str | None = None            # the host model's host behind qps_at_sla (None: unknown)
    bottleneck: str | None = None


def _num(x):
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _trace_rows(trace, json_path: str) -> int | None:
    if not isinstance(trace, str):
        return None
    from sdm.trace.format import load

    for candidate in (trace, os.path.join(os.path.dirname(os.path.abspath(json_path)), trace)):
        if os.path.isfile(candidate):
            try:
                with load(candidate) as tr:
                    return int(sum(int(x) for x in tr.table_sizes))
            except (OSError, ValueError):
                return None
    return None


def _from_replay(data: dict, path: str) -> list[Measured]:
    tiers = data.get("tiers")
    if not isinstance(tiers, list) or not tiers or not all(isinstance(t, dict) for t in tiers):
        raise ConfigError(f"replay result {path}: 'tiers' must be a non-empty list of tier objects")
    first = tiers[0]
    hits, misses = _num(first.get("hits")), _num(first.get("misses"))
    if hits is None or misses is None:
        raise ConfigError(f"replay result {path}: tiers[0] needs numeric 'hits' and 'misses'")
    hit_rate = hits / (hits + misses) if hits + misses else 0.0
    config = data.get("config")
    if not isinstance(config, str):
        raise ConfigError(f"replay result {path}: 'config' must be the hierarchy's name, got {config!r}")
    fraction = None
    if first.get("kind", first.get("name")) == "cache" and _num(first.get("capacity_rows")):
        rows = _trace_rows(data.get("trace"), path)
        held = _num(first.get("capacity_rows"))
        if _num(first.get("cached_rows")) is not None:
            held = min(held, _num(first["cached_rows"]))
        if rows:
            fraction = max(held, 1.0) / rows
    elif len(tiers) == 1:
        fraction = 1.0
    device = tiers[-1].get("device") if len(tiers) > 1 else None
    host = data.get("host") if isinstance(data.get("host"), str) else None
    sla = data.get("sla") if isinstance(data.get("sla"), dict) else {}
    bottleneck = sla.get("bottleneck") if isinstance(sla.get("bottleneck"), str) else None
    return [Measured(f"replay {os.path.basename(path)}", config, device, hit_rate,
                     _num(data.get("qps_at_sla")), _num(data.get("sla_us")), fraction,
                     data.get("requests"), data.get("lookups"), host, bottleneck)]


def _from_sweep(data: dict, path: str) -> list[Measured]:
    points = data.get("points")
    if not isinstance(points, list) or not points or not all(isinstance(p, dict) for p in points):
        raise ConfigError(f"sweep result {path}: 'points' must be a non-empty list")
    policies = [p.get("policy") for p in points if p.get("policy") != "belady"]
    if not policies:
        raise ConfigError(f"sweep result {path}: no point with a policy other than belady")
    policy = "lru" if "lru" in policies else policies[0]
    mine = [p for p in points if p.get("policy") == policy and _num(p.get("cache_bytes"))]
    if not mine:
        raise ConfigError(f"sweep result {path}: points need numeric 'cache_bytes'")
    point = max(mine, key=lambda p: p["cache_bytes"])
    hits, misses = _num(point.get("hits")) or 0.0, _num(point.get("misses")) or 0.0
    rows = _trace_rows(data.get("trace"), path)
    held = _num(point.get("capacity_rows"))
    fraction = min(1.0, held / rows) if rows and held else None
    devices = point.get("devices")
    if not isinstance(devices, dict):
        raise ConfigError(f"sweep result {path}: a point's 'devices' must map device names to results")
    src = f"sweep {os.path.basename(path)} ({policy}, {int(point['cache_bytes'])} B cache)"
    return [Measured(src, None, name, hits / (hits + misses) if hits + misses else 0.0,
                     _num(entry.get("qps_at_sla")) if isinstance(entry, dict) else None,
                     _num(data.get("sla_us")), fraction, data.get("requests"), data.get("lookups"))
            for name, entry in devices.items()]


def load_results(paths) -> list[Measured]:
    """Read ``sdm replay --json`` and ``sdm sweep --json`` files, ``(label, dict)`` pairs
    of already-parsed results, or result objects with ``to_json()``
    (:class:`sdm.replay.live.ReplayResult`, :class:`sdm.replay.sweep.SweepResult`). Raises ConfigError naming a file that is
    missing, not JSON, or lacks the keys used."""
    out: list[Measured] = []
    for item in paths:
        if isinstance(item, tuple):
            label, data = item
        elif hasattr(item, "to_json"):  # a ReplayResult / SweepResult of this process
            data = item.to_json()
            label = f"{data.get('config') or 'sweep'} (in-process result)"
        elif not isinstance(item, (str, os.PathLike)):
            raise ConfigError(f"a replay result must be a JSON file path, a (label, dict) pair or a "
                              f"result object, got {type(item).__name__}")
        else:
            label = os.fspath(item)
            try:
                with open(label) as f:
                    data = json.load(f)
            except FileNotFoundError:
                raise ConfigError(f"replay result {label!r} does not exist") from None
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"replay result {label!r} cannot be read: {exc}") from None
            except json.JSONDecodeError as exc:
                raise ConfigError(f"replay result {label!r} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"replay result {label!r} must be a JSON object, got {type(data).__name__}")
        if "points" in data:
            out.extend(_from_sweep(data, label))
        elif "tiers" in data:
            out.extend(_from_replay(data, label))
        else:
            raise ConfigError(f"replay result {label!r} is neither an `sdm replay` result (no 'tiers') "
                              f"nor an `sdm sweep` result (no 'points')")
    return out


def apply_results(scenario: Scenario, results: list[Measured]) -> Scenario:
    """``scenario`` with the figures of ``results`` in place of its own, each recorded in
    the scenario's sources, and a note for every result no configuration took, every SLA
    that differs from the scenario's and every capped or missing ratio."""
    if not results:
        return scenario
    sources = dict(scenario.sources)
    notes = list(scenario.notes)
    by_config = {m.config: m for m in results if m.config is not None}
    by_device = {m.device: m for m in results if m.config is None}
    used: set[int] = set()

    def match(c):
        m = by_config.get(c.replay_name)
        if m is None and c.device is not None:
            m = by_device.get(c.device)
        if m is not None:
            used.add(id(m))
        return m

    matched = {c.name: match(c) for c in scenario.configs}
    if scenario.workload is not None:
        return _apply_measured(scenario, results, matched, used, sources, notes)
    base = scenario.baseline
    base_m = matched[base.name]
    absolute = scenario.traffic.replay_qps == "absolute"
    qps_from_replay = scenario.traffic.replay_qps != "scenario"
    if not qps_from_replay:
        notes.append("per-host QPS is the scenario's (traffic.replay_qps = \"scenario\"): replays "
                     "give hit rates and cache shares only")
    sla = scenario.traffic.sla_p99_us
    configs = []
    for c in scenario.configs:
        m = matched[c.name]
        if m is None:
            configs.append(c)
            continue
        key = f"configs.{c.name}"
        changes = {"hit_rate": m.hit_rate}
        sources[f"{key}.hit_rate"] = f"{m.source}: tiers[0] hits / (hits + misses)"
        if m.sla_us is not None and abs(m.sla_us - sla) > 1e-6 * sla:
            notes.append(f"{c.name}: {m.source} was measured at a p99 SLA of {m.sla_us:g} us, "
                         f"the scenario asks {sla:g} us")
        if m.dram_fraction is not None and not c.is_baseline:
            changes["dram_fraction"] = min(1.0, m.dram_fraction)
            sources[f"{key}.dram_fraction"] = (f"{m.source}: DRAM cache rows / trace rows "
                                               f"(cache size the hit rate was measured at)")
        elif not c.is_baseline:
            notes.append(f"{c.name}: {m.source} does not tell the cache's share of the rows "
                         f"(no readable trace); dram_fraction stays the scenario's")
        qps = m.qps_at_sla
        if not qps_from_replay:
            pass
        elif absolute:
            changes["qps_per_host"] = qps if qps is not None else 0.0
            if not c.is_baseline:
                changes["qps_ratio"] = None
            sources[f"{key}.qps_per_host"] = f"{m.source}: qps_at_sla (absolute mode)"
        elif not c.is_baseline:
            if base_m is None or not base_m.qps_at_sla:
                notes.append(f"{c.name}: no replay of the baseline {base.name!r} with a QPS to take a "
                             f"ratio to; per-host QPS stays the scenario's")
            else:
                ratio = 0.0 if qps is None else qps / base_m.qps_at_sla
                if ratio > 1.0:
                    notes.append(f"{c.name}: replayed QPS {qps:.4g}/s is {ratio:.3g}x the baseline's "
                                 f"{base_m.qps_at_sla:.4g}/s; capped at 1x (an SCM host does at least "
                                 f"the DRAM host's work)")
                    ratio = 1.0
                if qps is None:
                    notes.append(f"{c.name}: {m.source} met no request rate within its SLA")
                changes["qps_ratio"] = ratio
                changes["qps_per_host"] = None
                sources[f"{key}.qps_ratio"] = (f"{m.source}: qps_at_sla / {base_m.source}'s "
                                               f"(capped at 1)")
        configs.append(dataclasses.replace(c, **changes))
    return _finished(scenario, configs, results, used, sources, notes)


def _finished(scenario, configs, results, used, sources, notes) -> Scenario:
    """``scenario`` with ``configs``, ``sources`` and ``notes``, noting each result no
    configuration used."""
    for m in results:
        if id(m) not in used:
            what = f"config {m.config!r}" if m.config is not None else f"device {m.device!r}"
            notes.append(f"{m.source}: {what} matches no configuration of scenario {scenario.name!r}; unused")
    return dataclasses.replace(scenario, configs=tuple(configs), sources=tuple(sorted(sources.items())),
                               notes=tuple(notes))


def _apply_measured(scenario, results, matched, used, sources, notes) -> Scenario:
    """A scenario with a workload: a matching result's QPS at the SLA (the host model's for
    the result's host) and hit rate replace the host-model run, as measured figures."""
    sla = scenario.traffic.sla_p99_us
    configs = []
    for c in scenario.configs:
        m = matched[c.name]
        if m is None or c.has_override:
            configs.append(c)
            continue
        key = f"configs.{c.name}"
        host = m.host or "an unnamed host"
        changes = {"hit_rate": m.hit_rate, "qps_per_host": m.qps_at_sla if m.qps_at_sla is not None else 0.0,
                   "qps_ratio": None, "qps_source": "host-model" if m.host else "override",
                   "bottleneck": m.bottleneck, "measured_by": m.source}
        sources[f"{key}.hit_rate"] = f"{m.source}: tiers[0] hits / (hits + misses)"
        sources[f"{key}.qps_per_host"] = f"{m.source}: qps_at_sla, the host model's for host {host}"
        if m.dram_fraction is not None and not c.is_baseline:
            changes["dram_fraction"] = min(1.0, m.dram_fraction)
            sources[f"{key}.dram_fraction"] = (f"{m.source}: DRAM cache rows / trace rows "
                                               f"(cache size the hit rate was measured at)")
        if m.sla_us is not None and abs(m.sla_us - sla) > 1e-6 * sla:
            notes.append(f"{c.name}: {m.source} was measured at a p99 SLA of {m.sla_us:g} us, "
                         f"the scenario asks {sla:g} us")
        notes.append(f"{c.name}: per-host QPS and hit rate from {m.source} (host {host}), in place of the "
                     f"host model on the scenario's workload ({scenario.workload.describe()}); the "
                     f"sensitivity's host-model inputs do not move it")
        configs.append(dataclasses.replace(c, **changes))
    return _finished(scenario, configs, results, used, sources, notes)

"""Build a report: scenarios and measured results through the fleet model into files."""

from __future__ import annotations

import math
import os
from pathlib import Path

from sdm.errors import ConfigError
import sdm.report.sensitivity as _sensitivity_module
from sdm.report import fleet as _fleet
from sdm.report.fleet import (PAPER_SAVINGS_RANGE, ConfigResult, ScenarioResult, evaluate,
                              paper_position, with_model_scale)
from sdm.report.cache import ResultCache
from sdm.report.measure import HostRun, Measurer
from sdm.report.measured import Measured, apply_results, load_results
from sdm.report.scenario import Scenario, load_scenario, scenario_from_dict
from sdm.report.sensitivity import HOST_INPUTS, INPUTS, sensitivity

__all__ = ["write_report", "build_report", "load_scenario", "scenario_from_dict", "evaluate",
           "sensitivity", "load_results", "apply_results", "Scenario", "ScenarioResult",
           "ConfigResult", "Measured", "SCENARIO_DIR", "shipped_scenarios", "PAPER_SAVINGS_RANGE",
           "ResultCache", "Measurer", "HostRun", "explain"]

#: The repository's shipped scenarios (``scenarios/*.toml``).
SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios"
# Model sizes of the savings-versus-size curve: the scenario's tables x 2^k, k in [-3, 4].
_SIZE_FACTORS = tuple(2.0 ** (k / 2) for k in range(-6, 9))


def shipped_scenarios() -> list[str]:
    """Paths of the shipped ``scenarios/*.toml`` (empty for an installed package)."""
    return sorted(str(p) for p in SCENARIO_DIR.glob("*.toml")) if SCENARIO_DIR.is_dir() else []


def _why(base: ConfigResult, r: ConfigResult, s: Scenario) -> str:
    if not r.feasible:
        return f"It cannot serve: {r.infeasible}."
    if not base.feasible:
        return f"The DRAM-only baseline cannot serve: {base.infeasible}."
    bits = []
    if r.hosts < base.hosts:
        if base.hosts_per_replica > base.hosts_for_qps:
            held = (f"{base.hosts_per_replica} hosts per replica to hold {s.model.table_gb:,.0f} GB of "
                    f"tables, while the traffic needs {base.hosts_for_qps}")
        else:
            held = (f"replicas of {base.hosts_per_replica} hosts, to hold {s.model.table_gb:,.0f} GB of "
                    f"tables, round the {base.hosts_for_qps} hosts the traffic needs up to {base.hosts}")
        bits.append(f"SCM removes {base.hosts - r.hosts} of {base.hosts} hosts: DRAM-only is {base.regime} "
                    f"({held}); with {r.device} a replica needs {r.hosts_per_replica} and the fleet "
                    f"{r.hosts} ({r.regime})")
    elif r.hosts > base.hosts:
        why = (f"each serves {r.qps_per_host:,.4g} requests/s against the DRAM host's {base.qps_per_host:,.4g}"
               if r.qps_per_host < base.qps_per_host else f"a replica needs {r.hosts_per_replica} hosts")
        bits.append(f"SCM adds {r.hosts - base.hosts} hosts to the {base.hosts} of DRAM-only: {why}")
    else:
        bits.append(f"Both fleets have {r.hosts} hosts ({r.regime}), so SCM can only trim each host")
    bw, rw = base.watts_per_host, r.watts_per_host
    if r.dram_gb_per_host < base.dram_gb_per_host:
        dram = (f"per host DRAM goes from {base.dram_gb_per_host:,.0f} to {r.dram_gb_per_host:,.0f} GB "
                f"({bw['dram']:,.0f} -> {rw['dram']:,.0f} W)")
    else:
        dram = (f"per host DRAM stays at {r.dram_gb_per_host:,.0f} GB"
                + (f" (the host's minimum of {s.host.min_dimms} DIMMs)"
                   if r.dimms_per_host == s.host.min_dimms else "")
                + (f", against {base.dram_gb_per_host:,.0f} GB DRAM-only"
                   if r.dram_gb_per_host != base.dram_gb_per_host else ""))
    bits.append(f"{dram}, and {r.scm_devices_per_host} x {r.device} add {rw['scm']:,.0f} W: a host draws "
                f"{sum(rw.values()):,.0f} W against {sum(bw.values()):,.0f} W")
    pos = paper_position(r.savings_vs_dram)
    share = bw["dram"] / sum(bw.values()) if sum(bw.values()) else 0.0
    if pos == "above":
        bits.append("above the paper's range because removing whole hosts saves their base power too"
                    if r.hosts < base.hosts else
                    f"above the paper's range because DRAM is {share:.0%} of a DRAM-only host's power")
    elif pos == "within":
        bits.append("within the paper's range: " + (
            "SCM removes some hosts but not most" if r.hosts < base.hosts else
            f"DRAM is {share:.0%} of a DRAM-only host's power and SCM trims part of it"))
    elif r.dram_gb_per_host >= base.dram_gb_per_host and r.hosts >= base.hosts:
        bits.append("below the paper's range because the tables already fit the DRAM a host carries anyway: "
                    "the SCM devices only add power")
    elif r.hosts > base.hosts:
        bits.append("below the paper's range because the extra hosts cost more than the trimmed DRAM saves")
    else:
        bits.append(f"below the paper's range because DRAM is only {share:.0%} of a DRAM-only host's power")
    return "; ".join(bits) + "."


def _summary_line(sr: ScenarioResult) -> str:
    parts = []
    for r in sr.configs:
        if r.device is None:
            continue
        parts.append(f"{r.name} {('n/a' if r.savings_vs_dram is None else f'{100 * r.savings_vs_dram:+.1f}%')} "
                     f"({paper_position(r.savings_vs_dram)})")
    return f"{sr.scenario.name}: " + ", ".join(parts)


_MODEL_TEXT = (_fleet.__doc__ or "").strip() + "\n\nSensitivity: " + (_sensitivity_module.__doc__ or "").strip()


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def _asks(s: Scenario) -> int:
    """Host-model runs one choosing resolve of ``s`` asks for: one per count tried."""
    return sum(max(1, len(_fleet.scm_device_counts(s, c))) for c in s.configs if not c.has_override)


def _runs_per_scenario(s: Scenario) -> int:
    """Host-model runs :func:`build_report` asks for ``s`` (the progress bar's total; a run
    asked again is read from memory)."""
    if s.workload is None:
        return 0
    measured = sum(1 for c in s.configs if not c.has_override)
    scm = sum(1 for c in s.configs if not c.is_baseline)
    # the nominal choice (every count tried), the sensitivity's nominal and its two ends per input
    # and two corners per SCM config (at the chosen counts), and the model-size curve's choices
    return (_asks(s) + measured * (1 + 2 * len(INPUTS) + 2 * scm)
            + sum(_asks(with_model_scale(s, f)) for f in _SIZE_FACTORS))


def explain(sr: ScenarioResult, sens, runs: dict) -> list[dict]:
    """Per SCM configuration: what bounds its host count and the DRAM-only one's, and which
    input moves its savings most (of all, and of those the host model measures)."""
    base = sr.baseline
    out = []
    for r in sr.configs:
        if r.device is None:
            continue
        rows = [x for x in sens.rows if x.config == r.name and x.input in HOST_INPUTS
                and x.low is not None and x.high is not None]
        top = max(rows, key=lambda x: abs(x.high - x.low), default=None)
        texts = []
        for c in (base, r):
            run = runs.get(c.name)
            if c.bound == "capacity":
                why = (f"capacity: {c.hosts_per_replica} host(s) per replica hold the rows, more than the "
                       f"{c.hosts_for_qps} the traffic needs at {c.qps_per_host:,.4g} requests/s per host")
            elif c.bound == "sla":
                why = ("the SLA: " + (run.reason if run is not None else "no request rate meets it"))
            else:
                why = (f"QPS: {c.hosts_for_qps} host(s) at {c.qps_per_host:,.4g} requests/s each serve the "
                       f"target; the host is limited by {c.bottleneck or 'its typed QPS (override)'}")
            texts.append(f"{c.name}: {why}")
        largest = sens.largest.get(r.name, {})
        choice = r.scm_devices_choice
        devices_text = (choice["reason"] if choice else
                        None if r.scm_devices_per_host is None else
                        f"{r.scm_devices_per_host} x {r.device}: what holding the rows needs (not chosen: "
                        f"{'a typed or replayed QPS' if r.qps_source == 'override' or not runs.get(r.name) else 'no count to choose'})")
        out.append({"config": r.name, "bound": r.bound, "baseline_bound": base.bound, "bound_text": texts,
                    "scm_devices_per_host": r.scm_devices_per_host, "scm_devices_text": devices_text,
                    "largest_input": largest.get("input"), "largest_label": largest.get("label"),
                    "largest_spread": largest.get("spread"),
                    "largest_measured_input": None if top is None else top.input,
                    "largest_measured_label": None if top is None else top.label,
                    "largest_measured_spread": None if top is None else abs(top.high - top.low)})
    return out


def build_report(scenarios, results=(), *, measurer: Measurer | None = None, cache: ResultCache | None = None,
                 progress: bool | None = None) -> dict:
    """The report as a JSON-ready dict: ``scenarios`` (each with ``name``, ``configs`` —
    ``name``, ``hosts``, ``power_watts`` (W), ``cost_usd`` (capital + operating),
    ``savings_vs_dram`` (power, a fraction), ``qps_per_host``, ``qps_source``
    (``host-model`` / ``override``), ``hit_rate``, ``bound`` and the rest of
    :class:`~sdm.report.fleet.ConfigResult` —, ``inputs`` with sources, ``sensitivity``,
    ``explain``, ``host_runs`` (curves), ``miss_ratio_curves``, ``paper`` positions,
    ``model_size_curve``), ``replays`` and texts.

    Args:
        scenarios: :class:`Scenario` objects or paths of scenario TOML files.
        results: :class:`Measured` objects (:func:`load_results`) applied to every scenario.
        measurer: runs the host model (default: one over ``cache``, closed at the end).
        cache: the result cache (default :class:`ResultCache` in its default directory).
        progress: a progress bar over the host-model runs (None: on a terminal only).
    """
    from sdm.progress import progress_bar

    results = list(results)
    loaded = [item if isinstance(item, Scenario) else load_scenario(item) for item in scenarios]
    own = measurer is None
    total = sum(_runs_per_scenario(s) for s in loaded)
    bar = progress_bar(total=total, desc="sdm report: host-model runs", unit="run",
                       show=False if total == 0 else progress)
    if own:
        measurer = Measurer(cache if cache is not None else ResultCache(), progress=bar)
    elif measurer.progress is None:
        measurer.progress = bar
    out = []
    try:
        for s in loaded:
            out.append(_scenario_report(apply_results(s, results), measurer))
    finally:
        bar.close()
        if own:
            measurer.close()
    lo, hi = PAPER_SAVINGS_RANGE
    stats = {"computed_runs": measurer.computed, "computed_seconds": measurer.seconds,
             "cache_hits": measurer.cache.hits, "cache_dir": str(measurer.cache.root) if measurer.cache.enabled
             else None}
    summary = (f"Power savings of DRAM + SCM fleets against DRAM-only, set beside the SDM paper's "
               f"{lo:.0%}-{hi:.0%} (Ardestani et al., arXiv 2110.11489). "
               + "; ".join(sc["summary"] for sc in out) + ".")
    from sdm import __version__

    return _json_safe({
        "title": "sdm power and cost report", "estimate": True, "generated_by": f"sdm {__version__}",
        "paper_savings_range": [lo, hi], "summary": summary,
        "sensitivity_inputs": dict(INPUTS),
        "replays": [{"source": m.source, "config": m.config, "device": m.device, "hit_rate": m.hit_rate,
                     "qps_at_sla": m.qps_at_sla, "sla_us": m.sla_us, "dram_fraction": m.dram_fraction}
                    for m in results],
        "scenarios": out, "model_text": _MODEL_TEXT, "host_model": stats,
    })


def _scenario_report(s: Scenario, measurer: Measurer) -> dict:
    resolved, runs = measurer.resolve(s, curve=True)
    sr = evaluate(resolved)
    base = sr.baseline
    chosen = {c.name: c.scm_devices for c in resolved.configs if c.scm_devices_choice is not None}
    sens = sensitivity(s, lambda sc, f: measurer.resolve(sc, f, scm_devices=chosen)[0])
    curve = {"scale": list(_SIZE_FACTORS), "table_gb": [s.model.table_gb * f for f in _SIZE_FACTORS],
             "savings": {c.name: [] for c in s.configs if not c.is_baseline},
             "scm_devices_per_host": {c.name: [] for c in s.configs if not c.is_baseline},
             "qps_per_host": {c.name: [] for c in s.configs},
             "note": ("Each model size is a fleet of its own: the host model is run for its SCM devices "
                      "per host, chosen as for the scenario (the capacity need up to the slots); the "
                      "workload, cache share and every other input are the scenario's.")
             if s.workload is not None else
             "Per-host QPS typed in the scenario, the same at every model size."}
    for f in _SIZE_FACTORS:
        for r in evaluate(measurer.resolve(with_model_scale(s, f), curve=True)[0]).configs:
            curve["qps_per_host"][r.name].append(r.qps_per_host)
            if r.name in curve["savings"]:
                curve["savings"][r.name].append(r.savings_vs_dram)
                curve["scm_devices_per_host"][r.name].append(r.scm_devices_per_host)
    sens_note = (f"Low/high: the savings with the input at x(1 - {sens.percent:g}%) / x(1 + {sens.percent:g}%); "
                 "the host-model inputs re-run sdm.host and the fleet takes the QPS and hit rate it gives, "
                 "each SCM configuration at the devices per host chosen for the nominal inputs (not chosen "
                 "again per point: a favourable end may understate what a new choice would save). "
                 "REFERENCES.md gives DRAM at 0.05-0.4 W/GB, a wider span than this; the corners row "
                 "sets every input at its unfavourable, then its favourable end at once.")
    typed = [c.name for c in resolved.configs if c.qps_source == "override" or c.measured_by is not None]
    if typed:
        sens_note += f" Not re-run (typed or replayed figures): {', '.join(typed)}."
    mrcs = {}
    if s.workload is not None:
        for c in resolved.configs:
            if not c.is_baseline and c.name in runs:
                mrcs[c.name] = {**measurer.miss_ratio_curve(resolved, c), "hit_rate": runs[c.name].hit_rate}
    return {
        "name": s.name, "description": s.description, "path": s.path,
        "model_gb": s.model.table_gb, "target_qps": s.traffic.target_qps, "sla_us": s.traffic.sla_p99_us,
        "workload": None if s.workload is None else s.workload.describe(),
        "configs": [c.to_json() for c in sr.configs],
        "paper": [{"config": r.name, "savings": r.savings_vs_dram, "position": paper_position(r.savings_vs_dram),
                   "why": _why(base, r, resolved)} for r in sr.configs if r.device is not None],
        "explain": explain(sr, sens, runs),
        "host_runs": {name: run.to_json() for name, run in runs.items()},
        "miss_ratio_curves": mrcs,
        "sensitivity": sens.to_json(), "sensitivity_note": sens_note,
        "model_size_curve": curve, "inputs": resolved.inputs(), "notes": list(resolved.notes),
        "summary": _summary_line(sr),
    }


def write_report(scenarios=None, replays=(), out_dir="report", *, plots: bool = True,
                 cache: ResultCache | None = None, progress: bool | None = None) -> dict:
    """Compute the report and write ``report.md``, ``report.html``, ``report.json`` and the
    PNG plots into ``out_dir`` (created when missing).

    Args:
        scenarios: one scenario (path, :class:`Scenario`) or a list of them; None: the
            shipped ``scenarios/*.toml``.
        replays: ``sdm replay --json`` / ``sdm sweep --json`` result files, ``(label, dict)``
            pairs, or ``ReplayResult`` / ``SweepResult`` objects; applied to every scenario.
        out_dir: the output directory.
        plots: draw the PNGs.
        cache, progress: as :func:`build_report`.

    Returns:
        The report dict (as ``report.json``), with ``files``: the paths written.

    Raises:
        ConfigError: a bad scenario or replay file (the message names the field), or an
        output directory that cannot be written.
    """
    from sdm.report import render

    if scenarios is None:
        scenarios = shipped_scenarios()
        if not scenarios:
            raise ConfigError(f"no scenario given and no shipped scenarios at {SCENARIO_DIR}")
    elif isinstance(scenarios, (str, os.PathLike, Scenario)):
        scenarios = [scenarios]
    scenarios = list(scenarios)
    if not scenarios:
        raise ConfigError("give at least one scenario")
    # every input is read and checked before anything is written
    scenarios = [item if isinstance(item, Scenario) else load_scenario(item) for item in scenarios]
    results = load_results(replays)
    out_dir = os.fspath(out_dir)
    try:  # before the host-model runs, which can take minutes
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create output directory {out_dir!r}: {exc.strerror}") from None
    report = build_report(scenarios, results, cache=cache, progress=progress)
    images = {}
    if plots:
        report["plots"] = render.plot_all(report, out_dir)
        for name in report["plots"].values():
            with open(os.path.join(out_dir, name), "rb") as f:
                images[name] = f.read()
    written = []
    for name, text in (("report.md", render.markdown(report)), ("report.html", render.html_page(report, images)),
                       ("report.json", render.json_text(report))):
        path = os.path.join(out_dir, name)
        tmp = path + ".tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except OSError as exc:
            raise ConfigError(f"cannot write {path!r}: {exc.strerror}") from None
        written.append(path)
    report["files"] = written + [os.path.join(out_dir, n) for n in report.get("plots", {}).values()]
    return report

"""Power and cost reports: hosts, watts and dollars of DRAM-only versus DRAM + SCM fleets.

``write_report(scenarios, replays, out_dir)`` reads scenario TOML files
(:mod:`sdm.report.scenario`), runs the host model on each scenario's workload for every
configuration's per-host QPS and hit rate (:mod:`sdm.report.measure`, cached by
:mod:`sdm.report.cache`), or takes them from ``sdm replay`` / ``sdm sweep`` JSON results when
given (:mod:`sdm.report.measured`), runs the fleet model
(:mod:`sdm.report.fleet`) and its sensitivity analysis (:mod:`sdm.report.sensitivity`),
and writes ``report.md``, ``report.html``, ``report.json`` and PNG plots
(:mod:`sdm.report.render`) into ``out_dir``. Every figure is a model estimate.
"""

from sdm.report.build import (PAPER_SAVINGS_RANGE, SCENARIO_DIR, ConfigResult, HostRun, Measured, Measurer,
                              ResultCache, Scenario, ScenarioResult, apply_results, build_report, evaluate,
                              load_results, load_scenario, scenario_from_dict, sensitivity,
                              shipped_scenarios, write_report)

__all__ = ["write_report", "build_report", "load_scenario", "scenario_from_dict", "evaluate",
           "sensitivity", "load_results", "apply_results", "Scenario", "ScenarioResult",
           "ConfigResult", "Measured", "SCENARIO_DIR", "shipped_scenarios", "PAPER_SAVINGS_RANGE",
           "ResultCache", "Measurer", "HostRun"]

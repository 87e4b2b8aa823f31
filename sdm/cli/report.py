"""``sdm report``: hosts, watts and dollars of DRAM-only versus DRAM + SCM fleets."""

from __future__ import annotations

import os
import sys


def register(sub) -> None:
    p = sub.add_parser(
        "report", help="power and cost report: hosts, watts and dollars per hierarchy (model estimate)",
        description="Run the fleet model of one or more scenario files (TOML; see scenarios/README.md) "
                    "and write report.md, report.html (self-contained), report.json and PNG plots. "
                    "A scenario's [workload] is served by the host model (sdm host) for every "
                    "configuration: per-host QPS at the SLA and hit rate, cached by a digest of their "
                    "inputs. Replay results (sdm replay --json / sdm sweep --json) take their place "
                    "where given; a QPS typed in the scenario is an override.")
    p.add_argument("--scenario", action="append", metavar="FILE",
                   help="scenario TOML file (repeatable; default: the shipped scenarios/*.toml)")
    p.add_argument("--replay", nargs="+", action="extend", default=[], metavar="JSON",
                   help="sdm replay / sdm sweep JSON results to take hit rates and QPS from")
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="where host-model results are cached by a digest of their inputs (default: "
                        "$SDM_CACHE_DIR, else $XDG_CACHE_HOME/sdm, else ~/.cache/sdm; its report/ subdirectory)")
    p.add_argument("--no-cache", action="store_true", help="run the host model again for every result")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--json", action="store_true", help="print report.json to stdout instead of the summary")
    p.set_defaults(func=_report)


def _report(args) -> int:
    import json

    import time

    from sdm.report import ResultCache, write_report

    start = time.perf_counter()
    cache = ResultCache(None if args.cache_dir is None else os.path.join(args.cache_dir, "report"),
                        enabled=not args.no_cache)
    report = write_report(args.scenario, args.replay, args.out, plots=not args.no_plots, cache=cache,
                          progress=True)
    took = time.perf_counter() - start
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "model_text"}, indent=1))
        return 0
    print("Model estimate (sdm.report.fleet), power savings versus DRAM-only; paper: 5%-29%")
    for sc in report["scenarios"]:
        for c in sc["configs"]:
            saving = "baseline" if c["device"] is None else (
                "n/a" if c["savings_vs_dram"] is None else f"{100 * c['savings_vs_dram']:+.1f}%")
            power = "n/a" if c["power_watts"] is None else f"{c['power_watts'] / 1e3:,.1f} kW"
            hosts = "n/a" if c["hosts"] is None else f"{c['hosts']:,}"
            qps = "n/a" if c["qps_per_host"] is None else f"{c['qps_per_host']:,.4g}/s"
            print(f"  {sc['name']:<22} {c['name']:<12} {c['regime']:<15} QPS/host {qps:>9} ({c['qps_source']}) "
                  f"hosts {hosts:>7}  power {power:>11}  savings {saving}")
    if report.get("plot_note"):
        print(report["plot_note"], file=sys.stderr)
    hm = report["host_model"]
    print(f"host model: {hm['computed_runs']} run(s) computed ({hm['computed_seconds']:.1f} s), "
          f"{hm['cache_hits']} read from the cache ({hm['cache_dir'] or 'disabled'}); {took:.1f} s in all",
          file=sys.stderr)
    print(f"wrote {', '.join(report['files'])}", file=sys.stderr)
    return 0

"""``sdm report``: hosts, watts and dollars of DRAM-only versus DRAM + SCM fleets."""

from __future__ import annotations

import sys


def register(sub) -> None:
    p = sub.add_parser(
        "report", help="power and cost report: hosts, watts and dollars per hierarchy (model estimate)",
        description="Run the fleet model of one or more scenario files (TOML; see scenarios/README.md) "
                    "and write report.md, report.html (self-contained), report.json and PNG plots. "
                    "Replay results (sdm replay --json / sdm sweep --json) give hit rates and per-host "
                    "QPS; without them the scenario's own figures are used.")
    p.add_argument("--scenario", action="append", metavar="FILE",
                   help="scenario TOML file (repeatable; default: the shipped scenarios/*.toml)")
    p.add_argument("--replay", nargs="+", action="extend", default=[], metavar="JSON",
                   help="sdm replay / sdm sweep JSON results to take hit rates and QPS from")
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--json", action="store_true", help="print report.json to stdout instead of the summary")
    p.set_defaults(func=_report)


def _report(args) -> int:
    import json

    from sdm.report import write_report

    report = write_report(args.scenario, args.replay, args.out, plots=not args.no_plots)
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
            print(f"  {sc['name']:<22} {c['name']:<12} {c['regime']:<15} hosts {hosts:>7}  "
                  f"power {power:>11}  savings {saving}")
    if report.get("plot_note"):
        print(report["plot_note"], file=sys.stderr)
    print(f"wrote {', '.join(report['files'])}", file=sys.stderr)
    return 0

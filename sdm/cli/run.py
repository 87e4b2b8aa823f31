"""``sdm run``: the project's main job on an embedded default (what ``make run`` calls)."""

from __future__ import annotations

import json
import os

from sdm.cli import make_output_dir
from sdm.replay.demo import DEMO_PRESETS, run_demo
from sdm.report import write_report


def register(sub) -> None:
    p = sub.add_parser("run", help="replay the bundled trace through dram, sdm-nand and sdm-3dxp",
                       description="Replay the bundled trace (traces/default.npz) through each "
                                   "hierarchy preset over one generated store and compare "
                                   "replay speed, hit rate, modeled latency, QPS at the SLA, "
                                   "blocks read and read amplification.")
    p.add_argument("--presets", nargs="+", default=list(DEMO_PRESETS), help="hierarchy presets to compare")
    p.add_argument("--trace", help="another trace file to replay")
    p.add_argument("--batches", type=int, help="replay at most this many batches")
    p.add_argument("--dim", type=int, default=64, help="columns per row (default 64)")
    p.add_argument("--sla-us", type=float, default=30_000.0, help="p99 SLA in microseconds (default 30000)")
    p.add_argument("--host", default="this-machine",
                   help="the host whose QPS at the SLA is reported (sdm host; default this-machine)")
    p.add_argument("--report", default="report", metavar="DIR",
                   help="write the power/cost report of the shipped scenarios, fed with these "
                        "replays, into DIR (default: report)")
    p.add_argument("--no-report", action="store_true", help="skip the power/cost report")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from sdm.host import attach_host
    from sdm.replay.render import comparison_table, plural, request_text

    def on_host(result, trace, store, preset):
        attach_host(result, trace, preset, store, host=args.host, sla_us=args.sla_us)

    if not args.no_report:  # the report's directory before the replays, not after them
        make_output_dir(args.report)
    runs = run_demo(tuple(args.presets), trace=args.trace, dim=args.dim, sla_us=args.sla_us,
                    max_batches=args.batches, progress=True, each=on_host)
    digests = [r.extra["checksum"] for r in runs]  # SHA-256 of each run's pooled bytes
    same = len(set(digests)) == 1
    # the runs' own figures for every configuration they match: the host model is not run again
    report = None if args.no_report else write_report(None, runs, args.report)
    if args.json:
        out = {"runs": [r.to_json() for r in runs], "identical": same, "pooled_sha256": digests}
        if report is not None:
            out["report"] = report["files"]
        print(json.dumps(out, indent=1))
        return 0 if same else 1
    r0 = runs[0]
    per = r0.samples / max(1, r0.requests)
    print(f"sdm run: {os.path.basename(r0.trace)}, {plural(r0.batches, 'batch')}, "
          f"{plural(r0.requests, 'request')} of {per:,.{0 if per == int(per) else 1}f} samples"
          f"{'' if per == int(per) else ' on average'}, {plural(r0.lookups, 'lookup')}; rows dim {r0.dim} "
          f"{r0.fmt}; SLA p99 <= {args.sla_us / 1e3:g} ms\n")
    print(comparison_table(runs))
    print("\nlookups/s: wall-clock replay speed (the first request of a fresh open also pays the store's "
          "setup: SCM row-file checks, cache slot first touches); latency: modeled device time per request "
          f"(a request = {request_text(r0.request_definition)}); QPS at SLA: the host model's for host "
          f"{runs[0].host} (sdm host: the warm trace's requests as Poisson traffic on its cores and devices).")
    if same:
        print(f"pooled results identical across presets: yes (SHA-256 of the pooled bytes "
              f"{runs[0].extra['checksum'][:16]}...)")
    else:
        print("pooled results identical across presets: NO (SHA-256 of the pooled bytes: "
              + ", ".join(f"{r.config} {d[:16]}..." for r, d in zip(runs, digests)) + ")")
    if report is not None:
        print(f"\nPower and cost (a model estimate: the shipped scenarios' fleets with each configuration's "
              f"per-host QPS and hit rate from the table above, host {r0.host}; every input and its source in "
              f"{os.path.join(args.report, 'report.md')}; `sdm report` runs each scenario's own workload "
              f"and host instead):\n")
        print(savings_table(report))
    return 0 if same else 1


def savings_table(report: dict) -> str:
    """Per scenario and configuration: the per-host QPS and hit rate the fleet used (for
    ``sdm run``, the replay table's), what bounds the host count, hosts, watts and power
    savings versus DRAM-only (n/a where a fleet cannot serve)."""
    from sdm.replay.render import _qps

    lines = ["| scenario | config | QPS/host | QPS source | hit rate | bound by | hosts | power kW | savings vs dram |",
             "|---|---|---|---|---|---|---|---|---|"]
    for sc in report["scenarios"]:
        for c in sc["configs"]:
            hosts = "n/a" if c["hosts"] is None else f"{c['hosts']:,}"
            power = "n/a" if c["power_watts"] is None else f"{c['power_watts'] / 1e3:,.1f}"
            saving = "n/a" if c["savings_vs_dram"] is None else f"{c['savings_vs_dram']:+.1%}"
            hit = "-" if c["hit_rate"] is None else f"{c['hit_rate']:.3f}"
            lines.append(f"| {sc['name']} | {c['name']} | {_qps(c['qps_per_host'])} | {c['qps_source']} | {hit} "
                         f"| {c['bound']} | {hosts} | {power} | {saving} |")
    return "\n".join(lines)

"""The table of ``bench/validate_host.sh``'s runs: the host model's prediction beside live load.

Usage: ``.venv/bin/python bench/validate_host_table.py OUTDIR`` (the directory the script
wrote). One Markdown row per case:

* hit rate;
* CPU per request, profiled / live (the median over the live points);
* p99 predicted vs measured at each rate, the error as predicted / measured - 1; a rate whose
  live point holds fewer than 20 requests is starred (its p99 is nearly its maximum);
* the QPS at the SLA of each, and its error;
* the live knee (``sdm load``'s ``knee_qps``: the highest rate achieved within 5%);
* the model's bottleneck.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

CASES = ("dram", "sdm-3dxp", "sdm-nand", "nand-4m", "dram-rm2", "nand-4m-direct", "dram-processes",
         "sdm-3dxp-processes", "sdm-nand-processes", "nand-4m-processes", "dram-rm2-processes",
         "sdm-nand-rm2-processes", "nand-4m-direct-processes")
FEW = 20  # live requests below which a point's p99 is its maximum


def _ms(us):
    return f"{us / 1e3:.1f}"


def _error(predicted, measured):
    if not predicted or not measured:
        return "-"
    return f"{predicted / measured - 1:+.0%}"


def row(name: str, host: dict, load: dict) -> str:
    live = {round(p["offered_qps"], 6): p for p in load["points"]}
    cells = []
    for c in host["curve"]:
        p = live.get(round(c["offered_qps"], 6))
        if p is None:
            continue
        few = "*" if p["requests"] < FEW else ""
        cells.append(f"{c['offered_qps']:g}/s: {_ms(c['latency_us']['p99'])} vs "
                     f"{_ms(p['latency_us']['p99'])}{few} ms ({_error(c['latency_us']['p99'], p['latency_us']['p99'])})")
    cpu = host["profile"]["cpu_us_per_request"]
    profiled = sum(cpu.values())
    live_cpu = statistics.median(p["cpu_us_per_request"] for p in load["points"])
    knee = load["knee_qps"]
    predicted, measured = host["qps_at_sla"], load.get("qps_at_sla")
    return (f"| {name} | {host['hit_rate']:.3f} | {_ms(profiled)} / {_ms(live_cpu)} ms | {'; '.join(cells)} | "
            f"{predicted or 0:,.0f} | {measured or 0:,.0f} | {_error(predicted, measured)} | "
            f"{knee or 0:,.0f}/s | {host['bottleneck']} |")


def main(argv) -> int:
    out = Path(argv[1] if len(argv) > 1 else "/tmp/sdm-validate-host")
    print("| case | hit rate | CPU per request profiled / live | p99 predicted vs measured | "
          "QPS at SLA predicted | measured | error | live knee | predicted bottleneck |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in CASES:
        host, load = out / f"{name}-host.json", out / f"{name}-load.json"
        if host.exists() and load.exists():
            print(row(name, json.loads(host.read_text()), json.loads(load.read_text())))
    calibrate = out / "calibrate.json"
    if calibrate.exists():
        print(f"\ncalibrate: {calibrate.read_text().strip()[:2000]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The host model's speed, and the scenarios' 2-socket host's per-host QPS at the SLA.

1. Speed: the QPS at the SLA (bisection over simulations of 100K Poisson arrivals) for the
   bundled trace's warm ``sdm-nand`` profile on ``this-machine``, after the kernel is loaded;
   and how many device reads per second the simulation handles. Again with 8 thread workers
   (the process's measured thread curve).
2. The ``2-socket`` host preset (40 cores, 10% of the table bytes as DRAM cache, 8 SCM
   devices, 51 GB/s DRAM) serving ``dram``, ``sdm-nand`` and ``sdm-3dxp`` on a
   meta-2021-shaped and an rm2-shaped trace (generated, rows shrunk so the live store that
   measures the CPU costs fits this machine), with the bottleneck of each.

Run::

    .venv/bin/python bench/bench_host.py            # full size
    .venv/bin/python bench/bench_host.py --quick    # toy size smoke test
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from machine import commit, cpu_line  # noqa: E402
from sdm.host import HostSimulation, build_profile, predict  # noqa: E402
from sdm.replay.live import build_store  # noqa: E402
from sdm.trace import load  # noqa: E402
from sdm.trace.generate import generate_to  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CONFIGS = ("dram", "sdm-nand", "sdm-3dxp")
# (label, profile, overrides, samples per request): the shapes of the issue, rows shrunk to fit
# this machine's disk; rm2's 256-sample batch (983K lookups) is cut into requests of 32 samples
# (123K lookups), since one of this VM's cores pools a whole batch in more than the 30 ms SLA.
TRACES = (("meta-2021-shaped", "meta-2021", dict(table_size="200000", batch_size=512, batches=16), None),
          ("rm2-shaped", "rm2", dict(table_size="100000", batches=4), 32))
QUICK_TRACES = (("meta-2021-shaped", "meta-2021", dict(table_size="5000", batch_size=64, batches=4), None),
                ("rm2-shaped", "rm2", dict(table_size="2000", batch_size=16, batches=2, tables=4), 4))


def speed(trace: str, arrivals: int, sla_us: float, tmp: str) -> None:
    """Both simulations over one profile: cores and devices (a worker per request), and 8
    thread workers over the process's measured curve (which simulates no device reads)."""
    profile = build_profile(trace, "sdm-nand", "this-machine", workdir=tmp, threads=8)
    for label, sim in (("sdm-nand", HostSimulation(profile, arrivals=arrivals)),
                       ("sdm-nand, 8 threads", HostSimulation(profile, arrivals=arrivals, workers=8, threads=True))):
        t0 = time.perf_counter()
        sla = sim.qps_at_sla(sla_us)
        seconds = time.perf_counter() - t0
        reads = 0 if sim.threads else sim.runs * sim.n * profile.reads_per_request().sum()
        events = sim.runs * sim.n
        print(f"| {os.path.basename(trace)} | {label} | {arrivals:,} | {sim.runs} | {seconds:.2f} s "
              f"| {sla.qps:,.1f} | {reads / seconds:,.3g} | {events / seconds:,.3g} |")


def two_socket(traces, arrivals: int, sla_us: float, tmp: str) -> None:
    for label, name, overrides, request_size in traces:
        path = generate_to(os.path.join(tmp, f"{label}.npz"), name, seed=0, **overrides)
        with load(path) as tr:
            store = build_store(os.path.join(tmp, f"{label}-store"), tr.table_sizes, progress=False)
            batches, per_batch = len(tr), int(tr.batch_lookups.sum()) // len(tr)
            samples = tr[0].batch_size
        size = samples if request_size is None else request_size
        shape = f"{batches} batches of {samples} samples, requests of {size}: {per_batch * size // samples:,} lookups"
        for config in CONFIGS:
            r = predict(path, config, "2-socket", store=store, arrivals=arrivals, sla_us=sla_us, workdir=tmp,
                        request_size=request_size)
            util = ", ".join(f"{k} {v:.2f}" for k, v in r.utilization.items())
            cpu = r.profile.cpu_ns_per_request() / 1e3
            print(f"| {label} ({shape}) | {config} | {r.profile.hit_rate:.3f} | {cpu:,.0f} µs "
                  f"| {r.qps_at_sla:,.0f} | {r.bottleneck} | {util} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="toy size: a smoke test")
    ap.add_argument("--sla-us", type=float, default=30_000.0)
    args = ap.parse_args(argv)
    trace = os.path.join(ROOT, "traces", "tiny-zipf.npz" if args.quick else "default.npz")
    arrivals = 5_000 if args.quick else 100_000
    print(cpu_line())
    print(f"commit: {commit()}; load average {os.getloadavg()[0]:.2f} (1 min)\n")
    with tempfile.TemporaryDirectory(prefix="bench-host-") as tmp:
        print("| trace | config | arrivals per rate | simulations | QPS-at-SLA search | QPS at SLA "
              "| device reads/s simulated | requests/s simulated |")
        print("|---|---|---|---|---|---|---|---|")
        speed(trace, arrivals, args.sla_us, tmp)
        print("\n| 2-socket host: trace | config | hit rate | CPU per request | QPS at SLA | bottleneck "
              "| utilization at the QPS at SLA |")
        print("|---|---|---|---|---|---|---|")
        two_socket(QUICK_TRACES if args.quick else TRACES, arrivals, args.sla_us, tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

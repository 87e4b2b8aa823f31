"""Replay speed: live-store replay (data plane) per preset and sweep points (control plane).

Replay: one store is built for the trace (dim 64 fp32 by default), then ``sdm.replay.live.replay``
runs through each preset ``--repeats`` times in modeled IO mode; each run opens the store
cold (after the replay's own warm-up open, which keeps one-time row-file building and JIT
loading out of the timing). Reported per preset, as the median over runs:

* ``serving lookups/s``: lookups / wall time of the serving calls (``Store.embedding_bags``);
* ``excl. first request``: the same without the first request of the open, which pays the
  store's per-open setup (verifying the SCM row files, first touches of the cache slots);
* ``whole call``: lookups / the whole ``replay()`` call (trace reading, the warm-up open,
  counters and the SLA search included; the store build is not).

Sweep: ``sdm.replay.sweep.sweep`` over policies x cache sizes x two devices, on 1 and 2 threads;
per point the control-plane rate (lookups of the trace / time simulating it and counting
each request's hits and device blocks), and the grid's aggregate rate (points x lookups /
wall time, queueing model included). Targets: replay >= 5M lookups/s, sweep points >= 20M.

    .venv/bin/python bench/bench_replay.py            # traces/default.npz, 3 repeats
    .venv/bin/python bench/bench_replay.py --quick    # toy size (the smoke test)
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from sdm.replay.live import build_store, replay  # noqa: E402
from sdm.replay.sweep import sweep  # noqa: E402
from sdm.trace import load  # noqa: E402
from machine import cpu_line  # noqa: E402 (bench/machine.py)

DEFAULT_PRESETS = ("dram", "sdm-nand", "sdm-3dxp")
DEFAULT_POLICIES = ("lru", "fifo", "clock", "sieve", "s3fifo", "lfu", "arc")
DEFAULT_SIZES = ("1M", "4M", "16M", "64M")


def machine() -> str:
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or "?"
    except OSError:
        commit = "?"
    return f"{cpu_line()}, Python {platform.python_version()}, commit {commit}"


def bench_replay(trace, presets, dim, repeats, workdir):
    rows = []
    with load(trace) as tr:
        path = os.path.join(workdir, "store")
        t0 = time.perf_counter()
        build_store(path, tr.table_sizes, dim=dim, progress=False)
        build_s = time.perf_counter() - t0
        for preset in presets:
            serving, steady, whole = [], [], []
            last = None
            for _ in range(repeats):
                t0 = time.perf_counter()
                r = replay(tr, preset, store=path)
                whole.append(r.lookups / (time.perf_counter() - t0))
                serving.append(r.lookups_per_s)
                steady.append(r.lookups_per_s_after_first)
                last = r
            rows.append((preset, statistics.median(serving), statistics.median(steady),
                         statistics.median(whole), last))
    return rows, build_s


def bench_sweep(trace, policies, sizes, devices, dim, repeats):
    """Interleaved 1- and 2-thread grids (kernels loaded first by a toy grid); per thread
    count the run with the median grid wall time."""
    sweep(os.path.join(ROOT, "traces", "tiny-zipf.npz"), policies=policies, cache_sizes=["4K"],
          devices=devices, dim=8)
    runs = {1: [], 2: []}
    for _ in range(repeats):
        for workers in (1, 2):
            runs[workers].append(sweep(trace, policies=policies, cache_sizes=sizes, devices=devices,
                                       dim=dim, workers=workers))
    out = {}
    for workers, grids in runs.items():
        s = sorted(grids, key=lambda g: g.wall_s)[len(grids) // 2]
        out[workers] = (s, np.array([p.lookups_per_s for p in s.points]))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="toy size (smoke test)")
    ap.add_argument("--trace", default=os.path.join(ROOT, "traces", "default.npz"))
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--presets", default=",".join(DEFAULT_PRESETS))
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    ap.add_argument("--cache-sizes", default=",".join(DEFAULT_SIZES))
    args = ap.parse_args(argv)
    if args.quick:
        args.trace = os.path.join(ROOT, "traces", "tiny-zipf.npz")
        args.dim, args.repeats, args.policies, args.cache_sizes = 8, 1, "lru,sieve", "2K,8K"
    presets = [p for p in args.presets.split(",") if p]
    policies = [p for p in args.policies.split(",") if p]
    sizes = [s for s in args.cache_sizes.split(",") if s]
    devices = ["nand-p4500", "optane-p4800x-512"]
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        rows, build_s = bench_replay(args.trace, presets, args.dim, args.repeats, tmp)
    print(f"## Replay: `{os.path.basename(args.trace)}`, dim {args.dim} fp32, modeled IO, "
          f"median of {args.repeats} ({machine()}; store built in {build_s:.2f} s)\n")
    print("| preset | lookups | serving lookups/s | excl. first request | whole call | hit rate "
          "| p99 modeled |")  # the QPS at the SLA is the host model's (bench_host), not the replay's
    print("|---|---|---|---|---|---|---|")
    for preset, serving, steady, whole, r in rows:
        print(f"| {preset} | {r.lookups:,} | {serving / 1e6:.2f}M | {steady / 1e6:.2f}M | {whole / 1e6:.2f}M "
              f"| {r.hit_rate:.3f} | {r.latency_us['p99']:,.0f} µs |")
    out = {"replay": rows}
    grids = bench_sweep(args.trace, policies, sizes, devices, args.dim, args.repeats)
    for workers, (s, rates) in grids.items():
        print(f"\n## Sweep on {workers} thread{'s' if workers > 1 else ''} (median of {args.repeats} "
              f"interleaved runs): {len(s.points)} points "
              f"({len(s.policies)} policies incl. belady x {len(sizes)} sizes x {len(devices)} devices), "
              f"{s.lookups:,} lookups = {s.keys:,} cache keys per point\n")
        print(f"grid wall {s.wall_s:.2f} s = {len(s.points) * s.lookups / s.wall_s / 1e6:.1f}M lookups/s "
              f"aggregate (queueing model included); per point control plane: median "
              f"{np.median(rates) / 1e6:.1f}M, min {rates.min() / 1e6:.1f}M lookups/s\n")
        print("| policy | " + " | ".join(sizes) + " |")
        print("|---|" + "---|" * len(sizes))
        for policy in s.policies:
            pts = [p for p in s.points if p.policy == policy]
            print(f"| {policy} | " + " | ".join(f"{p.lookups_per_s / 1e6:.1f}M ({p.miss_ratio:.3f})"
                                                 for p in pts) + " |")
        out[f"sweep_{workers}"] = (s, rates)
    print("\ncells: control-plane lookups/s (miss ratio)")
    return out


if __name__ == "__main__":
    main()

"""Online updates: how fast ``store.update_rows`` applies deltas, and what they cost readers.

1. Reader latency: a reader process serves batches (256 bags x 20 Zipf lookups per table,
   ``sdm-nand``, wall time per ``embedding_bags`` call) for ``--seconds``, first alone, then
   while this process applies updates of 1,000 rows back to back. The reader catches up on
   each new version at its next batch (drops the changed rows from its DRAM cache, reads
   them from LMDB instead of its SCM files until they pass 5% of a table, then rebuilds the
   file), so its latency shows what the deltas cost it.
2. Update throughput: rows/s of ``update_rows`` calls of 1, 100, 1,000 and 10,000 random
   distinct rows (each call one LMDB write transaction with its log entry, synced), fp32
   rows of dim 64 in 4 tables x 500K rows.

Run::

    .venv/bin/python bench/bench_updates.py            # 4 x 500K x 64 fp32 (512 MB)
    .venv/bin/python bench/bench_updates.py --quick    # toy size smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sdm  # noqa: E402
from machine import cpu_line  # noqa: E402 (bench/machine.py)

DIM = 64

READER = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    sys.path.insert(0, sys.argv[4])
    import sdm
    path, tables, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    rng = np.random.default_rng(0)
    lat = []
    with sdm.Store.open(path, config="sdm-nand", readonly=True) as store:
        rows = store.tables["t0"].num_rows
        def batch():
            return {f"t{t}": ((rng.zipf(1.1, 256 * 20) - 1) % rows, np.arange(0, 256 * 20 + 1, 20))
                    for t in range(tables)}
        for _ in range(20):  # warm the cache and the row files
            store.embedding_bags(batch())
        print("ready", flush=True)
        end = time.time() + seconds
        while time.time() < end:
            b = batch()
            t0 = time.perf_counter()
            store.embedding_bags(b)
            lat.append(time.perf_counter() - t0)
        version = store.stats()["version"]
    print(json.dumps({"lat": lat, "version": version}), flush=True)
""")


def build(path: str, tables: int, rows: int) -> None:
    rng = np.random.default_rng(0)
    specs = [sdm.TableSpec(f"t{i}", rows, DIM, "fp32") for i in range(tables)]
    with sdm.Store.create(path, specs) as store:
        for spec in specs:
            store.write_table(spec.name, rng.standard_normal((rows, DIM), dtype=np.float32), progress=False)


def update_throughput(path: str, tables: int, rows: int, sizes, seconds: float) -> list[str]:
    out = ["| rows per call | calls | rows/s | ms per call |", "|---|---|---|---|"]
    rng = np.random.default_rng(1)
    with sdm.Store.open(path, config="dram") as store:
        for k in sizes:
            calls, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                ids = rng.choice(rows, k, replace=False)
                store.update_rows(f"t{calls % tables}", ids, rng.standard_normal((k, DIM), dtype=np.float32))
                calls += 1
            dt = time.perf_counter() - t0
            out.append(f"| {k:,} | {calls} | {calls * k / dt:,.0f} | {dt / calls * 1e3:.2f} |")
            print(out[-1], flush=True)
    return out


def reader_run(path: str, tables: int, seconds: float, writer_rows: int | None, rows: int) -> dict:
    proc = subprocess.Popen([sys.executable, "-c", READER, path, str(tables), str(seconds),
                             os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    updates = 0
    if writer_rows:
        rng = np.random.default_rng(2)
        with sdm.Store.open(path, config="dram") as store:
            end = time.time() + seconds
            while time.time() < end:
                ids = rng.choice(rows, writer_rows, replace=False)
                store.update_rows(f"t{updates % tables}", ids,
                                  rng.standard_normal((writer_rows, DIM), dtype=np.float32))
                updates += 1
    result = json.loads(proc.communicate()[0].strip().splitlines()[-1])
    lat = np.array(result["lat"]) * 1e6
    return {"batches": len(lat), "p50": np.percentile(lat, 50), "p99": np.percentile(lat, 99),
            "mean": lat.mean(), "updates": updates, "versions_seen": result["version"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--quick", action="store_true", help="toy size smoke test")
    args = ap.parse_args(argv)
    if args.quick:
        args.tables, args.rows, args.seconds = 2, 20_000, 1.0
    sizes = [s for s in (1, 100, 1_000, 10_000) if s <= args.rows]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="sdm-bench-updates-") as tmp:
        path = os.path.join(tmp, "s")
        build(path, args.tables, args.rows)
        print(f"# bench_updates: {args.tables} x {args.rows:,} x {DIM} fp32, {cpu_line()}, commit {commit}\n")
        # readers first, on a store no update has touched yet
        lines = ["## Reader latency (wall µs per embedding_bags call, sdm-nand, separate process)", "",
                 "| writer | reader batches | p50 µs | p99 µs | mean µs | updates applied | versions seen |",
                 "|---|---|---|---|---|---|---|"]
        for label, k in (("none", None), ("1,000-row updates back to back", 1_000 if args.rows >= 1000 else 10)):
            r = reader_run(path, args.tables, args.seconds, k, args.rows)
            lines.append(f"| {label} | {r['batches']} | {r['p50']:.0f} | {r['p99']:.0f} | {r['mean']:.0f} | "
                         f"{r['updates']} | {r['versions_seen']} |")
            print(lines[-1], flush=True)
        lines += ["", "## update_rows throughput", ""]
        lines += update_throughput(path, args.tables, args.rows, sizes, args.seconds / 2)
        print("\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

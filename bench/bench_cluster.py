"""Scale-out: what serving a store sharded over Ray actors costs, and how well the planner balances.

1. Ray call: the round trip of one actor call carrying 1 KiB, p50 and p99 (the default of
   ``sdm.cluster.planner.RAY_CALL_US``, the planner's per-call overhead).
2. Fan-out overhead per batch at 2, 4 and 8 shards: each batch is served by the single-host
   ``Store`` and by a ``ShardedStore`` over N workers (both ``dram``), alternately, once as
   ``sdm.cluster.plan`` chooses and once with every table row-wise (raw rows back, pooled by
   the caller); the overhead is the sharded time minus the single-host time of the same
   batch, reported as p50 and p99 over the batches.
3. Planner: the time to plan 128 tables over 16 workers, and the balance (max / mean worker
   cost) of the refined plan against the TorchRec-style greedy on 32-128 tables (Zipf sizes
   and pooling) over 2-16 workers.

Run::

    .venv/bin/python bench/bench_cluster.py            # 8 tables x 100K rows x 64 fp32, 256 bags x 20
    .venv/bin/python bench/bench_cluster.py --quick    # toy size smoke test
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sdm  # noqa: E402
from sdm.cluster import CostModel, ShardedStore, WorkerSpec, plan  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import commit, cpu_model  # noqa: E402 (bench/machine.py)


def percentiles(values) -> tuple[float, float]:
    """p50 and p99, in milliseconds, of seconds."""
    return float(np.percentile(values, 50) * 1e3), float(np.percentile(values, 99) * 1e3)


def ray_call(ray, calls: int) -> tuple[float, float]:
    @ray.remote(num_cpus=0)
    class Echo:
        def echo(self, x):
            return x

    actor = Echo.remote()
    payload = np.zeros(256, dtype=np.float32)
    for _ in range(20):
        ray.get(actor.echo.remote(payload))
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        ray.get(actor.echo.remote(payload))
        times.append(time.perf_counter() - start)
    ray.kill(actor)
    return percentiles(times)


def fan_out(path, specs, shards: int, batches: list, sharding: dict | None) -> dict:
    p = plan(path, shards, sharding=sharding)
    kinds = sorted({t.sharding for t in p.tables})
    single, sharded = [], []
    with sdm.Store.open(path) as one, ShardedStore.launch(path, p) as many:
        for batch in batches[:10]:  # warm both
            one.embedding_bags(batch)
            many.embedding_bags(batch)
        for i, batch in enumerate(batches):
            order = (one, many) if i % 2 else (many, one)
            for store in order:
                start = time.perf_counter()
                store.embedding_bags(batch)
                (single if store is one else sharded).append(time.perf_counter() - start)
        workers = len(many.actors)
    over = np.array(sharded) - np.array(single)
    return {"shards": shards, "workers": workers, "kinds": ",".join(kinds), "single": percentiles(single),
            "sharded": percentiles(sharded), "overhead": percentiles(over)}


def zipf_tables(count: int, seed: int):
    """``count`` tables with Zipf row counts (10M / rank, at least 100) and Zipf pooling
    (80 / rank^0.8), shuffled, mixed dims and formats; returns (specs, pooling)."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, count + 1)
    rows = np.maximum(100, (1e7 / ranks).astype(int))
    pooling = np.maximum(1.0, 80 / ranks ** 0.8)
    rng.shuffle(rows)
    rng.shuffle(pooling)
    dims = rng.choice([16, 32, 64, 128], count)
    fmts = rng.choice(sdm.ROW_FORMATS, count)
    specs = [sdm.TableSpec(f"t{i}", int(r), int(d), str(f)) for i, (r, d, f) in enumerate(zip(rows, dims, fmts))]
    return specs, {s.name: float(x) for s, x in zip(specs, pooling)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="toy size smoke test")
    ap.add_argument("--tables", type=int, default=8)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--bags", type=int, default=256)
    ap.add_argument("--pool", type=int, default=20)
    ap.add_argument("--batches", type=int, default=300, help="timed batches per shard count")
    ap.add_argument("--calls", type=int, default=500, help="timed Ray calls")
    args = ap.parse_args(argv)
    shard_counts = (2, 4, 8)
    if args.quick:
        args.tables, args.rows, args.dim, args.bags, args.pool = 4, 2000, 16, 32, 4
        args.batches, args.calls, shard_counts = 20, 50, (2, 4)
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False)
    print(f"# bench_cluster  commit {commit()}")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
          f"Ray {ray.__version__}, numpy {np.__version__}")
    print(f"ray.cluster_resources: {ray.cluster_resources().get('CPU', 0):g} CPUs\n")

    p50, p99 = ray_call(ray, args.calls)
    print(f"Ray call (1 KiB round trip, {args.calls} calls): p50 {p50 * 1e3:.0f} us, p99 {p99 * 1e3:.0f} us\n")

    rng = np.random.default_rng(0)
    specs = [sdm.TableSpec(f"t{i}", args.rows, args.dim) for i in range(args.tables)]
    offsets = np.arange(0, args.bags * args.pool + 1, args.pool)
    batches = [{s.name: (rng.integers(0, s.num_rows, args.bags * args.pool), offsets) for s in specs}
               for _ in range(args.batches)]
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        path = os.path.join(tmp, "store")
        with sdm.Store.create(path, specs, config="ssd") as store:
            for s in specs:
                store.write_table(s.name, rng.standard_normal((s.num_rows, s.dim)).astype(np.float32))
        print(f"Fan-out: {args.tables} tables x {args.rows:,} rows x {args.dim} fp32 (dram), "
              f"{args.bags} bags x {args.pool} lookups per table, {args.batches} batches; ms per batch")
        print("| shards | actors | sharding | single p50 | sharded p50 | overhead p50 | overhead p99 |")
        print("|---|---|---|---|---|---|---|")
        variants = (None,) if args.quick else (None, {s.name: "row-wise" for s in specs})
        for n in shard_counts:
            for sharding in variants:
                r = fan_out(path, specs, n, batches, sharding)
                print(f"| {n} | {r['workers']} | {r['kinds']} | {r['single'][0]:.2f} | {r['sharded'][0]:.2f} | "
                      f"{r['overhead'][0]:.2f} | {r['overhead'][1]:.2f} |")

    specs, pooling = zipf_tables(128, 0)
    plan(specs, 16, pooling=pooling)
    wall, cpu = [], []
    for _ in range(3 if args.quick else 7):
        start, start_cpu = time.perf_counter(), time.process_time()
        plan(specs, 16, pooling=pooling)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    print(f"\nplanner: 128 tables over 16 workers in {np.median(wall) * 1e3:.0f} ms wall, "
          f"{np.median(cpu) * 1e3:.0f} ms CPU (median of {len(wall)})\n")
    print("Balance (max / mean worker cost) of the refined plan and the TorchRec-style greedy, Zipf "
          "tables; defaults (64 MiB DRAM cache per worker, misses to nand-p4500, measured Ray call), and "
          "rows all in DRAM with free Ray calls (the hardest case for balance):")
    print("| tables | workers | refine | greedy | refine / greedy score | in DRAM: refine | greedy | score ratio |")
    print("|---|---|---|---|---|---|---|---|")
    resident = dict(worker=WorkerSpec(dram_bytes=1 << 40), cost_model=CostModel(ray_call_us=0.0))
    for count in (32, 64, 128):
        specs, pooling = zipf_tables(count, count)
        for workers in (2, 4, 8, 16):
            cells = []
            for kw in ({}, resident):
                best = plan(specs, workers, pooling=pooling, **kw)
                greedy = plan(specs, workers, pooling=pooling, search="greedy", **kw)
                cells += [f"{best.balance:.4f}", f"{greedy.balance:.4f}", f"{best.score_ns / greedy.score_ns:.4f}"]
            print(f"| {count} | {workers} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

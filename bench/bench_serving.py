"""Concurrent serving: closed-loop throughput of one store against the number of worker threads.

The case of the concurrent-serving issue: 94 small requests (4 tables, 16 bags of 4 ids each,
uniform ids over 1M-row tables) served by 1-32 threads through one **paced** ``sdm-nand`` store
(the device waits are real: a thread sleeps until its reads' completion on the shared device
queue), with a cache much smaller than the tables, so most lookups read Nand. Each worker
count runs the 94 requests back to back per thread (closed loop), three times interleaved
with the other counts; the median is reported with the speedup over one thread, the process's
CPU use (cores busy) and the Nand device's utilization and mean queue depth, which show what
saturates when throughput stops scaling.

It also prints the **device ceiling**: the requests/s at which the Nand model's units are all
busy, ``1e9 / spacing_ns / reads per request`` (55 units / 85 us over the blocks a request
reads), as a multiple of one thread's rate. No worker count can serve more than that; a
closed loop reaches it only with the device's queue never empty, so 4x one thread is in reach
only where one thread keeps under a quarter of the units busy.

Run::

    .venv/bin/python bench/bench_serving.py            # 4 x 1M x 64 fp32 (1 GiB store)
    .venv/bin/python bench/bench_serving.py --plot bench/serving.png   # and the curve as a PNG
    .venv/bin/python bench/bench_serving.py --quick    # toy size smoke test
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sdm  # noqa: E402
from sdm.load.run import cpu_model  # noqa: E402
from sdm.store.config import HIERARCHY_PRESETS, with_io_mode, with_options  # noqa: E402

WORKERS = (1, 2, 4, 8, 16, 32)
SWITCH_INTERVAL_S = 2e-4


def make_requests(n: int, tables: int, rows: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        req = {}
        for t in range(tables):
            ids = rng.integers(0, rows, 64)  # uniform over a table 30x the cache: mostly misses
            req[f"t{t}"] = (ids.astype(np.int64), np.arange(0, 65, 4, dtype=np.int64))
        out.append(req)
    return out


def serve(store, requests, workers: int) -> tuple[float, float, dict]:
    """(wall s, CPU s, device counters after) of serving every request once on ``workers``
    threads, each serving its share back to back (a closed loop: thread ``k`` serves requests
    ``k, k + workers, ...``). No future or queue per request: the harness's own Python would
    hold the GIL the store's threads contend for (a pool's futures took a fifth of it)."""
    before = store.stats()["devices"]
    errors = []

    def loop(mine):
        try:
            for request in mine:
                store.embedding_bags(request)
        except BaseException as exc:  # noqa: BLE001 (re-raised in the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(requests[k::workers],)) for k in range(workers)]
    cpu0, t0 = time.process_time(), time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if errors:
        raise errors[0]
    after = store.stats()["devices"]
    devices = {}
    for name, a in after.items():
        b = before.get(name, {"reads": 0, "in_device_ns": 0.0})
        devices[name] = {"utilization": (a["reads"] - b["reads"]) * a["spacing_ns"] / (wall * 1e9),
                         "queue_depth": (a["in_device_ns"] - b["in_device_ns"]) / (wall * 1e9),
                         "reads": a["reads"] - b["reads"], "spacing_ns": a["spacing_ns"]}
    return wall, cpu, devices


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="toy size: a smoke test")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workers", type=int, nargs="+", help="worker counts (default 1 2 4 8 16 32)")
    ap.add_argument("--plot", metavar="PNG", help="write requests/s and cores busy against workers here")
    args = ap.parse_args(argv)
    rows = 20_000 if args.quick else 1_000_000
    workers = args.workers or ((1, 4) if args.quick else WORKERS)
    reps = 1 if args.quick else args.reps
    # Threads waking from device waits queue for the GIL behind a thread running Python; at the
    # default 5 ms switch interval each wake-up can cost that much (a convoy). A serving
    # process shortens it, as sdm load does.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; GIL switch interval {SWITCH_INTERVAL_S * 1e3:g} ms")
    specs = [sdm.TableSpec(f"t{t}", rows, 64, "fp32") for t in range(4)]
    requests = make_requests(94, 4, rows)
    config = with_io_mode(with_options(HIERARCHY_PRESETS["sdm-nand"], cache_bytes=1 << 20), "paced")
    with tempfile.TemporaryDirectory(prefix="sdm-bench-serving-") as tmp:
        path = os.path.join(tmp, "s")
        with sdm.Store.create(path, specs) as store:
            for s in specs:
                store.write_table(s.name, (np.random.default_rng(i).random((min(rows - i, 1 << 16), 64),
                                                                          dtype=np.float32)
                                           for i in range(0, rows, 1 << 16)))
        with sdm.Store.open(path, config=config) as store:
            serve(store, requests, 4)  # load the kernels and the SCM row files
            runs = {w: [] for w in workers}
            for _ in range(reps):
                for w in workers:  # interleaved, so drift hits every count alike
                    runs[w].append(serve(store, requests, w))
    print(f"\n{len(requests)} requests (4 tables x 16 bags x 4 ids), paced sdm-nand, 1 MiB cache, "
          f"median of {reps}")
    print("| workers | requests/s | speedup | median request ms | cores busy | nand util | nand QD |")
    print("|---|---|---|---|---|---|---|")
    base = None
    curve = []
    for w in workers:
        walls = [r[0] for r in runs[w]]
        i = walls.index(statistics.median_low(walls)) if len(walls) > 1 else 0
        wall, cpu, dev = runs[w][i]
        qps = len(requests) / wall
        base = base or qps
        nand = dev.get("nand-p4500", {"utilization": 0.0, "queue_depth": 0.0})
        curve.append((w, qps, cpu / wall))
        print(f"| {w} | {qps:,.0f} | {qps / base:.2f}x | {wall / len(requests) * w * 1e3:.2f} | "
              f"{cpu / wall:.2f} | {nand['utilization']:.2f} | {nand['queue_depth']:.1f} |")
    ceiling = device_ceiling(runs, len(requests))
    if ceiling:
        print(f"\nNand ceiling (every unit busy): {ceiling:,.0f} requests/s = {ceiling / base:.2f}x one thread; "
              f"the best worker count reaches {max(q for _, q, _ in curve) / ceiling:.0%} of it")
    if args.plot:
        print(f"wrote {plot(curve, args.plot, ceiling)}")
    return 0


def device_ceiling(runs, n_requests: int) -> float:
    """Requests/s at which the Nand model's units are all busy: its reads per second at full
    load (``1e9 / spacing_ns``) over the blocks one request reads (the mean over every run)."""
    done = [r[2]["nand-p4500"] for rs in runs.values() for r in rs if "nand-p4500" in r[2]]
    reads = sum(d["reads"] for d in done)
    if not reads:
        return 0.0
    return 1e9 / done[0]["spacing_ns"] / (reads / (n_requests * len(done)))


def plot(curve, path, ceiling: float = 0.0) -> str:
    """Requests/s (left axis) and cores busy (right axis) against worker threads, and the
    device ceiling (:func:`device_ceiling`) when there is one."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    workers, qps, busy = zip(*curve)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot(workers, qps, marker="o", label="requests/s")
    ax.plot(workers, [qps[0] * w for w in workers], linestyle=":", color="grey", label="linear in workers")
    if ceiling:
        ax.axhline(ceiling, linestyle="--", color="tab:green", label="Nand ceiling (all units busy)")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, max(max(qps), ceiling) * 1.3)
    ax.set_xlabel("worker threads")
    ax.set_ylabel("requests/s")
    right = ax.twinx()
    right.plot(workers, busy, marker="s", color="tab:red", label="cores busy")
    right.set_ylim(0, os.cpu_count() or 2)
    right.set_ylabel("cores busy (process CPU / wall)")
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    ax.set_title(f"paced sdm-nand, 94 requests, {cpu_model()}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


if __name__ == "__main__":
    raise SystemExit(main())

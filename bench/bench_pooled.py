"""Pooled-embedding cache benchmark: serving request-shaped batches with and without it.

A ranking request scores one user against ``--candidates`` items, so every user-side bag of
the request is repeated, identical, once per candidate; users come back across batches
(Zipf(``--alpha``) over ``--users`` users, each with fixed bags). Item-side bags are fresh
random ids per candidate and do not repeat. One batch = ``--requests`` requests, i.e.
``requests x candidates`` samples, one bag per sample per table.

Contenders, in one process, on the same fp32 rows, interleaved batch by batch (order rotating):

* ``direct``: ``sdm.embedding_bag`` on every table, every bag pooled.
* ``pooled-cache (user tables)``: user-side tables through one :class:`sdm.store.pooled.PooledCache`
  (misses pooled with ``sdm.embedding_bag``), item-side tables direct: what a caller that
  routes only repeat-prone features does.
* ``pooled-cache (all tables)``: every table through the cache, item-side ones included (the
  cost of routing bags that never repeat).

Each run starts with empty caches and serves ``--batches`` batches; the figure per contender is
the median over ``--runs`` runs of its total time, the ratio the median of per-run ratios to
``direct``. The first run compares every cached output with ``direct`` and prints how many are
bitwise equal: the cache returns exactly the vector ``pool_misses`` produced, but
``sdm.embedding_bag`` itself can round a bag differently in a large batch (its parallel driver)
than in a small one (its serial core), and the misses of a batch are a smaller batch. Run::

    .venv/bin/python bench/bench_pooled.py            # 8 tables x 200k x 64, B = 512
    .venv/bin/python bench/bench_pooled.py --quick    # toy size smoke test
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # see sdm/_jit.py: shared 2-core machine

import numba  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sdm  # noqa: E402
from machine import cpu_line  # noqa: E402 (bench/machine.py)
from sdm.store.pooled import PooledCache  # noqa: E402


def zipf_ranks(rng, n_items: int, size: int, alpha: float) -> np.ndarray:
    """``size`` ranks in ``[0, n_items)`` with P(rank k) proportional to ``(k + 1) ** -alpha``."""
    cdf = np.cumsum(np.arange(1, n_items + 1, dtype=np.float64) ** -alpha)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(size)), n_items - 1)


def make_workload(args, rng):
    """Tables, and per batch a list of ``(indices, offsets)`` per table (user tables first)."""
    n_tables = args.user_tables + args.item_tables
    tables = [rng.standard_normal((args.rows, args.dim), dtype=np.float32) for _ in range(n_tables)]
    # each user's bags, fixed: (users, user_tables) ragged, lengths uniform in [pool/2, 3pool/2]
    user_bags = [[rng.integers(0, args.rows, rng.integers(max(1, args.user_pool // 2),
                                                          args.user_pool * 3 // 2 + 1))
                  for _ in range(args.user_tables)] for _ in range(args.users)]
    batches = []
    B = args.requests * args.candidates
    for _ in range(args.batches):
        users = zipf_ranks(rng, args.users, args.requests, args.alpha)
        per_table = []
        for t in range(args.user_tables):
            bags = [user_bags[u][t] for u in users for _ in range(args.candidates)]
            lengths = np.array([len(b) for b in bags])
            offsets = np.zeros(B + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            per_table.append((np.concatenate(bags).astype(np.int64), offsets))
        for _ in range(args.item_tables):
            lengths = rng.integers(1, 2 * args.item_pool, B)
            offsets = np.zeros(B + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            per_table.append((rng.integers(0, args.rows, int(offsets[-1])), offsets))
        batches.append(per_table)
    return tables, batches


def make_contenders(args, tables):
    """name -> (serve(batch, outs), cache or None); a fresh cache per call (one per run)."""
    cap = int(args.capacity_mb * 2**20)

    def direct(batch, outs):
        for t, (ind, off) in enumerate(batch):
            sdm.embedding_bag(tables[t], ind, off, out=outs[t])

    def cached(routed):
        cache = PooledCache(cap)
        missers = [lambda si, so, sub, tab=tab: sdm.embedding_bag(tab, si, so, out=sub)
                   for tab in tables]

        def serve(batch, outs):
            for t, (ind, off) in enumerate(batch):
                if t < routed:
                    cache.pool(t, ind, off, False, missers[t], outs[t])
                else:
                    sdm.embedding_bag(tables[t], ind, off, out=outs[t])
        return serve, cache

    n_tables = len(tables)
    return {"direct": (direct, None),
            "pooled-cache (user tables)": cached(args.user_tables),
            "pooled-cache (all tables)": cached(n_tables)}


def machine() -> str:
    def sh(cmd):
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
        except OSError:
            return "?"
    commit = sh("git -C %s rev-parse --short HEAD" % os.path.dirname(os.path.abspath(__file__)))
    return (f"nproc {sh('nproc')}; Python {platform.python_version()}; numba {numba.__version__}; "
            f"numpy {np.__version__}; threads {numba.get_num_threads()}; commit {commit}; "
            f"load {os.getloadavg()[0]:.1f}\n" + cpu_line())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="toy size smoke test")
    ap.add_argument("--rows", type=int, default=200_000, help="rows per table")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--user-tables", type=int, default=4)
    ap.add_argument("--item-tables", type=int, default=4)
    ap.add_argument("--user-pool", type=int, default=40, help="mean user-side bag length")
    ap.add_argument("--item-pool", type=int, default=3, help="mean item-side bag length")
    ap.add_argument("--users", type=int, default=5000)
    ap.add_argument("--alpha", type=float, default=1.05, help="Zipf exponent over users")
    ap.add_argument("--requests", type=int, default=8, help="requests per batch")
    ap.add_argument("--candidates", type=int, default=64, help="candidate items per request")
    ap.add_argument("--batches", type=int, default=40, help="batches per run")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--capacity-mb", type=float, default=64.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.dim, args.users, args.batches, args.runs = 2000, 16, 50, 4, 2
        args.requests, args.candidates, args.capacity_mb = 2, 8, 1.0

    rng = np.random.default_rng(args.seed)
    tables, batches = make_workload(args, rng)
    B = args.requests * args.candidates
    outs = {name: [np.empty((B, args.dim), np.float32) for _ in tables]
            for name in ("direct", "pooled-cache (user tables)", "pooled-cache (all tables)")}

    # warm-up: compile every kernel outside the timed runs
    for serve, _ in make_contenders(args, tables).values():
        serve(batches[0], outs["direct"])

    totals = {name: [] for name in outs}
    differ = dict.fromkeys(outs, 0)  # (batch, table) outputs not bitwise equal to direct
    worst = 0.0
    hit_rates = {name: [] for name in outs}
    for run in range(args.runs):
        contenders = make_contenders(args, tables)
        names = list(contenders)
        spent = dict.fromkeys(names, 0.0)
        for i, batch in enumerate(batches):
            k = (i + run) % len(names)
            for name in names[k:] + names[:k]:
                serve = contenders[name][0]
                t0 = time.perf_counter()
                serve(batch, outs[name])
                spent[name] += time.perf_counter() - t0
            if run == 0:
                for name in names[1:]:
                    for a, b in zip(outs[name], outs["direct"]):
                        if not np.array_equal(a.view(np.uint32), b.view(np.uint32)):
                            differ[name] += 1
                            # rounding of a ~40-term float32 sum: relative to the row's scale
                            scale = np.max(np.abs(b), axis=1, keepdims=True) + 1e-30
                            worst = max(worst, float(np.max(np.abs(a - b) / scale)))
        for name in names:
            totals[name].append(spent[name])
            cache = contenders[name][1]
            hit_rates[name].append(cache.stats()["hit_rate"] if cache else float("nan"))
        last = {name: contenders[name][1] for name in names}

    lookups = sum(int(off[-1]) for batch in batches for _, off in batch)
    print(f"# bench_pooled: {len(tables)} tables ({args.user_tables} user, {args.item_tables} item) "
          f"x {args.rows:,} rows x dim {args.dim} fp32; batch = {args.requests} requests x "
          f"{args.candidates} candidates = {B} samples; user bags ~{args.user_pool} ids "
          f"(Zipf {args.alpha} over {args.users:,} users), item bags ~{args.item_pool} ids; "
          f"{args.batches} batches per run ({lookups / args.batches:,.0f} lookups per batch), "
          f"{args.runs} runs; cache {args.capacity_mb:g} MiB\n")
    print(machine() + "\n")
    print("| contender | ms per batch (median run) | vs direct (median of per-run ratios) | "
          "bag hit rate of routed tables | cache MiB used |")
    print("|---|---|---|---|---|")
    for name in totals:
        ms = np.median(totals[name]) / args.batches * 1e3
        ratio = np.median(np.array(totals[name]) / np.array(totals["direct"]))
        cache = last[name]
        hr = f"{np.median(hit_rates[name]):.1%}" if cache else "-"
        used = f"{cache.stats()['bytes_used'] / 2**20:.1f}" if cache else "-"
        print(f"| {name} | {ms:.2f} | {ratio:.2f}x | {hr} | {used} |")
    checked = args.batches * len(tables)
    print("\nfirst run, outputs bitwise equal to direct: "
          + ", ".join(f"{name} {checked - differ[name]}/{checked}" for name in list(outs)[1:])
          + (f" (largest relative difference {worst:.1e})" if worst else ""))
    if worst > 1e-4:
        print("MISMATCH: cached results differ from direct pooling beyond rounding")
        return 1
    s = last["pooled-cache (all tables)"].stats()
    print(f"\nall-tables cache, last run: {s['bags']:,} bags, {s['cache_hits']:,} cache hits, "
          f"{s['batch_repeats']:,} in-batch repeats, {s['misses']:,} misses, "
          f"{s['evicted']:,} evicted, {s['entries']:,} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())

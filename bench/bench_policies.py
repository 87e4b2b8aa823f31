"""Throughput of sdm.simulate against libCacheSim on the same trace, in the same process.

For each policy: requests per second of ``sdm.simulate`` (the whole call: validation, state
allocation, the Numba replay) and of libCacheSim's ``process_trace`` reading a binary
``oracleGeneral`` trace (its fastest path; reader and cache construction are left out of
its time), with its hash table sized to the cache (its fast configuration, the ratio that
counts) and with its default ``hashpower=24``. Runs are interleaved (sdm, libCacheSim, sdm, ...) and the median of each is
reported, because the machine is shared and noisy. Also prints each policy's miss ratio
next to belady's (the regret) and whether sdm and libCacheSim agree.

    .venv/bin/python bench/bench_policies.py             # 1M keys, 4M requests, Zipf 1.05
    .venv/bin/python bench/bench_policies.py --quick     # toy size (the smoke test)
    .venv/bin/python bench/bench_policies.py --markdown  # table for bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sdm  # noqa: E402
from sdm.policies import next_use  # noqa: E402
from sdm.kernels.policies import NEVER  # noqa: E402
from machine import commit, cpu_line  # noqa: E402 (bench/machine.py)

LCS_NAMES = {"lru": "LRU", "fifo": "FIFO", "clock": "Clock", "sieve": "Sieve",
             "s3fifo": "S3FIFO", "lfu": "LFU", "arc": "ARC", "random": "Random",
             "belady": "Belady"}
DEFAULT_POLICIES = ("lru", "fifo", "clock", "sieve", "s3fifo", "lfu", "arc", "random", "belady")
ORACLE_DTYPE = np.dtype([("time", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])


def zipf_trace(n_requests: int, n_keys: int, alpha: float, seed: int = 0) -> np.ndarray:
    """``(n_requests,)`` int64 keys: Zipf(alpha) ranks over ``n_keys`` keys, ranks mapped to
    scattered 64-bit ids so the id -> slot map cannot lean on dense ids."""
    rng = np.random.default_rng(seed)
    w = np.arange(1, n_keys + 1, dtype=np.float64) ** -alpha
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    ranks = np.searchsorted(cdf, rng.random(n_requests))
    ids = rng.permutation(n_keys).astype(np.int64) * 2654435761 + 977
    return ids[ranks]


def write_oracle_general(path: str, keys: np.ndarray) -> None:
    """libCacheSim's binary oracleGeneral trace: uint32 time, uint64 id, uint32 size (1),
    int64 next access (-1: never), packed 24-byte records."""
    rec = np.zeros(keys.shape[0], dtype=ORACLE_DTYPE)
    rec["time"] = np.arange(keys.shape[0], dtype=np.uint32)
    rec["id"] = keys.astype(np.uint64)
    rec["size"] = 1
    nu = next_use(keys)
    rec["next"] = np.where(nu >= NEVER, -1, nu)
    rec.tofile(path)


def lcs_hashpower(capacity: int) -> int:
    """A hash table sized to the cache (2 ** hashpower buckets, about 2x the keys).

    libCacheSim's default, 24, allocates 16M buckets whatever the cache size, which costs
    it 3-5x on a 10K-key cache here; sized tables are its fast configuration."""
    return max(4, (int(capacity) - 1).bit_length() + 1)


def lcs_run(lcs, policy: str, capacity: int, path: str, hashpower: int | None = None):
    reader = lcs.TraceReader(path, lcs.TraceType.ORACLE_GENERAL_TRACE)
    cls = getattr(lcs, LCS_NAMES[policy])
    cache = cls(capacity) if hashpower is None else cls(capacity, hashpower=hashpower)
    t = time.perf_counter()
    miss_ratio, _ = cache.process_trace(reader)
    return time.perf_counter() - t, float(miss_ratio)


def sdm_run(keys, policy: str, capacity: int):
    t = time.perf_counter()
    r = sdm.simulate(keys, policy=policy, capacity=capacity)
    return time.perf_counter() - t, r.miss_ratio


def run(n_requests, n_keys, alpha, capacity, policies, repeats, seed=0, out=print):
    try:
        import libcachesim as lcs
    except ImportError:  # the peer is a test-only extra
        lcs = None
    keys = zipf_trace(n_requests, n_keys, alpha, seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.oracleGeneral")
        if lcs is not None:
            write_oracle_general(path, keys)
        for policy in policies:
            sdm.simulate(keys[:1000], policy=policy, capacity=capacity)  # compile / load
            ts, tl, td = [], [], []
            mr_s = mr_l = float("nan")
            for _ in range(repeats):
                dt, mr_s = sdm_run(keys, policy, capacity)
                ts.append(dt)
                if lcs is not None:
                    dt, mr_l = lcs_run(lcs, policy, capacity, path, lcs_hashpower(capacity))
                    tl.append(dt)
                    dt, _ = lcs_run(lcs, policy, capacity, path)
                    td.append(dt)
            rs = n_requests / statistics.median(ts)
            rl = n_requests / statistics.median(tl) if tl else float("nan")
            rd = n_requests / statistics.median(td) if td else float("nan")
            rows.append((policy, rs, rl, rd, rs / rl if tl else float("nan"),
                         rs / rd if td else float("nan"), mr_s, mr_l))
    belady = {r[0]: r[6] for r in rows}.get("belady")
    return rows, belady


def render(rows, belady, header, markdown):
    lines = [header, ""]
    lines.append("| policy | sdm Mreq/s | libCacheSim sized table Mreq/s | ratio | "
                 "libCacheSim default Mreq/s | ratio | sdm miss ratio | "
                 "libCacheSim miss ratio | regret vs belady |")
    sep = "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    lines.append(sep)
    for policy, rs, rl, rd, ratio, ratio_d, mr_s, mr_l in rows:
        regret = "" if belady is None else f"{mr_s - belady:+.4f}"
        lines.append(f"| {policy} | {rs / 1e6:.1f} | {rl / 1e6:.1f} | {ratio:.2f}x | "
                     f"{rd / 1e6:.1f} | {ratio_d:.2f}x | {mr_s:.4f} | {mr_l:.4f} | {regret} |")
    text = "\n".join(lines)
    if not markdown:
        text = text.replace(sep + "\n", "")
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="toy size (smoke test)")
    ap.add_argument("--requests", type=int, default=4_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--alpha", type=float, default=1.05)
    ap.add_argument("--capacity", type=int, default=None, help="slots (default keys / 100)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.keys, args.repeats = 20_000, 2_000, 1
    capacity = args.capacity or max(1, args.keys // 100)
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    rows, belady = run(args.requests, args.keys, args.alpha, capacity, policies, args.repeats)
    header = (f"Zipf alpha {args.alpha}, {args.keys} distinct keys, {args.requests} requests, "
              f"capacity {capacity} slots, median of {args.repeats} interleaved runs; "
              f"{cpu_line()}, commit {commit()}")
    print(render(rows, belady, header, args.markdown))
    return rows


if __name__ == "__main__":
    main()

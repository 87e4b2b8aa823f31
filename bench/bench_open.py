"""What integrity checks cost: opening a store and its SCM row file, and reading rows whose
pages are checked on first touch.

1. The LMDB tree check run at every open (``sdm.tiers.lmdb_check``): walks the live B-trees'
   branch and leaf pages.
2. ``Store.open`` under ``sdm-nand`` plus a first lookup of 1,000 spread rows: with v4 row
   files the header and page-CRC table are checked at open and each data page when first
   read, so this costs what it touches, not the table's size.
3. ``MmapTier.read_rows`` of 2,000 random rows while the file still has unchecked pages (the
   per-row bitmap pass) and after every page is checked, against a bare ``np.take`` of the
   same rows from the mapping.

Run: ``python bench/bench_open.py [--rows 1000000] [--reps 5]`` (builds a store under
``--dir`` once); ``--quick`` is 20,000 rows and one rep (the smoke test). Figures are medians
of ``--reps`` runs; record them in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time

import lmdb
import numpy as np

import sdm
from sdm.tiers.manifest import Manifest
from sdm.tiers import MmapTier
from sdm.tiers.lmdb import RowDB
from sdm.tiers.lmdb_check import check_tree
from machine import cpu_line  # bench/machine.py

DIM = 64


def build(path: str, rows: int) -> None:
    if os.path.exists(path):
        return
    rng = np.random.default_rng(0)
    with sdm.Store.create(path, [sdm.TableSpec("t", rows, DIM)]) as store:
        store.write_table("t", rng.standard_normal((rows, DIM), dtype=np.float32), progress=False)
    with sdm.Store.open(path, config="sdm-nand") as store:  # builds the row file
        store.lookup("t", [0])


def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default="/tmp/sdm-bench-open")
    ap.add_argument("--quick", action="store_true", help="toy size smoke test: 20,000 rows, 1 rep")
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.reps = 20_000, 1
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, f"t-{args.rows}")
    build(path, args.rows)
    data = os.path.join(path, "rows.lmdb", "data.mdb")
    env = lmdb.open(os.path.dirname(data), readonly=True, lock=False)
    psize, txnid = env.stat()["psize"], env.info()["last_txnid"]
    env.close()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    print(f"# bench_open: 1 table x {args.rows:,} x {DIM} fp32, LMDB {os.path.getsize(data) / 2**20:.0f} MiB, "
          f"{cpu_line()}, commit {commit}\n")

    tree = median_ms(lambda: check_tree(data, psize, txnid), args.reps)
    spread = np.arange(0, args.rows, max(1, args.rows // 1000))

    def open_and_look():
        with sdm.Store.open(path, config="sdm-nand") as store:
            store.lookup("t", spread)

    first = median_ms(open_and_look, args.reps)

    db = RowDB(path)
    tier = MmapTier(db, path)
    layout = Manifest.read(path).tables[0]
    ids = np.unique(np.random.default_rng(1).integers(0, args.rows, 2000))
    out = np.empty((len(ids), layout.spec.row_bytes), np.uint8)
    tier.read_rows(layout, ids, out)
    rf = tier._file(layout)
    loops = 2000

    def per_call_us(fn):
        return median_ms(lambda: [fn() for _ in range(loops)], args.reps) * 1e3 / loops

    bare = per_call_us(lambda: np.take(rf.rows, ids, axis=0, out=out))
    warming = per_call_us(lambda: tier.read_rows(layout, ids, out))
    unchecked = rf.unchecked
    tier.read_rows(layout, np.arange(args.rows), np.empty((args.rows, layout.spec.row_bytes), np.uint8))
    checked = per_call_us(lambda: tier.read_rows(layout, ids, out))
    assert rf.unchecked == 0
    tier.close()
    db.close()
    print("| measure | median |\n|---|---|")
    print(f"| LMDB tree check at open | {tree:.1f} ms |")
    print(f"| open + first lookup of {len(spread):,} spread rows (sdm-nand) | {first:.1f} ms |")
    print(f"| np.take of {len(ids):,} rows from the mapping | {bare:.1f} µs |")
    print(f"| read_rows, {unchecked:,} pages unchecked | {warming:.1f} µs |")
    print(f"| read_rows, every page checked | {checked:.1f} µs |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

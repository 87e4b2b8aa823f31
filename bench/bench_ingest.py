"""Ingest rate and peak memory of ``Store.write_table`` from a stream of chunks.

    python bench/bench_ingest.py            # a 1 GiB fp32 table (4M x 64), in a temp dir
    python bench/bench_ingest.py --quick    # 32 MiB, for the smoke test

Prints rows/s, MB/s and how far peak RSS (VmHWM) rose above the RSS before the write:
the issue's bound is ~300 MB for a 1 GiB table. Chunks are generated on the fly so the
input itself never sits in memory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time

import numpy as np

import sdm
from machine import cpu_line, cpu_model  # bench/machine.py


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def _reset_peak() -> None:
    # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def ingest(path: str, num_rows: int, dim: int, fmt: str, chunk_rows: int) -> dict:
    spec = sdm.TableSpec("big", num_rows, dim, fmt)
    base = (np.arange(chunk_rows * dim, dtype=np.float32) % 251).reshape(chunk_rows, dim)

    def chunks():
        for start in range(0, num_rows, chunk_rows):
            yield base[: min(chunk_rows, num_rows - start)] + np.float32(start % 7)

    with sdm.Store.create(path, [spec], config="ssd") as store:
        _reset_peak()
        rss_before = _status_kb("VmRSS")
        t0 = time.perf_counter()
        store.write_table("big", chunks(), progress=False)
        seconds = time.perf_counter() - t0
        peak = _status_kb("VmHWM")
        check = store.lookup("big", np.array([0, num_rows - 1]))
    expect_last = base[(num_rows - 1) % chunk_rows] + np.float32(((num_rows - 1) // chunk_rows * chunk_rows) % 7)
    if fmt == "fp32" and not np.array_equal(check[1], expect_last):
        raise RuntimeError("ingested rows read back wrong")
    input_bytes = num_rows * dim * 4
    return {"rows": num_rows, "dim": dim, "fmt": fmt, "input_bytes": input_bytes,
            "seconds": round(seconds, 3), "rows_per_s": round(num_rows / seconds),
            "input_mb_per_s": round(input_bytes / seconds / 1e6, 1),
            "peak_rss_rise_mb": round((peak - rss_before) / 1024, 1),
            "store_bytes": os.path.getsize(os.path.join(path, "rows.lmdb", "data.mdb"))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32 MiB instead of 1 GiB")
    parser.add_argument("--fmt", default="fp32", choices=sdm.ROW_FORMATS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    num_rows = (32 << 20) // 256 if args.quick else (1 << 30) // 256
    with tempfile.TemporaryDirectory(prefix="sdm-ingest-") as tmp:
        result = ingest(os.path.join(tmp, "store"), num_rows, 64, args.fmt, chunk_rows=65536)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    result["commit"] = commit
    result["cpu"] = cpu_model()
    if args.json:
        print(json.dumps(result))
    else:
        print(f"ingest {result['rows']:,} rows x {result['dim']} {result['fmt']} "
              f"({result['input_bytes'] / 2**30:.2f} GiB of float32 input) in {result['seconds']:.2f} s: "
              f"{result['rows_per_s']:,} rows/s, {result['input_mb_per_s']} MB/s; "
              f"peak RSS rise {result['peak_rss_rise_mb']} MB; store file {result['store_bytes'] / 2**30:.2f} GiB "
              f"({cpu_line()}, commit {commit})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

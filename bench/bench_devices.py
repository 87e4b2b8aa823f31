"""Device models against their formula, paced waits against the model, and the real disk.

    python bench/bench_devices.py            # 256 MiB row file, 400 batches per point
    python bench/bench_devices.py --quick    # 64 MiB, 60 batches (a few seconds)
    python bench/bench_devices.py --json     # machine-readable

For every device preset, random single-block reads of the SCM row file through
``Metered(MmapTier, device)`` at queue depth 1, 4, 16 and 64, each batch one wave of ``qd``
reads of distinct blocks (64-byte rows, so a row never straddles a block):

* ``modeled``: reads and modeled time come from the clock; latency per read and IOPS must
  equal the formula ``max(L, qd / IOPS)`` (and the bandwidth cap) exactly;
* ``paced``: the wall-clock time of each batch against its modeled time; the target is
  within 10% where the modeled latency is >= 20 µs (below that, a Python call's own
  overhead of a few µs dominates);
* ``direct``: the same row file read with O_DIRECT (page cache dropped first with
  ``posix_fadvise(DONTNEED)``, every page read once), one worker thread per queue slot:
  the real disk's latency and IOPS. The peers in the same process: a bare ``os.preadv``
  O_DIRECT loop (sdm's overhead), and buffered reads of pages just read (what the page
  cache would have reported instead).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

import sdm
from sdm.tiers.clock import SimClock
from sdm.tiers.manifest import Manifest
from sdm.tiers import Metered, MmapTier
from sdm.tiers.lmdb import RowDB
from sdm.tiers.rowfile import rowfile_path
from machine import cpu_line  # noqa: E402 (bench/machine.py)

QDS = (1, 4, 16, 64)
ROW_BYTES = 64  # int8 rows of dim 56: divides every device block, so no row straddles
PAGE = 4096


def build_store(path: str, num_rows: int) -> None:
    spec = sdm.TableSpec("rows", num_rows, ROW_BYTES - 8, "int8")
    chunk = 1 << 16
    base = np.random.default_rng(0).standard_normal((chunk, spec.dim)).astype(np.float32)

    def chunks():
        for start in range(0, num_rows, chunk):
            yield base[: min(chunk, num_rows - start)] + np.float32(start % 5)

    with sdm.Store.create(path, [spec], config="ssd") as store:
        store.write_table("rows", chunks(), progress=False)


def block_batches(rng, num_rows: int, block_bytes: int, qd: int, batches: int) -> list[np.ndarray]:
    """``batches`` arrays of ``qd`` sorted row ids, each in its own block (distinct blocks)."""
    rows_per_block = block_bytes // ROW_BYTES
    blocks = num_rows // rows_per_block
    picks = rng.choice(blocks, size=min(blocks, qd * batches), replace=False)
    picks = np.resize(picks, qd * batches).reshape(batches, qd)
    return [np.sort(p).astype(np.int64) * rows_per_block for p in picks]


def model_points(db, directory, layout, batches: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    points = []
    for device in sdm.DEVICES.values():
        for qd in QDS:
            ids = block_batches(rng, layout.spec.num_rows, device.access_bytes, qd, batches)
            out = np.empty((qd, ROW_BYTES), dtype=np.uint8)
            point = {"device": device.name, "qd": qd,
                     "formula_latency_us": device.latency_ns(qd) / 1e3,
                     "formula_iops": device.iops(qd)}
            for mode in ("modeled", "paced"):
                tier = Metered(MmapTier(db, directory), device, SimClock(), io_mode=mode, queue_depth=qd)
                tier.read_rows(layout, ids[0], out)  # opens the row file outside the timing
                tier = Metered(tier.inner, device, SimClock(), io_mode=mode, queue_depth=qd)
                walls = []
                for batch in ids:
                    t0 = time.perf_counter_ns()
                    tier.read_rows(layout, batch, out)
                    walls.append(time.perf_counter_ns() - t0)
                s = tier.stats()
                tier.close()
                if mode == "modeled":
                    point["reads"] = s["reads"]
                    point["modeled_latency_us"] = s["modeled_ns"] / batches / 1e3  # one wave per batch
                    point["modeled_iops"] = s["reads"] / (s["modeled_ns"] / 1e9)
                else:
                    point["paced_latency_us"] = float(np.median(walls)) / 1e3
            point["paced_error"] = point["paced_latency_us"] / point["modeled_latency_us"] - 1
            points.append(point)
    return points


def direct_points(db, directory, layout, reads_per_qd: int, seed: int) -> dict:
    path = rowfile_path(directory, layout)
    pages = -(-layout.spec.num_rows * layout.spec.row_bytes // PAGE)  # data pages (the CRC table follows)
    rng = np.random.default_rng(seed)
    order = rng.permutation(pages)  # every page read at most once: nothing to re-hit
    rows_per_page = PAGE // ROW_BYTES
    inner = MmapTier(db, directory)  # opened (header and page table verified) before the timing
    inner.read_rows_direct(layout, np.zeros(1, dtype=np.int64), np.empty((1, ROW_BYTES), np.uint8))
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    result = {"file_mib": os.path.getsize(path) / 2**20, "points": []}
    os.sync()  # the store was just written: let writeback finish before timing reads
    bare_fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    bare_buf = mmap.mmap(-1, PAGE)
    used = 0

    def fresh_pages(n: int) -> np.ndarray:
        # Pages in the permuted order, each read once (a toy file wraps around).
        nonlocal used
        picked = order[(used + np.arange(n)) % pages]
        used += n
        return picked

    def bare(n: int) -> int:
        # Peer: a bare O_DIRECT preadv loop at QD 1 over fresh pages (sdm's overhead is the gap).
        todo = fresh_pages(n).tolist()
        t0 = time.perf_counter_ns()
        for p in todo:
            os.preadv(bare_fd, [bare_buf], PAGE + p * PAGE)
        return time.perf_counter_ns() - t0

    bare(200)  # warm-up: the first reads after writeback are the slowest
    bare_ns = bare_reads = 0
    for qd in QDS:
        per_call = max(32, 4 * qd)  # several waves per call amortize the per-call Python work
        calls = max(1, reads_per_qd // per_call)
        tier = Metered(inner, "nand-p4500", SimClock(), io_mode="direct", queue_depth=qd)
        out = np.empty((per_call, ROW_BYTES), dtype=np.uint8)
        wall = 0
        for c in range(calls):
            ids = np.unique(fresh_pages(per_call)).astype(np.int64) * rows_per_page
            t0 = time.perf_counter_ns()
            tier.read_rows(layout, ids, out[:len(ids)])
            wall += time.perf_counter_ns() - t0
            if qd == 1:  # interleaved with sdm's QD 1 calls, so both see the same disk
                bare_ns += bare(per_call)
                bare_reads += per_call
        reads = tier.stats()["reads"]
        result["points"].append({"qd": qd, "reads": reads, "latency_us": wall * qd / reads / 1e3,
                                 "iops": reads / (wall / 1e9)})
    os.close(bare_fd)
    inner.close()
    result["bare_preadv_qd1_us"] = bare_ns / max(1, bare_reads) / 1e3
    # What the page cache reports: buffered reads of pages read just before (warm).
    fd = os.open(path, os.O_RDONLY)
    warm = fresh_pages(min(2000, pages)).tolist()
    for p in warm:
        os.pread(fd, PAGE, PAGE + p * PAGE)
    t0 = time.perf_counter_ns()
    for p in warm:
        os.pread(fd, PAGE, PAGE + p * PAGE)
    result["page_cache_warm_us"] = (time.perf_counter_ns() - t0) / max(1, len(warm)) / 1e3
    os.close(fd)
    return result


def machine() -> str:
    return f"{platform.system()} {platform.release()}, {cpu_line()}"


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def render(report: dict) -> str:
    lines = [f"machine: {report['machine']}; commit {report['commit']}; {report['command']}", "",
             "| device | qd | formula lat µs | modeled lat µs | formula IOPS | modeled IOPS | paced lat µs | paced err |",
             "|---|---|---|---|---|---|---|---|"]
    for p in report["model"]:
        mark = "" if p["modeled_latency_us"] < 20 else (" ✓" if abs(p["paced_error"]) <= 0.10 else " ✗")
        lines.append(f"| {p['device']} | {p['qd']} | {p['formula_latency_us']:.3f} | {p['modeled_latency_us']:.3f} "
                     f"| {p['formula_iops']:,.0f} | {p['modeled_iops']:,.0f} | {p['paced_latency_us']:.2f} "
                     f"| {p['paced_error']:+.1%}{mark} |")
    d = report["direct"]
    lines += ["", f"direct (O_DIRECT, {d['file_mib']:.0f} MiB row file, page cache dropped, each page read once):", "",
              "| qd | reads | latency µs | IOPS |", "|---|---|---|---|"]
    for p in d["points"]:
        lines.append(f"| {p['qd']} | {p['reads']} | {p['latency_us']:.1f} | {p['iops']:,.0f} |")
    lines += ["", f"peers: bare os.preadv O_DIRECT loop at QD 1: {d['bare_preadv_qd1_us']:.1f} µs/read "
                  f"(sdm direct QD 1 / bare = {d['points'][0]['latency_us'] / d['bare_preadv_qd1_us']:.2f}x); "
                  f"buffered read of a warm page: {d['page_cache_warm_us']:.2f} µs",
              "", "targets: " + "; ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in report["targets"].items())]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="64 MiB row file, 60 batches per point")
    parser.add_argument("--rows", type=int, help="rows of 64 bytes in the row file (overrides --quick)")
    parser.add_argument("--batches", type=int, help="batches per (device, qd) point")
    parser.add_argument("--direct-reads", type=int, help="O_DIRECT reads per queue depth")
    parser.add_argument("--dir", help="work directory (default: a temp dir on /tmp)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = args.rows or ((64 << 20) // ROW_BYTES if args.quick else (256 << 20) // ROW_BYTES)
    batches = args.batches or (60 if args.quick else 400)
    direct_reads = args.direct_reads or (1000 if args.quick else 4000)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="sdm-bench-devices-") as work:
        path = os.path.join(work, "store")
        t0 = time.perf_counter()
        build_store(path, rows)
        db = RowDB(path)
        layout = Manifest.read(path).tables[0]
        tier = MmapTier(db, path)
        tier.read_rows(layout, np.zeros(1, dtype=np.int64), np.empty((1, ROW_BYTES), np.uint8))
        tier.close()  # the row file now exists
        built = time.perf_counter() - t0
        model = model_points(db, path, layout, batches, args.seed)
        direct = direct_points(db, path, layout, direct_reads, args.seed + 1)
        db.close()
    # one wave per batch: the device queue charges a lone batch max(L, qd / IOPS) exactly; the
    # stats round the summed float charges once, so allow a nanosecond
    exact = all(abs(p["modeled_latency_us"] - p["formula_latency_us"]) <= 1e-3
                and abs(p["modeled_iops"] / p["formula_iops"] - 1) < 1e-3 for p in model)
    paced = all(abs(p["paced_error"]) <= 0.10 for p in model if p["modeled_latency_us"] >= 20)
    report = {
        "machine": machine(), "commit": commit(),
        "command": "python bench/bench_devices.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "rows": rows, "batches": batches, "setup_s": built, "model": model, "direct": direct,
        "targets": {"modeled = formula": exact, "paced within 10% (>= 20 µs)": paced,
                    "direct QD1 > 10 µs (page cache bypassed)": direct["points"][0]["latency_us"] > 10},
    }
    print(json.dumps(report, indent=1) if args.json else render(report))
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())

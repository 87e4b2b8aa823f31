"""Direct reads through the IO engine: kernel AIO from the caller against reader threads.

    python bench/bench_io_engine.py              # 1 GiB file, 3,000 pages a request, 7 rounds
    python bench/bench_io_engine.py --quick      # 64 MiB, 300 pages, 2 rounds (seconds)
    python bench/bench_io_engine.py --json OUT   # the figures, machine-readable

A file of random bytes on the working disk is read with O_DIRECT in random distinct 4 KiB
pages, a request of ``--pages`` pages at a time, through an :class:`sdm.tiers.io_engine.IOEngine`
of each submission (``aio``, ``threads``) at each queue depth, by 1 and 2 requesting threads
at once. The two submissions alternate round by round in one process, and each figure is the
median over rounds: requests' wall time, reads per second, and the process's CPU time per
read (all threads: the requests' and the readers'), with the ratio aio / threads.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from machine import commit, cpu_line
from sdm.tiers.io_engine import SUBMISSIONS, IOEngine, default_submission

PAGE = 4096


def make_file(path: str, mib: int) -> None:
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes())
        os.fsync(f.fileno())


def one_round(engine: IOEngine, pool: ThreadPoolExecutor, bufs: list, fd: int, npages: int, pages: int,
              qd: int, rng) -> tuple[float, float]:
    """(seconds of wall time, process CPU seconds) for ``len(bufs)`` threads of ``pool`` (kept
    from round to round, as a server's are) reading ``pages`` random distinct pages each into
    their buffer, at queue depth ``qd``, at once."""
    callers = len(bufs)
    lists = [rng.choice(npages, pages, replace=False).tolist() for _ in range(callers)]
    start = threading.Barrier(callers + 1)

    def request(i):
        start.wait(60)
        return engine.read_pages(fd, lists[i], memoryview(bufs[i])[:pages * PAGE], PAGE, qd)

    futures = [pool.submit(request, i) for i in range(callers)]
    cpu0, t0 = time.process_time(), time.perf_counter()
    start.wait(60)
    short = [f.result(600) for f in futures]
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if any(short):
        raise RuntimeError("short read")
    return wall, cpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="64 MiB, 300 pages, 2 rounds")
    ap.add_argument("--file-mib", type=int, default=1024)
    ap.add_argument("--pages", type=int, default=3000, help="pages a request reads")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--qd", type=int, nargs="+", default=[1, 4, 16, 55])
    ap.add_argument("--callers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--dir", default=None, help="where the file goes (default: the working directory)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.file_mib, args.pages, args.rounds = 64, 300, 2
    kinds = list(SUBMISSIONS) if default_submission() == "aio" else ["threads"]
    print(cpu_line())
    print(f"commit {commit()}; {args.file_mib} MiB file, {args.pages} random 4 KiB pages a request, "
          f"{args.rounds} rounds, submissions {kinds}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="sdm-io-", dir=args.dir or os.getcwd()) as tmp:
        path = os.path.join(tmp, "pages.bin")
        make_file(path, args.file_mib)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        npages = args.file_mib * (1 << 20) // PAGE
        rng = np.random.default_rng(1)
        try:
            for qd in args.qd:
                for callers in args.callers:
                    engines = {k: IOEngine(f"bench-{k}", qd * callers, k) for k in kinds}
                    # page aligned, as O_DIRECT needs, and reused, as the tiers' buffers are
                    bufs = [mmap.mmap(-1, args.pages * PAGE) for _ in range(callers)]
                    got = {k: [] for k in kinds}
                    with ThreadPoolExecutor(callers) as pool:
                        for k, e in engines.items():  # compile, start and touch outside the timing
                            one_round(e, pool, bufs, fd, npages, args.pages, qd, rng)
                        for _ in range(args.rounds):
                            for k in kinds:
                                got[k].append(one_round(engines[k], pool, bufs, fd, npages, args.pages, qd, rng))
                    for e in engines.values():
                        e.close()
                    for b in bufs:
                        b.close()
                    reads = args.pages * callers
                    row = {"qd": qd, "callers": callers}
                    for k in kinds:
                        wall = float(np.median([w for w, _ in got[k]]))
                        row[k] = {"ms_per_request": wall * 1e3, "reads_per_s": reads / wall,
                                  "cpu_us_per_read": float(np.median([c for _, c in got[k]])) / reads * 1e6}
                    rows.append(row)
                    line = "  ".join(f"{k}: {row[k]['reads_per_s']:8,.0f} reads/s "
                                     f"{row[k]['cpu_us_per_read']:5.2f} us CPU/read" for k in kinds)
                    ratio = ""
                    if len(kinds) == 2:
                        a, t = row["aio"], row["threads"]
                        ratio = (f"  aio/threads: CPU {a['cpu_us_per_read'] / t['cpu_us_per_read']:.2f}x,"
                                 f" reads/s {a['reads_per_s'] / t['reads_per_s']:.2f}x")
                    print(f"qd {qd:3d} x {callers} callers  {line}{ratio}", flush=True)
        finally:
            os.close(fd)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_line(), "commit": commit(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

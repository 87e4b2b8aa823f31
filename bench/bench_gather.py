"""Pooled-gather (SparseLengthsSum) benchmark: sdm.embedding_bag against its peers.

Reports ns per looked-up row and GB/s of row bytes (looked-up rows x row bytes / time) for a
``rows x dim`` table, ``bags`` bags of ``pool`` lookups, uniform and Zipf(1.05) ids (Zipf
ranks scattered over the table by a fixed permutation, so hot rows are not neighbours), at
1 and 2 threads. Peers in the same process, interleaved call by call:

* ``sdm-<fmt>``: ``sdm.embedding_bag`` (validates, allocates its output), ``sdm-fp32-pool``:
  the internal ``sdm.kernels.pooling.pool`` fast path the store calls (no checks, caller's ``out``),
* ``numpy``: ``take`` + ``add.reduceat`` (the obvious vectorized reference),
* ``torch``: ``torch.nn.functional.embedding_bag(mode="sum")`` (FBGEMM on CPU),
* ``torch-int8``: ``torch.ops.quantized.embedding_bag_byte_rowwise_offsets`` over a table
  made by ``embedding_bag_byte_prepack`` (the same bytes as ``sdm.quantize_rows(.., "int8")``).

Every timed call gets a different pre-generated batch: a batch repeated call after call sits
in the CPU caches and flatters every contender. The figure per case is the median over
``--reps`` calls; the 10th percentile is printed too, since on a shared machine the median of
a 2-thread run mostly measures who else holds a core, and so is the median over rounds of each
call's time over its peer's call in the same round (``paired``), which holds up better while
other jobs load the machine. Run::

    .venv/bin/python bench/bench_gather.py            # 1M x 64, B = 2048, pool 20
    .venv/bin/python bench/bench_gather.py --quick    # toy size smoke test
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

# OpenMP threads that spin-wait between parallel regions (libgomp's default) starve each other
# on a 2-core machine shared with other jobs: when both threads of a call land on one core, the
# call waits for scheduler ticks (measured: ~8 ms a call, 195 ns/row for sdm and torch alike).
# Blocking waits avoid that. Both runtimes (Numba's libgomp and torch's) read this when they
# load, so it is set before either is imported; `--omp-wait default` leaves it unset.
if "--omp-wait" not in " ".join(sys.argv) or "--omp-wait passive" in " ".join(sys.argv):
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numba
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sdm  # noqa: E402
from machine import cpu_line, isa_line  # noqa: E402 (bench/machine.py)
from sdm.kernels.dedup import unique_inverse  # noqa: E402
from sdm.kernels.memory import huge_empty  # noqa: E402
from sdm.kernels.pooling import pool  # noqa: E402

try:
    import torch
except ImportError:  # torch is a bench/test-only peer
    torch = None


def zipf_ranks(rng, n_items: int, size: int, alpha: float) -> np.ndarray:
    """``size`` ranks in ``[0, n_items)`` with P(rank k) proportional to ``(k + 1) ** -alpha``."""
    cdf = np.cumsum(np.arange(1, n_items + 1, dtype=np.float64) ** -alpha)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(size)), n_items - 1)


def make_batches(rng, dist: str, n_rows: int, n_batches: int, nnz: int, perm) -> list:
    if dist == "uniform":
        return [rng.integers(0, n_rows, nnz, dtype=np.int64) for _ in range(n_batches)]
    ranks = zipf_ranks(rng, n_rows, n_batches * nnz, 1.05)
    ids = perm[ranks].astype(np.int64)
    return [ids[i * nnz:(i + 1) * nnz].copy() for i in range(n_batches)]


def in_huge_pages(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` in transparent huge pages (``sdm.kernels.memory``)."""
    out = huge_empty(a.shape, a.dtype)
    out[...] = a
    return out


def numpy_bag(table, ids, offsets):
    """Sum-pool with numpy; ``reduceat`` is wrong for empty bags, which this bench never makes."""
    return np.add.reduceat(table[ids], offsets[:-1], axis=0)


def build_contenders(tables, offsets, with_numpy: bool, huge_pages: bool = False):
    """name -> (row_bytes, fn(ids) -> result, peer name for the ratio or None)."""
    t32, t16, t8 = tables
    nbags = offsets.shape[0] - 1
    dim = t32.shape[1]
    out = np.empty((nbags, dim), dtype=np.float32)
    c = {}
    # the public API as a user calls it: validation of ids/offsets and a fresh output each call,
    # like torch's functional call; `sdm-fp32-pool` is the store's internal path (no checks, out=)
    eb = sdm.embedding_bag
    c["sdm-fp32"] = (dim * 4, lambda ids: eb(t32, ids, offsets, fmt="fp32"), "torch")
    c["sdm-fp16"] = (dim * 2, lambda ids: eb(t16, ids, offsets, fmt="fp16"), "torch")
    c["sdm-int8"] = (t8.shape[1], lambda ids: eb(t8, ids, offsets, fmt="int8"), "torch-int8")
    c["sdm-fp32-pool"] = (dim * 4, lambda ids: pool(t32, ids, offsets, None, False, "fp32", out), "torch")
    if with_numpy:
        c["numpy"] = (t32.shape[1] * 4, lambda ids: numpy_bag(t32, ids, offsets), "torch")
    if torch is not None:
        w32 = torch.from_numpy(t32)
        w8 = torch.ops.quantized.embedding_bag_byte_prepack(w32)
        if huge_pages:  # torch's int8 table in huge pages too
            w8 = torch.from_numpy(in_huge_pages(w8.numpy()))
        toff = torch.from_numpy(offsets)
        f = torch.nn.functional.embedding_bag
        q = torch.ops.quantized.embedding_bag_byte_rowwise_offsets
        c["torch"] = (t32.shape[1] * 4, lambda ids: f(torch.from_numpy(ids), w32, toff, mode="sum",
                                                      include_last_offset=True), None)
        c["torch-int8"] = (w8.shape[1], lambda ids: q(w8, torch.from_numpy(ids), toff, False, 0, False,
                                                      None, None, True), None)
    return c


def bench_dedup(batches, reps: int):
    """Median seconds of unique_inverse and np.unique(return_inverse=True), interleaved."""
    unique_inverse(batches[0])
    t_sdm, t_np = [], []
    for r in range(reps):
        ids = batches[r % len(batches)]
        t0 = time.perf_counter()
        unique_inverse(ids)
        t1 = time.perf_counter()
        np.unique(ids, return_inverse=True)
        t2 = time.perf_counter()
        t_sdm.append(t1 - t0)
        t_np.append(t2 - t1)
    return float(np.median(t_sdm)), float(np.median(t_np))


def set_threads(n: int) -> None:
    numba.set_num_threads(n)
    if torch is not None:
        torch.set_num_threads(n)


def run_case(contenders, batches, reps: int, numpy_every: int):
    """Seconds per call of each contender (median, 10th percentile) and, per round, the
    call's time over its peer's in the same round (median of those ratios); calls
    interleaved, a fresh batch each call."""
    names = list(contenders)
    times = {n: [] for n in names}
    rounds = {n: [] for n in names}  # (round, seconds)
    nb = len(batches)
    for n in names:  # warm-up: compile, first touch of the threads
        for i in range(3):
            contenders[n][1](batches[i % nb])
    k = 0
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]  # rotate who goes first
        for n in order:
            if n == "numpy" and r % numpy_every:
                continue
            ids = batches[k % nb]
            k += 1
            t0 = time.perf_counter()
            contenders[n][1](ids)
            times[n].append(time.perf_counter() - t0)
            rounds[n].append((r, times[n][-1]))
    res = {}
    for n, v in times.items():
        peer = contenders[n][2]
        paired = float("nan")
        if peer in rounds:
            by_round = dict(rounds[peer])
            paired = float(np.median([t / by_round[r] for r, t in rounds[n] if r in by_round]))
        res[n] = (float(np.median(v)), float(np.percentile(v, 10)), paired)
    return res


def machine() -> str:
    def sh(cmd):
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
        except OSError:
            return "?"
    commit = sh("git -C %s rev-parse --short HEAD" % os.path.dirname(os.path.abspath(__file__)))
    torch_isa = f"; torch's CPU capability {torch.backends.cpu.get_cpu_capability()}" if torch else ""
    return (f"{cpu_line()}\n{isa_line()}{torch_isa}\n{sh('uname -a')}\nnproc {sh('nproc')}; {platform.python_version()}; numba {numba.__version__}; "
            f"numpy {np.__version__}; torch {torch.__version__ if torch else 'absent'}; "
            f"threading layer {numba.threading_layer()}; commit {commit}\n"
            + sh("lscpu | grep -E 'Model name|L2 cache|L3 cache'"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="toy size smoke test")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--bags", type=int, default=2048)
    ap.add_argument("--pool", type=int, default=20)
    ap.add_argument("--reps", type=int, default=150, help="timed calls per contender and case")
    ap.add_argument("--batches", type=int, default=64, help="distinct pre-generated batches")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--no-numpy", action="store_true")
    ap.add_argument("--only", default="", help="comma list of contenders to run")
    ap.add_argument("--huge-pages", action="store_true",
                    help="every contender's table in transparent huge pages (torch's shares them)")
    ap.add_argument("--omp-wait", choices=["passive", "default"], default="passive",
                    help="OMP_WAIT_POLICY for both OpenMP runtimes (set before import)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.bags, args.reps, args.batches = 10_000, 64, 5, 4

    rng = np.random.default_rng(2024)
    t32 = rng.standard_normal((args.rows, args.dim), dtype=np.float32)
    t16 = t32.astype(np.float16)
    t8 = sdm.quantize_rows(t32, "int8")
    if args.huge_pages:  # torch.from_numpy shares these; its int8 table is copied in below
        t32, t16, t8 = (in_huge_pages(t) for t in (t32, t16, t8))
    offsets = np.arange(0, (args.bags + 1) * args.pool, args.pool, dtype=np.int64)
    nnz = args.bags * args.pool
    perm = rng.permutation(args.rows)
    contenders = build_contenders((t32, t16, t8), offsets, not args.no_numpy, args.huge_pages)
    if args.only:
        keep = set(args.only.split(","))
        contenders = {k: v for k, v in contenders.items() if k in keep}

    print(cpu_line())
    print(isa_line())
    print(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; tables in "
          f"{'huge pages' if args.huge_pages else 'numpy memory (4 KiB pages)'}")
    print(f"table {args.rows} x {args.dim}, B = {args.bags}, pool {args.pool} "
          f"({nnz} rows per call), median of {args.reps} calls, {args.batches} distinct batches\n")
    print("| ids | threads | contender | ns/row | GB/s | vs peer | ns/row p10 | vs peer p10 | vs peer paired |")
    print("|---|---|---|---|---|---|---|---|---|")
    dedup = {}
    for dist in ("uniform", "zipf"):
        batches = make_batches(rng, dist, args.rows, args.batches, nnz, perm)
        dedup[dist] = (len(np.unique(batches[0])),) + bench_dedup(batches, args.reps)
        for nt in [int(x) for x in args.threads.split(",")]:
            set_threads(nt)
            res = run_case(contenders, batches, args.reps, numpy_every=10)
            for name, (rb, _, peer) in contenders.items():
                med, p10, paired = res[name]
                ratio = ratio10 = ratio_paired = ""
                if peer in res:
                    ratio = f"{med / res[peer][0]:.2f}x {peer}"
                    ratio10 = f"{p10 / res[peer][1]:.2f}x"
                    ratio_paired = f"{paired:.2f}x"
                print(f"| {dist} | {nt} | {name} | {med * 1e9 / nnz:.1f} | {nnz * rb / med / 1e9:.1f} | "
                      f"{ratio} | {p10 * 1e9 / nnz:.1f} | {ratio10} | {ratio_paired} |", flush=True)
    print(f"\nbatch dedup of {nnz} ids (one thread): sdm.kernels.dedup.unique_inverse vs "
          f"np.unique(return_inverse=True), median of {args.reps}\n")
    print("| ids | distinct | unique_inverse us | np.unique us | ratio |")
    print("|---|---|---|---|---|")
    for dist, (u, a, b) in dedup.items():
        print(f"| {dist} | {u} | {a * 1e6:.0f} | {b * 1e6:.0f} | {a / b:.2f}x |")
    print()
    print(machine())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

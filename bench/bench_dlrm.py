"""DLRM inference benchmark: sdm.model (numpy + Numba) against an equivalent torch model.

The shape is the reference DLRM's benchmark (``bench/dlrm_s_benchmark.sh``, the
``dlrm-bench`` preset) scaled to 8 tables x 1M rows x dim 64: bottom MLP 512-512-64, top MLP
(100)-1024-1024-1024-1, dot interaction, B = 2048 samples, 20 lookups per bag, uniform ids.
Both models carry the same weights; torch's ``EmbeddingBag`` tables share sdm's arrays
(``torch.from_numpy``), so the tables are in memory once.

Contenders, in the same process, interleaved call by call (the order rotates each round),
each call on a freshly generated batch (a batch repeated call after call sits in the CPU
caches and flatters everyone):

* ``sdm``: ``model.forward`` with the lookups in a worker thread beside the bottom MLP;
* ``sdm-serial``: the same, lookups then bottom MLP in one thread (``overlap=False``);
* ``sdm-serial-kpar`` (2+ threads): serial, each table's kernel parallel over all threads
  (``table_parallel=False``) instead of tables spread over worker threads;
* ``sdm-split`` (2+ threads): overlapped, the lookups on half the threads
  (``lookup_threads``) so they do not fight BLAS for every core;
* ``sdm-store`` (``--store PRESET``): overlapped, the rows served by an :class:`sdm.Store`;
* ``torch``: nn.Linear / F.embedding_bag(mode="sum") / bmm, under ``torch.inference_mode``.

Ratios against torch: the ratio of medians, and the median over rounds of each round's
ratio (sdm and torch called back to back), which holds up better while other jobs load the
machine.

Threads: numba.set_num_threads, torch.set_num_threads, and numpy's OpenBLAS through its
``*_set_num_threads`` entry point (threadpoolctl when installed); when neither is reachable
each thread count runs in a subprocess with ``OPENBLAS_NUM_THREADS`` set. At "1 thread" the
``sdm`` contender still has two OS threads busy (one BLAS thread, one lookup thread);
``sdm-serial`` is the strict one-core figure.

Run::

    .venv/bin/python bench/bench_dlrm.py              # full size (2 GB of tables)
    .venv/bin/python bench/bench_dlrm.py --quick      # toy size smoke test
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numba
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sdm.host.blas import _openblas  # noqa: E402 (numpy's OpenBLAS thread calls, found once)
from sdm.model import DLRM, ModelPreset, Profiler  # noqa: E402
from machine import cpu_line, isa_line  # noqa: E402 (bench/machine.py)

try:
    import torch
except ImportError:  # torch is a bench/test-only peer
    torch = None

STAGES = ("bottom_s", "embeddings_s", "interaction_s", "top_s")


# -- threads ---------------------------------------------------------------------------------

def blas_thread_control():
    """A function ``set(n)`` for numpy's BLAS threads, or None when it cannot be set here."""
    try:
        import threadpoolctl
        return lambda n: threadpoolctl.threadpool_limits(n, user_api="blas")
    except ImportError:
        pass
    found = _openblas()
    if found is None:
        return None
    set_fn, get_fn = found

    def set_threads(n):
        set_fn(ctypes.c_int(n))
        if get_fn() != n:
            raise RuntimeError(f"OpenBLAS kept {get_fn()} threads after asking for {n}")
    return set_threads


def set_threads(n: int, blas) -> None:
    numba.set_num_threads(n)
    if torch is not None:
        torch.set_num_threads(n)
    if blas is not None:
        blas(n)


# -- models ----------------------------------------------------------------------------------

def arch(args) -> ModelPreset:
    return ModelPreset("bench", args.dim, tuple(args.bottom), tuple(args.top), (args.rows,) * args.tables,
                       args.pool, "dot", False, source="dlrm-bench scaled (bench/bench_dlrm.py)")


class TorchDLRM:
    """The same DLRM in torch, sharing sdm's tables (no copy)."""

    def __init__(self, m: DLRM):
        def linears(mlp):
            return [(torch.from_numpy(w.copy()), torch.from_numpy(b.copy())) for w, b in zip(mlp.weights, mlp.biases)]
        self.bottom = linears(m.bottom)
        self.top = linears(m.top)
        self.tables = [torch.from_numpy(t) for t in m.sparse.tables]
        f = m.num_tables + 1
        self.li, self.lj = torch.tril_indices(f, f, offset=-1)

    def forward(self, dense, sparse, times=None):
        F = torch.nn.functional
        clock = time.perf_counter
        with torch.inference_mode():
            t0 = clock()
            x = dense
            for w, b in self.bottom:
                x = torch.relu(F.linear(x, w, b))
            t1 = clock()
            ly = [F.embedding_bag(ids, t, offs, mode="sum", include_last_offset=True)
                  for t, (ids, offs) in zip(self.tables, sparse)]
            t2 = clock()
            bsz, d = x.shape
            feats = torch.cat([x] + ly, dim=1).view(bsz, -1, d)
            z = torch.bmm(feats, feats.transpose(1, 2))
            r = torch.cat([x, z[:, self.li, self.lj]], dim=1)
            t3 = clock()
            for i, (w, b) in enumerate(self.top):
                r = F.linear(r, w, b)
                r = torch.sigmoid(r) if i == len(self.top) - 1 else torch.relu(r)
            out = r.view(-1)
            t4 = clock()
        if times is not None:
            times.append({"bottom_s": t1 - t0, "embeddings_s": t2 - t1, "interaction_s": t3 - t2,
                          "top_s": t4 - t3, "wall_s": t4 - t0})
        return out


def make_batch(rng, args):
    dense = rng.standard_normal((args.batch, args.bottom[0]), dtype=np.float32)
    nnz = args.batch * args.pool
    offsets = np.arange(0, nnz + 1, args.pool, dtype=np.int64)
    sparse = [(rng.integers(0, args.rows, nnz, dtype=np.int64), offsets) for _ in range(args.tables)]
    return dense, sparse


# -- measurement -----------------------------------------------------------------------------

def run_threads(nthreads: int, args, model: DLRM, peer, blas, store=None) -> dict:
    set_threads(nthreads, blas)
    rng = np.random.default_rng(1000 + nthreads)
    profs = {n: Profiler() for n in ("sdm", "sdm-serial", "sdm-serial-kpar", "sdm-split", "sdm-store")}
    torch_times: list = []

    def call(name, batch):
        dense, sparse = batch
        if name == "torch":
            tb = (torch.from_numpy(dense), [(torch.from_numpy(i), torch.from_numpy(o)) for i, o in sparse])
            t0 = time.perf_counter()
            peer.forward(*tb, times=torch_times)
        else:
            model.lookup_threads = max(1, nthreads // 2) if name == "sdm-split" else None
            model.table_parallel = name != "sdm-serial-kpar"
            t0 = time.perf_counter()
            model.forward(dense, sparse, profile=profs[name], overlap=not name.startswith("sdm-serial"),
                          embeddings=store if name == "sdm-store" else None)
        return time.perf_counter() - t0

    names = ["sdm", "sdm-serial"] + (["sdm-serial-kpar", "sdm-split"] if nthreads > 1 else []) + \
        (["sdm-store"] if store is not None else []) + (["torch"] if peer is not None else [])
    for _ in range(args.warmup):
        for name in names:
            call(name, make_batch(rng, args))
    for p in profs.values():
        p.reset()
    torch_times.clear()
    walls = {n: [] for n in names}
    for r in range(args.reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            walls[name].append(call(name, make_batch(rng, args)))

    result = {"threads": nthreads, "contenders": {}}
    for name in names:
        med = float(np.median(walls[name]))
        if name == "torch":
            stages = {s: float(np.median([t[s] for t in torch_times])) for s in STAGES}
            overlap = 0.0
        else:
            recs = profs[name].records
            stages = {s: float(np.median([getattr(t, s) for t in recs])) for s in STAGES}
            overlap = float(np.median([t.overlap_s for t in recs]))
        paired = (float(np.median(np.array(walls[name]) / np.array(walls["torch"])))
                  if "torch" in walls else None)
        result["contenders"][name] = {"median_s": med, "samples_per_s": args.batch / med,
                                      "paired_ratio": paired,
                                      "min_s": float(np.min(walls[name])), "stages": stages,
                                      "overlap_s": overlap}
    return result


def machine() -> str:
    def sh(cmd):
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "?"
    commit = sh(f"git -C {os.path.dirname(os.path.abspath(__file__))} rev-parse --short HEAD")
    blas = "OpenBLAS (numpy wheel)" if _openblas() else "numpy BLAS"
    tv = torch.__version__ if torch is not None else "absent"
    return (f"{cpu_line()}; Python {platform.python_version()}, numpy {np.__version__} "
            f"({blas}), numba {numba.__version__} ({numba.threading_layer()}), torch {tv}; commit {commit}\n"
            f"{isa_line()}")


def render(results: list, args) -> str:
    lines = ["| threads | contender | batch ms (median) | samples/s | vs torch (ratio of medians) "
             "| vs torch (median of per-round ratios) |", "|---|---|---|---|---|---|"]
    for res in results:
        c = res["contenders"]
        base = c.get("torch", {}).get("median_s")
        for name, v in c.items():
            ratio = f"{v['median_s'] / base:.2f}x" if base else "-"
            paired = f"{v['paired_ratio']:.2f}x" if v.get("paired_ratio") else "-"
            lines.append(f"| {res['threads']} | {name} | {v['median_s'] * 1e3:.1f} | {v['samples_per_s']:,.0f} "
                         f"| {ratio} | {paired} |")
    lines += ["", "Per-stage medians (ms); for `sdm` the lookups run beside the bottom MLP, "
              "`saved` = stage sum - wall:", "",
              "| threads | contender | bottom MLP | embeddings | interaction | top MLP | saved by overlap |",
              "|---|---|---|---|---|---|---|"]
    for res in results:
        for name, v in res["contenders"].items():
            s = v["stages"]
            lines.append(f"| {res['threads']} | {name} | " + " | ".join(f"{s[k] * 1e3:.2f}" for k in STAGES)
                         + f" | {v['overlap_s'] * 1e3:.2f} |")
    return "\n".join(lines)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="toy size, for the smoke test")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--reps", type=int, default=11, help="timed calls per contender and thread count")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--tables", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--pool", type=int, default=20, help="lookups per bag")
    ap.add_argument("--bottom", type=lambda s: [int(x) for x in s.split("-")], default=[512, 512, 64])
    ap.add_argument("--top", type=lambda s: [int(x) for x in s.split("-")], default=[1024, 1024, 1024, 1],
                    help="top MLP widths after the interaction")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--store", metavar="PRESET", help="also run sdm through a store under this hierarchy "
                    "preset (contender sdm-store; writes every table to a temporary store first)")
    ap.add_argument("--workdir", help="directory for the temporary store (default: the system temp dir)")
    ap.add_argument("--json", action="store_true", help="print results as JSON")
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.tables, args.dim, args.batch, args.pool = 5000, 3, 16, 128, 5
        args.bottom, args.top, args.reps, args.warmup = [32, 64, 16], [64, 1], 3, 1
    if args.bottom[-1] != args.dim:
        ap.error(f"--bottom must end in --dim ({args.dim}) for the dot interaction")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    threads = [int(x) for x in args.threads.split(",")]
    blas = blas_thread_control()
    if blas is None and len(threads) > 1 and "OPENBLAS_NUM_THREADS" not in os.environ:
        # BLAS threads are fixed at load time here: one subprocess per thread count.
        argv = list(sys.argv[1:] if argv is None else argv)
        for n in threads:
            env = dict(os.environ, OPENBLAS_NUM_THREADS=str(n), OMP_NUM_THREADS=str(n))
            rest = [a for i, a in enumerate(argv) if not (a.startswith("--threads") or
                                                           (i and argv[i - 1] == "--threads"))]
            code = subprocess.call([sys.executable, os.path.abspath(__file__), *rest, "--threads", str(n)], env=env)
            if code:
                return code
        return 0
    peer_ok = torch is not None and not args.no_torch
    t0 = time.perf_counter()
    model = DLRM.random(arch(args), seed=0, materialize=True)
    peer = TorchDLRM(model) if peer_ok else None
    build_s = time.perf_counter() - t0
    store = None
    with tempfile.TemporaryDirectory(prefix="bench-dlrm-", dir=args.workdir) as tmp:
        if args.store:
            t1 = time.perf_counter()
            store = model.to_store(os.path.join(tmp, "store"), config=args.store, progress=False)
            print(f"store ({args.store}) written in {time.perf_counter() - t1:.1f} s", file=sys.stderr)
        try:
            results = [run_threads(n, args, model, peer, blas, store) for n in threads]
        finally:
            if store is not None:
                store.close()
    model.close()
    if args.json:
        print(json.dumps({"machine": machine(), "args": vars(args), "results": results}, indent=1))
        return 0
    print(f"DLRM inference: {args.tables} tables x {args.rows:,} rows x dim {args.dim} (fp32), bottom "
          f"{'-'.join(map(str, args.bottom))}, top {model.top.widths[0]}-{'-'.join(map(str, args.top))}, dot, "
          f"B = {args.batch}, {args.pool} lookups per bag, uniform ids; median of {args.reps} interleaved calls "
          f"(model built in {build_s:.1f} s)")
    print(machine())
    print()
    print(render(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

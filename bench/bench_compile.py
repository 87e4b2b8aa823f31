"""JIT compile cost of the gather and dedup kernels, measured in fresh processes.

Three child processes share a private ``NUMBA_CACHE_DIR`` (so the repo's own cache is neither
used nor disturbed):

1. **cold**: empty cache. Reports ``import sdm`` time and, per kernel, the first call (compile
   + run) against a second call (run only); their difference is the compile time.
2. **warm**: the cache the cold run wrote. Reports the same, and the time from interpreter
   start to the first pooled result: what a server restart pays.
3. **stale check** (``--check-stale``): copies ``sdm`` to a temp dir and warms its cache; then
   (a) edits the fp32 kernel (its result gains +1): the edited kernel must run, not the
   cached one; (b) edits the hash map's Fibonacci hash in ``kernels/hashmap.py``: the policy
   kernels of ``kernels/policies.py``, which inline it, must be recompiled (cache misses),
   not loaded. Every sdm kernel's cache is stamped with a digest of the whole package
   (:func:`sdm.kernels.jit.source_digest`).

Run::

    .venv/bin/python bench/bench_compile.py [--check-stale]
    .venv/bin/python bench/bench_compile.py --quick    # the cold and one warm run only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from machine import commit, cpu_line  # bench/machine.py

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

CHILD = r"""
import json, sys, time
t_start = float(sys.argv[1])
t0 = time.perf_counter()
import numpy as np
import sdm
from sdm.kernels.dedup import unique_inverse
t_import = time.perf_counter() - t0
rng = np.random.default_rng(0)
x = rng.standard_normal((1000, 64)).astype(np.float32)
tables = {"fp32": x, "fp16": x.astype(np.float16), "int8": sdm.quantize_rows(x, "int8")}
ids = rng.integers(0, 1000, 2000)
offsets = np.arange(0, 2001, 20)
res = {"import_s": t_import}
first_result = None
for fmt, table in tables.items():
    for dtype in (np.int64, np.int32):
        t = time.perf_counter()
        out = sdm.embedding_bag(table, ids.astype(dtype), offsets, fmt=fmt)
        first = time.perf_counter() - t
        if first_result is None:
            first_result = time.time() - t_start
            res["checksum"] = float(out[0, 0])
        t = time.perf_counter()
        sdm.embedding_bag(table, ids.astype(dtype), offsets, fmt=fmt)
        res[f"{fmt}/{np.dtype(dtype).name}"] = (first, time.perf_counter() - t)
t = time.perf_counter()
unique_inverse(ids)
first = time.perf_counter() - t
t = time.perf_counter()
unique_inverse(ids)
res["dedup/int64"] = (first, time.perf_counter() - t)
res["first_result_s"] = first_result
import numba
import sdm.kernels.policies as policy_kernels
keys = rng.zipf(1.2, 20000).astype(np.int64)
res["sim_misses"] = int(sdm.simulate(keys, policy="lru", capacity=100).misses)
disp = [v for v in vars(policy_kernels).values() if isinstance(v, numba.core.dispatcher.Dispatcher)]
res["policy_cache"] = {k: sum(sum(getattr(d.stats, "cache_" + k).values()) for d in disp)
                       for k in ("hits", "misses")}
print(json.dumps(res))
"""


def run_child(cache_dir: str, root: str) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir, PYTHONPATH=root)
    proc = subprocess.run([sys.executable, "-c", CHILD, repr(time.time())], env=env, cwd=root,
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(name: str, res: dict) -> None:
    print(f"\n## {name}: import sdm {res['import_s']:.2f} s, "
          f"interpreter start -> first pooled result {res['first_result_s']:.2f} s")
    print("| kernel | first call (s) | second call (ms) | compile or load (s) |")
    print("|---|---|---|---|")
    total = 0.0
    for k, v in res.items():
        if isinstance(v, list):
            total += v[0] - v[1]
            print(f"| {k} | {v[0]:.3f} | {v[1] * 1e3:.3f} | {v[0] - v[1]:.3f} |")
    print(f"| total | | | {total:.2f} |")


def check_stale(tmp: str) -> bool:
    root = os.path.join(tmp, "copy")
    shutil.copytree(os.path.join(ROOT, "sdm"), os.path.join(root, "sdm"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    cache = os.path.join(tmp, "cache-stale")
    first = run_child(cache, root)
    before, before_sim = first["checksum"], first["sim_misses"]
    again = run_child(cache, root)  # from the cache
    path = os.path.join(root, "sdm", "kernels", "bag.py")
    src = open(path).read()
    marker = "out[b, np.uint64(j0 + j)] = wide[j] * inv\n"
    if src.count(marker) < 1:
        print("stale check: marker not found in bag.py; skipped")
        return False
    # the fp32 core is the first kernel using the marker; +1 on every pooled value
    src = src.replace(marker, "out[b, np.uint64(j0 + j)] = wide[j] * inv + np.float32(1.0)\n", 1)
    with open(path, "w") as f:
        f.write(src)
    edited = run_child(cache, root)
    after = edited["checksum"]
    ok = before == again["checksum"] and abs(after - (before + 1.0)) < 1e-4
    print(f"\nstale check: result {before:.5f}, from cache {again['checksum']:.5f}, after editing the "
          f"kernel {after:.5f} (expected {before + 1:.5f}): {'OK, edit picked up' if ok else 'STALE'}")
    path = os.path.join(root, "sdm", "kernels", "hashmap.py")
    src = open(path).read()
    marker = "(np.uint64(key) * GOLDEN)"  # home_slot's Fibonacci hash
    if marker not in src:
        print("stale check: marker not found in hashmap.py; skipped")
        return False
    with open(path, "w") as f:
        f.write(src.replace(marker, "(np.uint64(key + 1) * GOLDEN)"))  # another valid hash
    warm = run_child(cache, root)  # the bag edit is cached by now; only the hash map changed
    rebuilt = run_child(cache, root)
    ok_map = (again["policy_cache"]["misses"] == 0 and warm["policy_cache"]["misses"] > 0
              and rebuilt["policy_cache"]["misses"] == 0 and warm["sim_misses"] == before_sim)
    print(f"stale check: policy kernels after editing hashmap.py: {warm['policy_cache']} (before: "
          f"{again['policy_cache']}, next run {rebuilt['policy_cache']}); simulate misses "
          f"{warm['sim_misses']} (before {before_sim}): "
          f"{'OK, recompiled' if ok_map else 'STALE: served the old hash map'}")
    return ok and ok_map


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check-stale", action="store_true")
    ap.add_argument("--quick", action="store_true", help="the cold and one warm run only")
    args = ap.parse_args(argv)
    print(f"# bench_compile: {cpu_line()}, commit {commit()}")
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "cache")
        report("cold cache (compile)", run_child(cache, ROOT))
        report("warm cache (load)", run_child(cache, ROOT))
        if not args.quick:
            report("warm cache again", run_child(cache, ROOT))
        if args.check_stale and not check_stale(tmp):
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

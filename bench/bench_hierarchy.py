"""The software-defined memory hierarchy on an RM2-shaped workload.

Workload: RM2's table shape (REFERENCES.md: 500K rows x dim 64, pooling 120, DeepRecSys
``dlrm_rm2.json``), fp32, ``--tables`` tables (8 by default: 1 GiB of rows; 32 is the full
model), served as inference requests: each request is one user x 16 candidate items, the
first half of the tables user-side (the user's bags repeat across the request's items, as
REFERENCES.md describes), 16 requests (256 samples) per batch, Zipf 1.05 ids. The first
``--warm`` batches warm the caches (and are the profile a placement is planned on); the
rest are measured.

Sections:

1. Modeled lookups/s and per-batch latency (p50, p99) for ``dram``, ``sdm-3dxp`` and
   ``sdm-nand`` with the DRAM cache at 5%, 10% and 20% of the table bytes: lookups / modeled
   device time, the time every tier's device model charged the simulated clock.
2. Each feature switched on alone over ``sdm-nand`` at 10%: placement pins (tables and hot
   rows by access density, half the DRAM budget), the co-access block layout of the SCM
   files, lookahead prefetch (depth 2, with a modeled 1 ms of per-batch compute it hides IO
   behind), and the pooled-embedding cache (1% of table bytes).
3. Live data-plane throughput on an all-hit workload: ``store.embedding_bags`` through a
   DRAM cache holding every row the batches touch, against raw ``sdm.embedding_bag`` over
   the same rows as numpy tables (and as tables in huge pages, as the cache's slots are);
   interleaved, median of ``--reps`` rounds. Also the data
   plane alone (pooling from the cache's slots through the planned pointers).
4. The live path by phase, ns per lookup timed in place, all hits and with the cache sized
   for a 50% hit rate over a modeled Optane tier.

Run::

    .venv/bin/python bench/bench_hierarchy.py            # 8 x 500K x 64 fp32 (1 GiB)
    .venv/bin/python bench/bench_hierarchy.py --quick    # toy size smoke test
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import time

import numba
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sdm  # noqa: E402
from machine import cpu_line  # noqa: E402 (bench/machine.py)
from sdm.store.config import HierarchyConfig, TierConfig, with_options  # noqa: E402
from sdm.kernels.dedup import unique_inverse  # noqa: E402
from sdm.kernels.memory import huge_empty  # noqa: E402
from sdm.replay.planner import plan  # noqa: E402
from sdm.kernels.pooling import pool  # noqa: E402
from sdm.store.prefetch import Lookahead  # noqa: E402
from sdm.trace.generate import PROFILES, GeneratedTrace  # noqa: E402

DIM = 64
ITEMS = 16


def workload(tables: int, rows: int, batches: int, seed: int = 0) -> GeneratedTrace:
    """RM2-shaped inference requests (see the module docstring)."""
    rm2 = PROFILES["rm2"]
    profile = dataclasses.replace(
        rm2, name="rm2-inference", kind="inference", table_sizes=(rows,) * tables,
        pooling=rm2.pooling[:1] * tables, alpha=rm2.alpha[:1] * tables, batch_size=256 // ITEMS,
        batches=batches, items_per_request=ITEMS, user_tables=tables // 2, dense=0)
    return GeneratedTrace(profile, seed)


def build_store(path: str, tables: int, rows: int) -> list[np.ndarray]:
    """The store at ``path`` (made once, reused) and its rows as numpy arrays."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((rows, DIM), dtype=np.float32) for _ in range(tables)]
    specs = [sdm.TableSpec(f"t{i}", rows, DIM, "fp32") for i in range(tables)]
    if not os.path.exists(path):
        with sdm.Store.create(path, specs) as store:
            for spec, rows_ in zip(specs, arrays):
                store.write_table(spec.name, rows_, progress=False)
    return arrays


def requests_of(trace) -> list[dict]:
    return [{f"t{t}": (b.indices[t], b.offsets[t]) for t in range(len(b.indices))} for b in trace]


def run_modeled(path, config, batches, warm, *, lookahead=None, compute_ns=0) -> dict:
    """Serve ``batches`` through ``config``; every figure over the batches after ``warm``
    (steady state: counters are differenced against a snapshot taken after the warm ones)."""
    with sdm.Store.open(path, config=config) as store:
        if lookahead is None:
            steps = (_timed(store, b) for b in batches)
        else:
            look = Lookahead(store, lookahead, compute_ns=compute_ns)
            steps = (step.latency_ns for step in look.serve(batches))
        lat_ns = []
        for i, ns in enumerate(steps):
            lat_ns.append(ns)
            if i + 1 == warm:
                before = _counters(store)
        after = _counters(store)
        d = {k: after[k] - before[k] for k in after}
        lat = np.array(lat_ns[warm:], dtype=np.float64)
        out = {"lookups_per_s": d["lookups"] / (lat.sum() / 1e9) if lat.sum() else float("inf"),
               "p50_us": float(np.percentile(lat, 50)) / 1e3, "p99_us": float(np.percentile(lat, 99)) / 1e3,
               "hit_rate": d["hits"] / max(1, d["hits"] + d["misses"]) if "hits" in d else 1.0,
               "blocks_per_lookup": d["reads"] / max(1, d["lookups"])}
        if "bags" in d:
            out["pooled_hit_rate"] = d["pooled_hits"] / max(1, d["bags"])
        if lookahead is not None and lookahead > 0:  # over the whole run: prefetch spans the warm-up edge
            out.update({k: v for k, v in look.stats().items() if k in ("prefetch_coverage", "prefetch_accuracy")})
        return out


def _timed(store, batch) -> int:
    before = store.modeled_ns()
    store.embedding_bags(batch)
    return store.modeled_ns() - before


def _counters(store) -> dict:
    """Cumulative counters of the store's run: lookups, the first cache's, the last tier's
    device reads, the pooled cache's."""
    stats = store.stats()
    out = {"lookups": stats["lookups"], "reads": 0}
    cache = next((t for t in stats["tiers"] if t["kind"] == "cache"), None)
    if cache is not None:
        out["reads"] = stats["tiers"][-1]["reads"]
        out.update({"hits": cache["hits"], "misses": cache["misses"]})
    if "pooled_cache" in stats:
        out["bags"], out["pooled_hits"] = stats["pooled_cache"]["bags"], stats["pooled_cache"]["hits"]
    return out


def cache_config(preset: str, cache_bytes: int) -> HierarchyConfig:
    return with_options(preset, cache_bytes=cache_bytes)


def section_presets(path, batches, warm, table_bytes, fractions) -> list[str]:
    rows = ["| config | DRAM cache | hit rate | SCM blocks / lookup | modeled lookups/s | p50 µs | p99 µs |",
            "|---|---|---|---|---|---|---|"]
    r = run_modeled(path, "dram", batches, warm)
    rows.append(f"| dram | all rows | 1.000 | 0 | {r['lookups_per_s']:.3g} | {r['p50_us']:.1f} | {r['p99_us']:.1f} |")
    for preset in ("sdm-3dxp", "sdm-nand"):
        for frac in fractions:
            r = run_modeled(path, cache_config(preset, int(frac * table_bytes)), batches, warm)
            rows.append(f"| {preset} | {frac:.0%} | {r['hit_rate']:.3f} | {r['blocks_per_lookup']:.3f} | "
                        f"{r['lookups_per_s']:.3g} | {r['p50_us']:.1f} | {r['p99_us']:.1f} |")
            print(rows[-1], flush=True)
    return rows


def section_features(path, trace, batches, warm, table_bytes, specs) -> list[str]:
    cache_bytes = int(0.10 * table_bytes)
    base = cache_config("sdm-nand", cache_bytes)
    holdout = (len(batches) - warm) / len(batches)
    pins = plan(trace, specs, dram_bytes=cache_bytes, pin_fraction=0.5, layout=None, holdout=holdout)
    layout = plan(trace, specs, dram_bytes=cache_bytes, pin_fraction=0.0, layout="coaccess", holdout=holdout)
    io_ns = int(run_modeled(path, base, batches, warm)["p50_us"] * 1e3)
    runs = [
        ("baseline (lru, no placement)", base, {}),
        ("placement pins (50% of DRAM)", with_options(base, placement=pins), {}),
        ("prefetch off, 1 ms compute", base, {"lookahead": 0, "compute_ns": 1_000_000}),
        ("lookahead prefetch depth 2, 1 ms compute", base, {"lookahead": 2, "compute_ns": 1_000_000}),
        ("prefetch off, compute = baseline IO time", base, {"lookahead": 0, "compute_ns": io_ns}),
        ("lookahead prefetch depth 2, compute = baseline IO time", base, {"lookahead": 2, "compute_ns": io_ns}),
        ("pooled-embedding cache (1% of bytes)", with_options(base, pooled_cache_bytes=int(0.01 * table_bytes)), {}),
        # last: its SCM files are rebuilt in the planned order (the others share identity order)
        ("co-access block layout", with_options(base, placement=layout), {}),
    ]
    rows = ["| sdm-nand, cache 10% | hit rate | SCM blocks / lookup | modeled lookups/s | p50 µs | p99 µs | notes |",
            "|---|---|---|---|---|---|---|"]
    for name, config, kw in runs:
        r = run_modeled(path, config, batches, warm, **kw)
        notes = []
        if "prefetch_coverage" in r:
            notes.append(f"coverage {r['prefetch_coverage']:.3f}, accuracy {r['prefetch_accuracy']:.3f}")
        if "pooled_hit_rate" in r:
            notes.append(f"pooled hit rate {r['pooled_hit_rate']:.3f}")
        if "pins" in name:
            notes.append(f"{len(pins.pinned_tables)} tables, {pins.pinned_row_count()} rows pinned")
        if "layout" in name:
            est = layout.info.get("blocks_per_lookup", {})
            if est:
                notes.append(f"plan's cold-cache estimate on held-out batches: "
                             f"{est['before']['total']['blocks_per_lookup']:.4f} -> "
                             f"{est['after']['total']['blocks_per_lookup']:.4f} blocks/lookup")
        rows.append(f"| {name} | {r['hit_rate']:.3f} | {r['blocks_per_lookup']:.4f} | {r['lookups_per_s']:.3g} | "
                    f"{r['p50_us']:.1f} | {r['p99_us']:.1f} | {'; '.join(n for n in notes if n)} |")
        print(rows[-1], flush=True)
    return rows


def section_all_hit(path, batches, arrays, reps, policy="lru") -> list[str]:
    touched = sum(len(np.unique(np.concatenate([b[k][0] for b in batches]))) for k in batches[0])
    config = HierarchyConfig("all-hit", (TierConfig("cache", capacity_rows=touched + 1024, policy=policy),
                                         TierConfig("mmap", "optane-p4800x-512", queue_depth=16)))
    lookups = sum(len(r[0]) for b in batches for r in b.values())
    from sdm.tiers.dram_cache import _keys

    with sdm.Store.open(path, config=config) as store:
        for b in batches:  # warm: every row the batches touch is now cached
            store.embedding_bags(b)
        misses = store.stats()["tiers"][0]["misses"]
        cache = store._hierarchy._cache.inner
        plans = []  # the data plane alone: pooling from slots through planned pointers
        for b in batches:
            for name, (ids, offsets) in b.items():
                layout = store._manifest.table(name)
                u, inv = unique_inverse(ids)
                batch = cache._serve([layout], _keys(layout, u))  # all hits: plans and pins, reads nothing
                cache._end(batch)  # unpinned; nothing else runs here, so no slot moves
                plans.append((cache._view(layout, batch.slots), batch.ptr[inv], offsets))

        def live():
            for b in batches:
                store.embedding_bags(b)

        def raw(tables=arrays):
            for b in batches:
                for t, (ids, offsets) in enumerate(b.values()):
                    sdm.embedding_bag(tables[t], ids, offsets)

        # the same rows in huge pages, as the store's cache slots are (sdm.kernels.memory): the
        # fair floor for the live path, which gains from them too
        huge = [huge_empty(a.shape, a.dtype) for a in arrays]
        for h, a in zip(huge, arrays):
            h[:] = a

        def data_plane():
            for view, ptr, offsets in plans:
                pool(view, ptr, offsets, None, False, "fp32",
                     np.empty((len(offsets) - 1, DIM), dtype=np.float32))

        distinct = [(layout, _keys(layout, unique_inverse(ids)[0]))
                    for b in batches for layout, (ids, _) in
                    ((store._manifest.table(name), r) for name, r in b.items())]

        def dedup_only():
            for b in batches:
                for ids, _ in b.values():
                    unique_inverse(ids)

        def probe_only():  # the policy's per-batch work on every distinct row, all hits
            for layout, keys in distinct:
                with cache._cond:
                    batch = cache._begin([layout], keys)  # the locked probe: plan and pin
                cache._end(batch)

        contenders = {"live store": live, "raw embedding_bag": raw,
                      "raw embedding_bag, huge pages": lambda: raw(huge), "data plane alone": data_plane,
                      "  of which: dedup": dedup_only, "  of which: policy probe": probe_only}
        times = {k: [] for k in contenders}
        for f in contenders.values():
            f()
        for rep in range(reps):
            order = list(contenders.items())
            order = order[rep % len(order):] + order[:rep % len(order)]
            for name, f in order:
                t0 = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t0)
        assert store.stats()["tiers"][0]["misses"] == misses, "the all-hit workload missed"
    med = {k: float(np.median(v)) for k, v in times.items()}
    rows = [f"All-hit, policy {policy}: {lookups:,} lookups per pass, {touched:,} distinct rows cached, "
            f"{numba.get_num_threads()} threads, median of {reps} interleaved passes.", "",
            "| contender | ms per pass | M lookups/s | ratio to raw | ratio to raw in huge pages |",
            "|---|---|---|---|---|"]
    for name, t in med.items():
        rows.append(f"| {name} | {t * 1e3:.1f} | {lookups / t / 1e6:.1f} | {t / med['raw embedding_bag']:.2f}x | "
                    f"{t / med['raw embedding_bag, huge pages']:.2f}x |")
    print("\n".join(rows), flush=True)
    return rows


_PHASES = (("checks", "request checks (Store._check_requests)"), ("dedup", "dedup (unique_ranked)"),
           ("probe", "policy probe (probe_batch_for, under the lock)"),
           ("hits alone", "a batch of hits alone in one pass (hit_batch_for, under the lock; with misses, "
                           "the attempts that fell back)"),
           ("read below", "read of the misses from the tier below, device model included"),
           ("fill", "misses copied into their slots (fill_rows)"),
           ("slot pointers", "per-lookup slot pointers (compose)"), ("pool", "pooling from the slots"),
           ("dram charge", "the cache's DRAM lines charged to its device model"))


def section_phases(path, batches, reps, policy, hit_rate) -> list[str]:
    """ns per lookup of each phase of ``store.embedding_bags`` through a DRAM cache, timed in
    place: each call of the cache's batch path wrapped in a timer (~0.2 us a call). The cache
    is sized so ``sdm.simulate`` gives ``hit_rate`` on the batches' key stream (1.0: every row
    they touch fits); the tier below is a modeled Optane mmap tier. The batches are served
    once to warm the cache, then ``reps`` times, timed."""
    import sdm.tiers.dram_cache as dram_cache

    stream = np.concatenate([(np.int64(t) << 48) | np.unique(b[k][0])
                             for b in batches for t, k in enumerate(b)])
    touched = len(np.unique(stream))
    capacity = touched + 1024
    if hit_rate < 1.0:  # the capacity whose simulated hit rate is closest to the one asked for
        lo, hi = 1, touched
        while hi - lo > max(1, touched // 1000):
            mid = (lo + hi) // 2
            r = sdm.simulate(np.tile(stream, reps + 1), policy=policy, capacity=mid)
            lo, hi = (mid, hi) if r.hits / (r.hits + r.misses) < hit_rate else (lo, mid)
        capacity = hi
    config = HierarchyConfig("phases", (TierConfig("cache", capacity_rows=capacity, policy=policy),
                                        TierConfig("mmap", "optane-p4800x-512", queue_depth=16)))
    lookups = sum(len(r[0]) for b in batches for r in b.values())
    spent = dict.fromkeys([k for k, _ in _PHASES] + ["total"], 0)

    def timed(fn, phase):
        def wrapper(*a, **k):
            t = time.perf_counter_ns()
            try:
                return fn(*a, **k)
            finally:
                spent[phase] += time.perf_counter_ns() - t
        return wrapper

    patches = [(dram_cache, "unique_ranked", "dedup"), (dram_cache, "fill_rows", "fill"),
               (dram_cache, "compose", "slot pointers"), (dram_cache, "pool", "pool")]
    # the probe and the all-hit pass are compiled per policy: time the kernels they give
    kernel_for, hits_for = dram_cache.probe_batch_for, dram_cache.hit_batch_for
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in patches]
    saved += [(dram_cache, "probe_batch_for", kernel_for), (dram_cache, "hit_batch_for", hits_for)]
    with sdm.Store.open(path, config=config) as store:
        cache = store._hierarchy._cache
        for b in batches:
            store.embedding_bags(b)
        before = store.stats()["tiers"][0]
        try:
            for mod, name, phase in patches:
                setattr(mod, name, timed(getattr(mod, name), phase))
            dram_cache.probe_batch_for = lambda code: timed(kernel_for(code), "probe")
            dram_cache.hit_batch_for = lambda code: timed(hits_for(code), "hits alone")
            store._check_requests = timed(store._check_requests, "checks")
            cache.inner.lower.read_rows = timed(cache.inner.lower.read_rows, "read below")
            cache._charge = timed(cache._charge, "dram charge")
            for _ in range(reps):
                t = time.perf_counter_ns()
                for b in batches:
                    store.embedding_bags(b)
                spent["total"] += time.perf_counter_ns() - t
        finally:
            for mod, name, fn in saved:
                setattr(mod, name, fn)
        after = store.stats()["tiers"][0]
    hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
    per = {k: v / (reps * lookups) for k, v in spent.items()}
    rest = per["total"] - sum(per[k] for k, _ in _PHASES)
    rows = [f"Phases, policy {policy}: {capacity:,} cache slots, hit rate {hits / max(1, hits + misses):.3f} "
            f"(distinct rows per batch), {lookups:,} lookups per pass, {numba.get_num_threads()} threads, "
            f"{reps} passes timed in place.", "",
            "| phase | ns per lookup | share |", "|---|---|---|"]
    for key, label in _PHASES:
        rows.append(f"| {label} | {per[key]:.2f} | {per[key] / per['total']:.0%} |")
    rows.append(f"| the rest (Python: tier calls, lock, batch bookkeeping, output arrays) | {rest:.2f} | "
                f"{rest / per['total']:.0%} |")
    rows.append(f"| **total** | {per['total']:.2f} | 100% |")
    print("\n".join(rows), flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tables", type=int, default=8)
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--batches", type=int, default=24)
    ap.add_argument("--warm", type=int, default=8)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--dir", default="/tmp/sdm-bench-hierarchy")
    ap.add_argument("--policies", default="lru,sieve", help="policies of the all-hit section")
    ap.add_argument("--skip", default="", help="sections to skip: presets,features,all-hit,phases")
    ap.add_argument("--quick", action="store_true", help="toy size smoke test")
    args = ap.parse_args(argv)
    if args.quick:
        args.tables, args.rows, args.batches, args.warm, args.reps = 2, 20_000, 6, 2, 3
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, f"rm2-{args.tables}x{args.rows}")
    arrays = build_store(path, args.tables, args.rows)
    trace = workload(args.tables, args.rows, args.batches)
    batches = requests_of(trace)
    specs = {f"t{i}": sdm.TableSpec(f"t{i}", args.rows, DIM, "fp32") for i in range(args.tables)}
    table_bytes = args.tables * args.rows * DIM * 4
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    print(f"# bench_hierarchy: {args.tables} x {args.rows:,} x {DIM} fp32 ({table_bytes / 2**30:.2f} GiB), "
          f"{args.batches} batches of 256 samples ({args.warm} warm), {cpu_line()}, commit {commit}\n")
    skip = set(args.skip.split(","))
    out = []
    if "presets" not in skip:
        out += ["## Presets and DRAM cache size", ""]
        out += section_presets(path, batches, args.warm, table_bytes, (0.05, 0.10, 0.20)) + [""]
    if "features" not in skip:
        out += ["## Each feature alone", ""]
        out += section_features(path, trace, batches, args.warm, table_bytes, specs) + [""]
    if "all-hit" not in skip:
        out += ["## Live data plane, all hits", ""]
        for policy in args.policies.split(","):
            out += section_all_hit(path, batches[args.warm:], arrays, args.reps, policy) + [""]
    if "phases" not in skip:
        out += ["## Live path by phase", ""]
        for policy in args.policies.split(","):
            for hit_rate in (1.0, 0.5):
                out += section_phases(path, batches[args.warm:], args.reps, policy, hit_rate) + [""]
    print("\n" + "\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

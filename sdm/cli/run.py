"""``sdm run``: the project's main job on an embedded default (what ``make run`` calls)."""

from __future__ import annotations

import json

from sdm.demo import DEMO_TABLES, run_demo


def register(sub) -> None:
    p = sub.add_parser("run", help="build a demo store and serve pooled lookups through each preset",
                       description="Build a small store from generated tables and serve a Zipf "
                                   "stream of pooled lookups through each hierarchy preset.")
    p.add_argument("--presets", nargs="+", default=["dram", "ssd"], help="hierarchy presets to compare")
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_run)


def _run(args) -> int:
    runs = run_demo(tuple(args.presets), batches=args.batches, seed=args.seed)
    if args.json:
        print(json.dumps([{"preset": r.preset, "lookups": r.lookups, "seconds": r.seconds,
                           "lookups_per_s": r.lookups_per_s, "tiers": r.tiers} for r in runs], indent=1))
        return 0
    print("sdm demo store:")
    for spec in DEMO_TABLES:
        print(f"  {spec.name:<10} {spec.num_rows:>9,} rows x {spec.dim:<3} {spec.fmt}")
    print(f"\nZipf(1.05) stream, {args.batches} batches of 256 bags x ~20 lookups per table:\n")
    print(f"{'preset':<10} {'lookups':>10} {'seconds':>8} {'lookups/s':>12}  tier: rows served, reads, bytes read")
    for r in runs:
        tiers = "; ".join(f"{t['name']}: {t['hits']:,} rows, {t['reads']:,} reads, {t['bytes_read'] / 2**20:.1f} MiB"
                          for t in r.tiers)
        print(f"{r.preset:<10} {r.lookups:>10,} {r.seconds:>8.3f} {r.lookups_per_s:>12,.0f}  {tiers}")
    same = len({round(r.checksum, 2) for r in runs}) == 1
    print(f"\npooled results identical across presets: {'yes' if same else 'NO'}")
    return 0 if same else 1

"""``sdm shard plan | build``: plan a store's sharding over workers, cut it into shard stores."""

from __future__ import annotations

import json
import os

from sdm.cli import check_output_folder
from sdm.errors import ConfigError


def register(sub) -> None:
    p = sub.add_parser("shard", help="plan and build a store sharded over Ray workers",
                       description="Shard a store over Ray workers (docs/cluster.md).")
    ssub = p.add_subparsers(dest="shard_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda args: p.error("a subcommand is needed: plan or build"))

    pl = ssub.add_parser("plan", help="plan which worker serves which rows and columns",
                         description="Plan the sharding of SOURCE's tables over --workers workers by "
                                     "estimated cost per batch (table-wise, row-wise, column-wise, "
                                     "table-row-wise) and write the plan (JSON). SOURCE is a store "
                                     "directory, or a trace file whose table t becomes table 't<t>' "
                                     "of --dim values in --fmt.")
    pl.add_argument("source", metavar="SOURCE", help="a store directory or a trace file (.npz)")
    pl.add_argument("--workers", type=int, required=True, metavar="N", help="workers (Ray actors)")
    pl.add_argument("--trace", metavar="TRACE", help="profile a store's tables on this trace "
                                                     "(pooling, hit rate, where reads fall)")
    pl.add_argument("--dim", type=int, default=64, help="values per row for a trace SOURCE (default 64)")
    pl.add_argument("--fmt", default="fp32", help="row format for a trace SOURCE (default fp32)")
    pl.add_argument("--batch-size", type=int, metavar="B", help="samples per batch (default: the trace's, else 512)")
    pl.add_argument("--dram-bytes", metavar="N", help="each worker's DRAM cache (suffixes K, M, G, T; default 64M)")
    pl.add_argument("--scm-bytes", metavar="N", help="each worker's SCM capacity (default: no limit)")
    pl.add_argument("--disk-bytes", metavar="N", help="each worker's disk capacity (default: no limit)")
    pl.add_argument("--workers-per-host", type=int, metavar="H", help="workers per host (table-row-wise)")
    pl.add_argument("--sharding", action="append", default=[], metavar="TABLE=TYPE",
                    help="force a table's sharding type (repeatable)")
    pl.add_argument("--search", default="refine", choices=["refine", "greedy"],
                    help="refine (default) or the TorchRec-style greedy alone")
    pl.add_argument("-o", "--output", required=True, metavar="PLAN", help="plan file to write (.json)")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    pl.set_defaults(func=_plan)

    b = ssub.add_parser("build", help="cut a store into one store directory per worker of a plan",
                        description="Write DIR/w<k> (worker k's shards as an ordinary store) and "
                                    "DIR/plan.json from STORE's rows, bitwise.")
    b.add_argument("store", metavar="STORE", help="the store to cut")
    b.add_argument("plan", metavar="PLAN", help="a plan from `sdm shard plan`")
    b.add_argument("-o", "--output", required=True, metavar="DIR", help="shard directory to create")
    b.add_argument("--json", action="store_true", help="machine-readable output")
    b.set_defaults(func=_build)


def _bytes(text: str, flag: str) -> int:
    from sdm.cli.place import parse_bytes

    try:
        return parse_bytes(text)
    except ConfigError:
        raise ConfigError(f"{flag} must be a byte count like 1048576 or 64M, got {text!r}") from None


def _plan(args) -> int:
    import sdm
    from sdm.cluster import WorkerSpec, plan

    check_output_folder(args.output)
    sharding = {}
    for item in args.sharding:
        name, sep, kind = item.partition("=")
        if not sep:
            raise ConfigError(f"--sharding takes TABLE=TYPE, got {item!r}")
        sharding[name] = kind
    sizes = {"dram_bytes": args.dram_bytes, "scm_bytes": args.scm_bytes, "disk_bytes": args.disk_bytes}
    worker = WorkerSpec(**{k: _bytes(v, "--" + k.replace("_", "-")) for k, v in sizes.items() if v is not None})
    trace = args.trace
    if os.path.isdir(args.source):
        tables = args.source
    else:
        trace = trace or args.source
        sizes = sdm.trace.load(args.source).table_sizes
        tables = [sdm.TableSpec(f"t{t}", int(n), args.dim, args.fmt) for t, n in enumerate(sizes)]
    p = plan(tables, args.workers, trace=trace, batch_size=args.batch_size, worker=worker,
             workers_per_host=args.workers_per_host, sharding=sharding, search=args.search)
    p.save(args.output)
    print(json.dumps(p.to_json(), indent=1) if args.json else render_plan(p, args.output))
    return 0


def render_plan(p, path: str) -> str:
    """A plan as one line per worker and per table, then its score."""
    lines = [f"{'worker':>6}  {'cost/batch':>12}  {'bytes':>12}  shards"]
    for w in p.to_json()["workers"]:
        lines.append(f"{w['worker']:>6}  {w['cost_ns'] / 1e3:>9.1f} us  {w['bytes']:>12,}  {w['shards']}")
    lines.append("")
    width = max(len(t.spec.name) for t in p.tables)
    for t in p.tables:
        workers = ",".join(str(s.worker) for s in t.shards)
        lines.append(f"{t.spec.name:<{width}}  {t.sharding:<14}  {len(t.shards)} shard(s) on worker(s) {workers}")
    lines += ["", f"score {p.score_ns / 1e3:.1f} us per batch (most loaded worker), balance {p.balance:.3f} "
                  f"(max/mean), greedy {p.greedy_score_ns / 1e3:.1f} us; search {p.search}",
              f"wrote {os.path.abspath(path)}"]
    return "\n".join(lines)


def _build(args) -> int:
    from sdm.cluster import Plan, build
    from sdm.cluster.build import worker_dir

    plan = Plan.load(args.plan)
    out = build(args.store, plan, args.output)
    held = plan.worker_bytes
    workers = [{"worker": w, "path": worker_dir(out, w), "bytes": int(held[w]),
                "shards": sum(s.worker == w for s in plan.shards)} for w in sorted({s.worker for s in plan.shards})]
    report = {"output": out, "store": os.path.abspath(args.store), "plan": os.path.abspath(args.plan),
              "workers": workers}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for w in workers:
            print(f"worker {w['worker']}: {w['shards']} shard(s), {w['bytes']:,} bytes -> {w['path']}")
        print(f"wrote {out}")
    return 0

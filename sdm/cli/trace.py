"""``sdm trace gen | import | stats``: make, bring in and describe access traces."""

from __future__ import annotations

import json
import os
import sys
import time

from sdm.cli import check_output_folder
from sdm.errors import ConfigError


def register(sub) -> None:
    p = sub.add_parser("trace", help="generate, import and describe embedding access traces",
                       description="Embedding access traces (sdm trace files, .npz).")
    tsub = p.add_subparsers(dest="trace_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda args: p.error("a subcommand is needed: gen, import or stats"))

    g = tsub.add_parser("gen", help="generate a seeded synthetic trace from a profile",
                        description="Generate a seeded synthetic trace. Profiles: uniform, zipf, "
                                    "drift, inference, stack-distance, meta-2021 and the model "
                                    "shapes criteo-kaggle, criteo-terabyte, mlperf-dlrm, "
                                    "dlrm-bench, rm1, rm2, rm3. `--list` describes them.")
    g.add_argument("--profile", default="zipf", help="profile name (default zipf)")
    g.add_argument("--requests", type=int, help="samples to generate (inference: user requests); "
                                                "default: the profile's size")
    g.add_argument("--batches", type=int, help="number of batches (overrides --requests)")
    g.add_argument("--batch-size", type=int, help="samples per batch (inference: requests per batch)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--tables", type=int, help="number of tables (uniform, zipf, drift, meta-2021)")
    g.add_argument("--table-size", help="rows per table: one value or a comma list")
    g.add_argument("--pooling", help="mean lookups per bag: one value or a comma list")
    g.add_argument("--alpha", help="Zipf exponent: one value or a comma list (one per table)")
    g.add_argument("--max-rows", type=int, help="cap every table at this many rows")
    g.add_argument("--drift", type=float, help="hot-set drift: ranks rotate this many rows per batch")
    g.add_argument("--items-per-request", type=int, help="inference: candidate items per request")
    g.add_argument("--dense", type=int, help="dense features per sample (0 = none)")
    g.add_argument("--dist", help="stack-distance profile: the reference DLRM distribution file")
    g.add_argument("--compress", action="store_true", help="deflate the file (smaller, slower)")
    g.add_argument("--list", action="store_true", help="list the profiles and exit")
    g.add_argument("--json", action="store_true", help="machine-readable output")
    g.add_argument("-o", "--output", help="trace file to write (.npz)")
    g.set_defaults(func=_gen)

    i = tsub.add_parser("import", help="import a real trace format",
                        description="Import a trace. KIND: fbgemm (dlrm_datasets .pt with torch, or "
                                    ".npz with indices/offsets/lengths; several files = several "
                                    "batches), dlrm-trace (reference DLRM trace.log), dlrm-dist "
                                    "(reference DLRM distribution file, expanded), criteo (Kaggle / "
                                    "Terabyte raw TSV). `sdm trace import KIND --help` gives each "
                                    "kind's options.")
    isub = i.add_subparsers(dest="kind", metavar="KIND")
    i.set_defaults(func=lambda args: i.error("a KIND is needed: fbgemm, dlrm-trace, dlrm-dist or criteo"))
    for kind, summary, text in _IMPORTS:
        k = isub.add_parser(kind, help=summary, description=text)
        k.add_argument("src", metavar="SRC", nargs="+",
                       help="batch files, one batch each" if kind == "fbgemm" else "the file to import (one)")
        k.add_argument("-o", "--output", required=True, help="trace file to write (.npz)")
        if kind == "fbgemm":
            k.add_argument("--batch-size", type=int, help="split each file into batches of this many samples")
            k.add_argument("--table-sizes", help="rows per table, comma-separated (default: max id + 1)")
        else:
            k.add_argument("--batch-size", type=int,
                           help=f"samples per batch (default {2048 if kind == 'criteo' else 1024})")
        if kind == "criteo":
            k.add_argument("--table-sizes", help="a profile name (criteo-kaggle, criteo-terabyte) or 26 "
                                                 "comma-separated sizes to hash ids into. Default: remap, "
                                                 "each table exactly the ids seen, which packs the rows "
                                                 "read into few blocks and so flatters SCM (read "
                                                 "amplification near 1); give the real sizes to measure SCM")
            k.add_argument("--limit", type=int, help="stop after this many lines")
        if kind in ("dlrm-trace", "dlrm-dist"):
            k.add_argument("--pooling", type=int, default=1, help="ids per bag (default 1)")
        if kind == "dlrm-dist":
            k.add_argument("--lookups", type=int, default=1 << 20, help="lookups to draw (default 1048576)")
            k.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
        k.add_argument("--compress", action="store_true", help="deflate the file (smaller, slower)")
        k.add_argument("--json", action="store_true", help="machine-readable output")
        k.set_defaults(func=_import)

    s = tsub.add_parser("stats", help="locality statistics of a trace",
                        description="Lookups, distinct rows, reuse histograms (dlrm_datasets "
                                    "locality_stats bins), Zipf alpha, stack distances, unique ids "
                                    "per batch, working set.")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--plot", metavar="DIR", help="write PNG plots into DIR (needs matplotlib)")
    s.add_argument("--stack-lookups", type=int, default=1_000_000,
                   help="lookups profiled for stack distances (default 1M)")
    s.add_argument("--dist-out", metavar="FILE",
                   help="also write the reference DLRM 3-line distribution of one table")
    s.add_argument("--table", type=int, default=0, help="table for --dist-out (default 0)")
    s.add_argument("--reference", metavar="LOCALITY_STATS",
                   help="compare every batch's reuse histograms with the first block (the "
                        "aggregate) of a dlrm_datasets locality_stats.txt")
    s.set_defaults(func=_stats)


# (kind, one-line help, description) of `sdm trace import KIND`.
_IMPORTS = (
    ("fbgemm", "Meta dlrm_datasets / FBGEMM batch files",
     "Import FBGEMM / dlrm_datasets batch files: each SRC is one batch, a torch.save zip of "
     "(indices, offsets, lengths) tensors (needs torch) or an .npz of those three arrays. "
     "indices: every lookup, table-major; offsets: T x B + 1 bag starts; lengths: (T, B)."),
    ("dlrm-trace", "the reference DLRM's trace.log",
     "Import the reference DLRM's memory-reference trace (one line of comma-separated row ids) "
     "as one table, --pooling ids per bag, --batch-size bags per batch."),
    ("dlrm-dist", "the reference DLRM's stack-distance distribution file, expanded",
     "Draw --lookups lookups from a reference DLRM distribution file (3 lines: unique accesses, "
     "stack distances, cumulative probabilities) into one table, seeded."),
    ("criteo", "Criteo Kaggle / Terabyte raw TSV",
     "Import a Criteo raw TSV (label, 13 integer features, 26 categorical hashes per line): one "
     "sample per line, 26 tables, pooling 1. By default each table is remapped to exactly the ids "
     "seen, in first-seen order; that packs the rows a batch reads into few device blocks, so "
     "SCM read amplification comes out near 1 against about 15 on other traces. Pass "
     "--table-sizes criteo-kaggle (or the sizes) to hash ids into the real tables instead."),
)


def _need_output(args):
    if not args.output:
        raise ConfigError("an output file is needed: -o FILE")
    check_output_folder(args.output)


def _gen(args) -> int:
    from sdm.trace.generate import PROFILES, generate_to

    if args.list:
        # a stack-distance profile's one table takes its rows from the distribution file
        rows = [{"profile": p.name, "kind": p.kind, "tables": p.num_tables or 1,
                 "batch_size": p.batch_size, "batches": p.batches,
                 "description": p.description or p.source} for p in PROFILES.values()]
        if args.json:
            print(json.dumps(rows, indent=1))
        else:
            print(f"{'profile':<16} {'kind':<15} {'tables':>6}  {'batches x size':<14} description")
            for r in rows:
                print(f"{r['profile']:<16} {r['kind']:<15} {r['tables']:>6}  "
                      f"{str(r['batches']) + ' x ' + str(r['batch_size']):<14} {r['description']}")
        return 0
    _need_output(args)
    over = {k: v for k, v in dict(
        requests=args.requests, batches=args.batches, batch_size=args.batch_size,
        tables=args.tables, table_size=args.table_size, pooling=args.pooling, alpha=args.alpha,
        max_rows=args.max_rows, drift=args.drift, items_per_request=args.items_per_request,
        dense=args.dense, dist_file=args.dist).items() if v is not None}
    t0 = time.perf_counter()
    path = generate_to(args.output, args.profile, seed=args.seed, compress=args.compress,
                       progress=not args.json and sys.stderr.isatty(), **over)
    secs = time.perf_counter() - t0
    return _report(path, secs, args.json, "generated")


def _report(path, secs, as_json, verb) -> int:
    from sdm.trace.format import load

    with load(path) as tr:
        info = {"path": path, "batches": len(tr), "tables": tr.num_tables,
                "samples": int(tr.batch_sizes.sum()), "lookups": tr.num_lookups,
                "table_sizes": [int(x) for x in tr.table_sizes], "bytes": os.path.getsize(path),
                "seconds": round(secs, 3), "metadata": tr.metadata}
    if as_json:
        print(json.dumps(info, indent=1))
    else:
        print(f"{verb} {path}: {info['batches']} batches, {info['tables']} tables, "
              f"{info['samples']:,} samples, {info['lookups']:,} lookups, "
              f"{info['bytes'] / 2**20:.1f} MiB in {secs:.2f} s")
    return 0


def _sizes(text):
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        return text  # a profile name


def _import(args) -> int:
    from sdm.trace import importers as imp

    _need_output(args)
    t0 = time.perf_counter()
    bar = not args.json and sys.stderr.isatty()
    if args.kind == "fbgemm":
        sizes = _sizes(args.table_sizes)
        if isinstance(sizes, str):
            raise ConfigError(f"--table-sizes for fbgemm must be integers, got {args.table_sizes!r}")
        path = imp.import_fbgemm(args.src, args.output, batch_size=args.batch_size,
                                 table_sizes=sizes, compress=args.compress, progress=bar)
    else:
        if len(args.src) != 1:
            raise ConfigError(f"{args.kind} imports one file, got {len(args.src)}")
        src = args.src[0]
        bs = args.batch_size
        default_bs = 2048 if args.kind == "criteo" else 1024
        bs = default_bs if bs is None else bs
        if args.kind == "dlrm-trace":
            path = imp.import_dlrm_trace(src, args.output, batch_size=bs,
                                         pooling=args.pooling, compress=args.compress)
        elif args.kind == "dlrm-dist":
            path = imp.import_dlrm_dist(src, args.output, lookups=args.lookups,
                                        batch_size=bs, pooling=args.pooling,
                                        seed=args.seed, compress=args.compress)
        else:
            path = imp.import_criteo(src, args.output, table_sizes=_sizes(args.table_sizes),
                                     batch_size=bs, limit=args.limit,
                                     compress=args.compress, progress=bar)
    return _report(path, time.perf_counter() - t0, args.json, "imported")


def _stats(args) -> int:
    from sdm.trace.format import load
    from sdm.trace.render import plot_stats, stats_text
    from sdm.trace.stats import table_stack_distribution, trace_stats
    from sdm.trace.stackdist import write_dist_file

    with load(args.file) as tr:
        if not 0 <= args.table < tr.num_tables:
            raise ConfigError(f"--table {args.table} out of range; the trace has {tr.num_tables} tables")
        st = trace_stats(tr, stack_lookups=args.stack_lookups,
                         progress=not args.json and sys.stderr.isatty())
        dist_path = None
        if args.dist_out:
            dist = table_stack_distribution(tr, args.table, max_lookups=args.stack_lookups)
            dist_path = write_dist_file(args.dist_out, dist)
    ref = None
    if args.reference:
        from sdm.trace.stats import read_locality_stats

        blocks = read_locality_stats(args.reference)
        if not blocks:
            raise ConfigError(f"{args.reference} holds no locality_stats block")
        ref = {"file": args.reference, "block": blocks[0]["file"],
               **st.compare(blocks[0]["rows"], blocks[0]["lookups_share"])}
    plots = plot_stats(st, args.plot) if args.plot else []
    if args.json:
        out = st.to_json()
        if plots:
            out["plots"] = plots
        if dist_path:
            out["dist_file"] = dist_path
        if ref:
            out["reference"] = ref
        print(json.dumps(out, indent=1))
    else:
        print(stats_text(st))
        for p in plots:
            print(f"wrote {p}")
        if dist_path:
            print(f"wrote {dist_path} (stack-distance distribution of table {args.table})")
        if ref:
            print(f"vs {ref['block']} of {ref['file']}: largest per-bin difference over batches: "
                  f"rows {ref['max_abs_diff_rows']:.4f}, lookups {ref['max_abs_diff_lookups']:.4f} "
                  f"(batch {ref['worst_batch']})")
    return 0


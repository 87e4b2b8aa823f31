"""``sdm store create | info | verify``: build a store without Python, describe it, check it."""

from __future__ import annotations

import json
import sys

from sdm.errors import ConfigError


def register(sub) -> None:
    p = sub.add_parser("store", help="create a store, describe it, verify its checksums",
                       description="Embedding stores (docs/store-format.md): the directory that "
                                   "`sdm replay --store`, `sdm place --store` and sdm.Store.open use.")
    ssub = p.add_subparsers(dest="store_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda args: p.error("a subcommand is needed: create, info or verify"))

    c = ssub.add_parser(
        "create", help="create a store from arrays, a DLRM preset or a trace's tables",
        description="Create the store DIR from exactly one source: --arrays (each .npy file a table "
                    "named for the file, each member of a .npz a table named for the member; 2-D "
                    "float rows), --preset (the tables of a DLRM preset, seeded rows), or --trace "
                    "(a table emb_t per trace table, of its rows, seeded rows: the store `sdm "
                    "replay` would build for it). DIR appears only once every row is written.")
    c.add_argument("dir", metavar="DIR", help="store directory to create (must not exist)")
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument("--arrays", nargs="+", metavar="FILE", help=".npy / .npz files of (rows, dim) floats")
    src.add_argument("--preset", metavar="MODEL", help="a DLRM preset (sdm.model.PRESETS): its tables and dim")
    src.add_argument("--trace", metavar="TRACE", help="a trace file: its tables' rows")
    c.add_argument("--dim", type=int, help="values per row for --trace (default 64; a preset fixes its own)")
    c.add_argument("--fmt", default="fp32", help="row format: fp32, fp16 or int8 (default fp32)")
    c.add_argument("--seed", type=int, default=0, help="seed of the rows of --preset and --trace (default 0)")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(func=_create)

    for name, summary, text, func in (
            ("info", "the tables of a store, their formats and sizes",
             "Print the store's tables (rows, dim, format, bytes a row, LMDB blocks, written or "
             "not), its version and disk use.", _info),
            ("verify", "read every block and check its checksum",
             "Read every LMDB block of every written table and check its CRC32, the manifest's "
             "SHA-256 and the change log. Exit 0 when all hold, 1 naming the first damage found.",
             _verify)):
        q = ssub.add_parser(name, help=summary, description=text)
        q.add_argument("dir", metavar="DIR")
        q.add_argument("--json", action="store_true", help="machine-readable output")
        q.set_defaults(func=func)


def _size(n: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def _create(args) -> int:
    from sdm.store.build import build_store, create_from_arrays, store_info

    bar = None if args.json else True  # a bar on a terminal, lines elsewhere (sdm.progress)
    if args.arrays:
        if args.dim is not None:
            raise ConfigError("--dim applies to --trace only: arrays bring their own dim")
        path = create_from_arrays(args.dir, args.arrays, fmt=args.fmt, progress=bar)
    elif args.preset:
        from sdm.model import get_preset

        if args.dim is not None:
            raise ConfigError(f"--dim conflicts with --preset: {args.preset!r} fixes the dim")
        preset = get_preset(args.preset)
        path = build_store(args.dir, preset.table_sizes, dim=preset.dim, fmt=args.fmt, seed=args.seed,
                           progress=bar)
    else:
        from sdm.trace.format import load

        with load(args.trace) as tr:
            sizes = tr.table_sizes
        path = build_store(args.dir, sizes, dim=64 if args.dim is None else args.dim, fmt=args.fmt,
                           seed=args.seed, progress=bar)
    info = store_info(path)
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        t = info["tables"]
        print(f"created {path}: {len(t)} tables, {info['rows']:,} rows of dim "
              f"{', '.join(sorted({str(x['dim']) for x in t}))} {', '.join(sorted({x['fmt'] for x in t}))}, "
              f"{_size(info['disk_bytes'])} on disk")
    return 0


def info_text(info: dict) -> str:
    """A store's tables as an aligned table, then its totals."""
    head = ("table", "rows", "dim", "fmt", "row B", "blocks", "written")
    rows = [head] + [(t["name"], f"{t['num_rows']:,}", str(t["dim"]), t["fmt"], str(t["row_bytes"]),
                      f"{t['blocks']:,}", "yes" if t["written"] else "no") for t in info["tables"]]
    widths = [max(len(r[k]) for r in rows) for k in range(len(head))]
    lines = ["  ".join(c.ljust(w) if k in (0, 3) else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines += ["", f"{info['path']}: {len(info['tables'])} tables, {info['rows']:,} rows, "
                  f"{_size(info['row_bytes_total'])} of rows, {_size(info['disk_bytes'])} on disk; "
                  f"version {info['version']} (updates applied)"]
    return "\n".join(lines)


def _info(args) -> int:
    from sdm.store.build import store_info

    info = store_info(args.dir)
    print(json.dumps(info, indent=1) if args.json else info_text(info))
    return 0


def _verify(args) -> int:
    from sdm.store.build import verify_store

    report = verify_store(args.dir)
    if args.json:
        print(json.dumps(report, indent=1))
    elif report["damage"] is None:
        print(f"{report['path']}: ok, {report['blocks']:,} blocks of {len(report['tables'])} tables "
              f"checked")
    else:
        print(f"sdm store verify: damaged: {report['damage']}", file=sys.stderr)
    return 0 if report["damage"] is None else 1

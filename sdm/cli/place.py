"""``sdm place``: plan DRAM pins and an SCM block layout for a store from a trace profile."""

from __future__ import annotations

import json
import os
import re

from sdm.cli import check_output_folder
from sdm.errors import ConfigError
from sdm.store.placement import LAYOUTS

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def register(sub) -> None:
    p = sub.add_parser("place", help="plan DRAM pins and an SCM block layout from a trace",
                       description="Profile TRACE against the store's tables and write a placement "
                                   "(.npz): tables pinned whole in DRAM and hot rows pinned, greedy "
                                   "by lookups per byte within --pin-fraction of --dram-bytes, and "
                                   "a row order for the SCM row files that puts rows looked up "
                                   "together in the same device block. Planned on the first half "
                                   "of the trace, measured on the second (held out).")
    p.add_argument("trace", metavar="TRACE", help="trace file (.npz); its table t is the store's t-th")
    p.add_argument("--store", required=True, metavar="DIR", help="the store (opened read-only)")
    p.add_argument("--dram-bytes", required=True, metavar="N",
                   help="DRAM for the store, bytes (suffixes K, M, G, T: powers of 1024)")
    p.add_argument("--pin-fraction", type=float, default=0.5, metavar="F",
                   help="share of --dram-bytes pins may take; the rest stays a cache (default 0.5)")
    p.add_argument("--layout", default="coaccess", choices=[*LAYOUTS, "none"],
                   help="SCM row order (default coaccess)")
    p.add_argument("--block-bytes", type=int, default=4096, metavar="B",
                   help="device block the layout is measured with (default 4096)")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="placement file to write (.npz)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_run)


def parse_bytes(text: str) -> int:
    """``"64M"`` -> 67108864; plain integers are bytes."""
    m = _SIZE.match(str(text))
    if not m:
        raise ConfigError(f"--dram-bytes must be a byte count like 1048576 or 64M, got {text!r}")
    unit = (m.group(2) or "").lower()[:1]
    return int(m.group(1)) * _UNITS[unit]


def _run(args) -> int:
    from sdm.replay.planner import plan
    from sdm.store.store import Store

    dram = parse_bytes(args.dram_bytes)
    check_output_folder(args.output)
    with Store.open(args.store, readonly=True) as store:
        tables = store.tables
    layout = None if args.layout == "none" else args.layout
    placement = plan(args.trace, tables, dram_bytes=dram, pin_fraction=args.pin_fraction,
                     layout=layout, block_bytes=args.block_bytes)
    path = placement.save(args.output)
    report = {"output": path, "store": os.path.abspath(args.store), **placement.info}
    print(json.dumps(report, indent=1) if args.json else render_text(report))
    return 0


def render_text(report: dict) -> str:
    """A placement's info as a table per table plus the blocks-per-lookup summary."""
    head = ("table", "rows", "bytes", "accesses", "density/B", "decision", "blk/lookup", "after")
    rows = [head]
    for name, t in report["tables"].items():
        rows.append((name, f"{t['rows']:,}", _size(t["bytes"]), f"{t['accesses']:,}",
                     f"{t['density']:.4g}", t["decision"], f"{t['blocks_per_lookup_before']:.4f}",
                     f"{t['blocks_per_lookup_after']:.4f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i in (0, 5) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    bpl = report["blocks_per_lookup"]
    before, after = bpl["before"]["total"], bpl["after"]["total"]
    lines += [
        "",
        f"pins: {_size(report['pinned_bytes'])} of a {_size(report['pin_budget_bytes'])} budget "
        f"({report['pin_fraction']:g} x {_size(report['dram_bytes'])} DRAM)",
        f"SCM blocks per lookup ({report['block_bytes']} B blocks, cold cache, pins excluded), "
        f"measured on {report['measured_on']}: batches {report['measured_batches'][0]}.."
        f"{report['measured_batches'][1] - 1}",
        f"  identity order {before['blocks_per_lookup']:.4f}  ->  {report['layout'] or 'identity'} "
        f"{after['blocks_per_lookup']:.4f}   ({bpl['reduction']:.3f}x fewer blocks)",
        f"wrote {report['output']}",
    ]
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


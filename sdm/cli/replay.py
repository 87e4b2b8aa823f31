"""``sdm replay`` (a trace through a live store) and ``sdm sweep`` (a grid on the simulator)."""

from __future__ import annotations

import json
import os
import sys

from sdm.cli import check_output_file, check_output_folder, emit_json, make_output_dir, write_text
from sdm.errors import InvalidArgumentError
from sdm.formats import check_dim, check_format
from sdm.policies import ADMISSIONS
from sdm.store.config import IO_MODES


def register(sub) -> None:
    r = sub.add_parser(
        "replay", help="replay a trace through a live store: hit rates, IO, latency, QPS at an SLA",
        description="Replay a trace through a store under a hierarchy (and through a DLRM forward "
                    "with --model). Reports per-tier hits, misses, reads, bytes read and read "
                    "amplification; modeled per-request latency p50/p95/p99/p99.9; the QPS one "
                    "--host sustains within the SLA (the host model, sdm host); CPU time per request; "
                    "device utilization and energy. A request is one trace batch (one request id "
                    "for inference traces) unless --request-size splits batches.")
    r.add_argument("trace", metavar="TRACE", help="sdm trace file (.npz)")
    r.add_argument("--config", default="dram", help="hierarchy preset (dram, ssd, sdm-nand, sdm-3dxp, "
                                                    "three-tier) or a .toml file (default dram)")
    r.add_argument("--cache-bytes", metavar="SIZE", help="the first DRAM cache's size, e.g. 128M (a cache config)")
    r.add_argument("--policy", help="the first DRAM cache's policy (any of sdm.store.config.CACHE_POLICIES)")
    r.add_argument("--admission", choices=ADMISSIONS, help="the first cache's admission filter")
    r.add_argument("--placement", metavar="FILE", help="a placement from `sdm place` (pins, SCM row order)")
    r.add_argument("--pooled-cache-bytes", metavar="SIZE", help="a pooled-embedding cache of SIZE, e.g. 8M")
    r.add_argument("--model", help="DLRM preset: run the whole forward per request (its dim wins); the "
                                   "trace's tables must be the preset's")
    r.add_argument("--fit-model", action="store_true",
                   help="rebuild the --model preset's MLPs over the trace's tables (said in the output)")
    r.add_argument("--io-mode", choices=IO_MODES, help="override the config's IO mode")
    r.add_argument("--sla-us", type=float, help="p99 latency SLA in microseconds (default 30000)")
    r.add_argument("--host", default="this-machine",
                   help="the host whose QPS at the SLA is reported (sdm host; default this-machine)")
    r.add_argument("--disk", metavar="TOML", help="this machine's calibrated disk, for direct IO (sdm host)")
    r.add_argument("--store", metavar="DIR", help="an existing store whose tables (in order) match the "
                                                  "trace's; default: build one in a temp dir")
    r.add_argument("--workdir", metavar="DIR", help="where the temporary store is built (default: the "
                                                    "system temp dir)")
    r.add_argument("--dim", type=int, help="columns of the built store's rows (default 64)")
    r.add_argument("--fmt", default="fp32", help="row format of the built store: fp32, fp16, int8")
    r.add_argument("--request-size", type=int, help="samples per request (default: the whole batch)")
    r.add_argument("--warmup", type=int, default=0, help="batches served first and left out of every figure")
    r.add_argument("--max-batches", type=int, help="measure at most this many batches")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--json", nargs="?", const="-", metavar="OUT",
                   help="write the JSON result to OUT (no OUT or '-': stdout, instead of the summary)")
    r.add_argument("--out", metavar="DIR", help="write summary.md, result.json and PNG plots into DIR")
    r.set_defaults(func=_replay)

    s = sub.add_parser(
        "sweep", help="grid of policies x cache sizes x devices on the simulator (control plane only)",
        description="Replay the trace's cache key stream through sdm.simulate for every policy and "
                    "DRAM cache size (belady always added: the lower bound), on every core, and model "
                    "each point's QPS at the SLA on every SCM device.")
    s.add_argument("trace", metavar="TRACE")
    s.add_argument("--policies", nargs="+", default=["lru"], help="policy names (space or comma separated)")
    s.add_argument("--cache-sizes", nargs="+", default=["64M"],
                   help="DRAM cache sizes in bytes, e.g. 1M 4M 16M 64MiB")
    s.add_argument("--devices", nargs="+", default=["nand-p4500", "optane-p4800x-512"],
                   help="SCM device presets (sdm devices)")
    s.add_argument("--dim", type=int, default=64, help="values per row, which with --fmt sizes a row "
                                                       "(default 64)")
    s.add_argument("--fmt", default="fp32", help="row format: fp32, fp16 or int8 (default fp32)")
    s.add_argument("--sla-us", type=float, help="p99 latency SLA in microseconds (default 30000)")
    s.add_argument("--request-size", type=int, help="samples per request (default: the whole batch, "
                                                    "or one request id of an inference trace)")
    s.add_argument("--queue-depth", type=int, help="SCM reads in flight (default: the presets' 16)")
    s.add_argument("--cache-queue-depth", type=int,
                   help="DRAM line reads in flight (default: the presets' cache tier value)")
    s.add_argument("--workers", type=int, help="threads running points (default: every core)")
    s.add_argument("--json", nargs="?", const="-", metavar="OUT", help="write the JSON result (stdout by default)")
    s.add_argument("--plot", metavar="OUT.png", help="miss-ratio curves and QPS per point, one PNG")
    s.set_defaults(func=_sweep)


def _split(values) -> list[str]:
    return [v for item in values for v in item.split(",") if v]


#: A store built for a replay at least this large is announced first (it takes seconds).
ANNOUNCE_BYTES = 256 << 20


def _announce_store(args, dim: int) -> None:
    """Say in one line what store a replay builds, and why, when it is a big one (after the
    checks the replay makes first, so a bad value still gets its one error line alone)."""
    from sdm.store.build import store_bytes
    from sdm.trace.format import load

    dim, fmt = check_dim(dim), check_format(args.fmt)
    with load(args.trace) as tr:
        sizes = tr.table_sizes
    need = store_bytes(sizes, dim, fmt)
    if need >= ANNOUNCE_BYTES:
        print(f"sdm {args.command}: building a temporary store of the trace's {len(sizes)} tables, "
              f"{int(sizes.sum()):,} rows of dim {dim} {fmt} ({need / 2**30:.1f} GiB), because the "
              f"trace's ids span them; `sdm store create DIR --trace {args.trace}` builds it once for "
              f"--store DIR", file=sys.stderr)


def _config(args):
    """``--config`` with the hierarchy options given on the command line applied."""
    from sdm.store.config import resolve_config, with_options
    from sdm.replay.sweep import parse_size

    changes = {}
    if args.cache_bytes is not None:
        changes["cache_bytes"] = parse_size(args.cache_bytes)
    for name in ("policy", "admission", "placement"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if args.pooled_cache_bytes is not None:
        changes["pooled_cache_bytes"] = parse_size(args.pooled_cache_bytes)
    return with_options(args.config, **changes) if changes else resolve_config(args.config)


def _replay(args) -> int:
    from sdm.host import replay_on_host
    from sdm.replay.queueing import DEFAULT_SLA_US
    from sdm.replay.live import DEFAULT_DIM
    from sdm.replay.render import plot_replay, replay_markdown

    if args.model is not None and args.dim is not None:
        raise InvalidArgumentError("--dim and --model conflict: the model preset fixes the dim")
    if args.fit_model and args.model is None:
        raise InvalidArgumentError("--fit-model needs --model: it rebuilds that preset over the trace's tables")
    check_output_file(args.json)  # outputs checked before the replay, not after it
    if args.out:
        make_output_dir(args.out)
    config = _config(args)
    dim = DEFAULT_DIM if args.dim is None else args.dim
    if args.store is None and args.model is None:
        _announce_store(args, dim)
    result = replay_on_host(args.trace, config, host=args.host, disk=args.disk, store=args.store,
                            model=args.model, dim=dim, fmt=args.fmt, io_mode=args.io_mode,
                            sla_us=DEFAULT_SLA_US if args.sla_us is None else args.sla_us,
                            request_size=args.request_size, warmup_batches=args.warmup,
                            max_batches=args.max_batches, seed=args.seed, progress=True,
                            workdir=args.workdir, fit_model=args.fit_model)
    data = result.to_json()
    summary = replay_markdown(result)
    notes = []
    if args.out:
        write_text(os.path.join(args.out, "summary.md"), summary)
        write_text(os.path.join(args.out, "result.json"), json.dumps(data, indent=1) + "\n")
        try:
            plots = plot_replay(result, args.out)
        except OSError as exc:
            raise InvalidArgumentError(f"cannot write plots into {args.out}: {exc.strerror}") from None
        notes.append(f"wrote {os.path.join(args.out, 'summary.md')}, result.json, "
                     + ", ".join(os.path.basename(p) for p in plots))
    if not emit_json(args.json, data):
        print(summary, end="")
        if args.json:
            notes.append(f"wrote {args.json}")
    for n in notes:
        print(n, file=sys.stderr)
    return 0


def _sweep(args) -> int:
    from sdm.replay.queueing import DEFAULT_SLA_US
    from sdm.replay.render import check_plot_path, plot_sweep, sweep_markdown
    from sdm.replay.sweep import DEFAULT_CACHE_QUEUE_DEPTH, DEFAULT_QUEUE_DEPTH, sweep

    check_output_file(args.json)
    if args.plot:
        check_plot_path(args.plot)
        check_output_folder(args.plot)
    result = sweep(args.trace, policies=_split(args.policies), cache_sizes=_split(args.cache_sizes),
                   devices=_split(args.devices), dim=args.dim, fmt=args.fmt,
                   sla_us=DEFAULT_SLA_US if args.sla_us is None else args.sla_us,
                   request_size=args.request_size,
                   queue_depth=DEFAULT_QUEUE_DEPTH if args.queue_depth is None else args.queue_depth,
                   cache_queue_depth=(DEFAULT_CACHE_QUEUE_DEPTH if args.cache_queue_depth is None
                                      else args.cache_queue_depth),
                   workers=args.workers, progress=True)
    notes = []
    if args.plot:
        try:
            plot_sweep(result, args.plot)
        except OSError as exc:
            raise InvalidArgumentError(f"cannot write {args.plot}: {exc.strerror}") from None
        notes.append(f"wrote {args.plot}")
    if not emit_json(args.json, result.to_json()):
        print(sweep_markdown(result), end="")
        if args.json:
            notes.append(f"wrote {args.json}")
    for n in notes:
        print(n, file=sys.stderr)
    return 0

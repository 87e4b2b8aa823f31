"""``sdm load``: open-loop load test of a live store."""

from __future__ import annotations

import json
import os

from sdm.cli import add_store_arguments, check_output_file, emit_json, make_output_dir, write_text
from sdm.store.config import IO_MODES


def register(sub) -> None:
    p = sub.add_parser(
        "load", help="open-loop load test of a live store: latency against offered QPS",
        description="Send a trace's requests to a live store as a Poisson process at each --rate "
                    "(requests/s) for --duration seconds and report, per rate, offered and "
                    "achieved QPS, p50/p95/p99/p99.9 latency measured from each request's "
                    "scheduled arrival, device utilization and queue depth, CPU utilization and "
                    "the DRAM hit rate. paced and direct run for real on --workers threads (or "
                    "processes); modeled serves the requests in arrival order on the shared "
                    "device queues (deterministic; device time only). A request is one trace "
                    "batch (one request id for inference traces) unless --request-size splits "
                    "batches.")
    p.add_argument("trace", metavar="TRACE", help="sdm trace file (.npz)")
    p.add_argument("--config", default="sdm-nand", help="hierarchy preset or .toml (default sdm-nand)")
    p.add_argument("--rate", type=float, nargs="+", metavar="R", help="offered rates, requests/s")
    p.add_argument("--search", action="store_true",
                   help="also find the highest rate whose p99 stays within --sla-us (a rate that "
                        "misses is run again and judged on both runs together)")
    p.add_argument("--sla-us", type=float, default=30_000.0, help="p99 SLA in us (default 30000)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds of arrivals per rate (default 5)")
    p.add_argument("--warmup", type=float, help="seconds of each rate left out (default 10%% of --duration)")
    p.add_argument("--workers", type=int, default=8, help="worker threads or processes (default 8)")
    p.add_argument("--processes", action="store_true", help="worker processes over one store directory")
    p.add_argument("--cpu-slots", type=int, metavar="N",
                   help="lookups running CPU work at once in each serving process, the rest queued "
                        "(default: its cores; 0: no bound; see Store.open)")
    p.add_argument("--io-mode", choices=IO_MODES, help="override the config's IO mode")
    p.add_argument("--model", help="DLRM preset: each request also runs the forward pass; the trace's "
                                   "tables must be the preset's")
    p.add_argument("--fit-model", action="store_true",
                   help="rebuild the --model preset's MLPs over the trace's tables")
    add_store_arguments(p)
    p.add_argument("--json", nargs="?", const="-", metavar="OUT",
                   help="write the JSON result to OUT (no OUT or '-': stdout, instead of the table)")
    p.add_argument("--out", metavar="DIR", help="write load.md, load.json and load.png into DIR")
    p.set_defaults(func=_load)


def _load(args) -> int:
    from sdm.load import load_test
    from sdm.load.render import load_markdown, plot_load

    check_output_file(args.json)
    if args.out:
        make_output_dir(args.out)
    result = load_test(args.trace, args.config, rates=args.rate, search=args.search,
                       sla_us=args.sla_us, duration_s=args.duration, workers=args.workers,
                       processes=args.processes, io_mode=args.io_mode, store=args.store,
                       model=args.model, dim=args.dim, fmt=args.fmt,
                       request_size=args.request_size, warmup_s=args.warmup, seed=args.seed,
                       fit_model=args.fit_model, cpu_slots=args.cpu_slots)
    data = result.to_json()
    text = load_markdown(result)
    if args.out:
        write_text(os.path.join(args.out, "load.md"), text)
        write_text(os.path.join(args.out, "load.json"), json.dumps(data, indent=1) + "\n")
        plot_load([result], os.path.join(args.out, "load.png"))
    if not emit_json(args.json, data):
        print(text, end="")
    return 0

"""``sdm host``: the QPS one serving host sustains within a p99 SLA (the host model)."""

from __future__ import annotations

from sdm.cli import add_store_arguments, check_output_file, emit_json
from sdm.errors import InvalidArgumentError


def register(sub) -> None:
    p = sub.add_parser(
        "host", help="predict the QPS one host sustains within the SLA (the host model)",
        description="Profile a trace's requests warm on this machine (hits and device blocks per "
                    "request from the control plane, CPU time per request measured on a live store, "
                    "with --model the DLRM's MLPs), then simulate the host serving them as open-loop "
                    "Poisson traffic on its cores and devices. Reports the QPS at the SLA, the "
                    "bottleneck, utilizations and the latency-load curve.")
    p.add_argument("trace", metavar="TRACE", help="sdm trace file (.npz)")
    p.add_argument("--config", default="sdm-nand", help="hierarchy preset or .toml (default sdm-nand)")
    p.add_argument("--host", default="this-machine",
                   help="host preset (this-machine, 2-socket) or a host .toml (default this-machine)")
    p.add_argument("--disk", metavar="TOML", help="this machine's disk from `sdm devices calibrate -o` "
                                                  "(the device direct IO reads)")
    p.add_argument("--platform-seconds", type=float, metavar="S",
                   help="with --host this-machine: measure the machine's stalls for S seconds of spinning "
                        "(default 1; rare long stalls need longer)")
    p.add_argument("--model", help="DLRM preset: requests also run its forward pass (its dim wins); the "
                                   "trace's tables must be the preset's")
    p.add_argument("--fit-model", action="store_true",
                   help="rebuild the --model preset's MLPs over the trace's tables")
    p.add_argument("--io-mode", choices=("modeled", "paced", "direct"), help="override the config's IO mode")
    p.add_argument("--sla-us", type=float, default=30_000.0, help="p99 SLA in us (default 30000)")
    p.add_argument("--rate", type=float, nargs="+", metavar="R",
                   help="offered rates of the curve, requests/s (default: around the QPS at the SLA)")
    p.add_argument("--workers", type=int, help="at most N requests in service at once, as sdm load --workers N: "
                                               "N worker threads of one process (their GIL measured on this "
                                               "machine, --host this-machine only), or with --processes N "
                                               "worker processes (default: no limit)")
    p.add_argument("--processes", action="store_true", help="the --workers are processes, as sdm load --processes")
    p.add_argument("--cpu-slots", type=int, metavar="N",
                   help="with thread --workers: the store's bound on lookups running CPU work at once, as "
                        "sdm load --cpu-slots (default: the cores; 0: no bound)")
    p.add_argument("--arrivals", type=int, default=100_000, help="simulated requests per rate (default 100000)")
    add_store_arguments(p)
    p.add_argument("--json", nargs="?", const="-", metavar="OUT",
                   help="write the JSON result to OUT (no OUT or '-': stdout, instead of the summary)")
    p.add_argument("--plot", metavar="OUT.png", help="write the latency-load curve as a PNG")
    p.set_defaults(func=_host)


def _host(args) -> int:
    from sdm.host import predict, this_machine
    from sdm.host.spec import THIS_MACHINE
    from sdm.host.render import host_markdown, plot_host
    from sdm.load.run import cpu_model
    from sdm.store.config import with_io_mode

    for path in (args.json, args.plot):  # the output rule of every command (sdm.cli)
        check_output_file(path)
    if args.processes and args.workers is None:
        raise InvalidArgumentError("--processes describes the --workers; give --workers N")
    if args.cpu_slots is not None and (args.workers is None or args.processes):
        raise InvalidArgumentError("--cpu-slots bounds one process's thread workers; give --workers N "
                                   "without --processes")
    config = args.config if args.io_mode is None else with_io_mode(args.config, args.io_mode)
    host = args.host
    if args.platform_seconds is not None:
        if host != THIS_MACHINE:
            raise InvalidArgumentError(f"--platform-seconds measures this machine; it needs --host {THIS_MACHINE}, "
                                       f"not {host!r}")
        host = this_machine(args.disk, platform_s=args.platform_seconds)
    result = predict(args.trace, config, host, model=args.model, sla_us=args.sla_us, rates=args.rate,
                     workers=args.workers, arrivals=args.arrivals, seed=args.seed, dim=args.dim, fmt=args.fmt,
                     request_size=args.request_size, store=args.store, disk=args.disk,
                     fit_model=args.fit_model, threads=args.workers is not None and not args.processes,
                     cpu_slots=args.cpu_slots)
    data = {**result.to_json(), "cpu": cpu_model()}
    if args.plot:
        plot_host([result], args.plot)
    if not emit_json(args.json, data):
        print(host_markdown(result), end="")
        print(f"cpu: {data['cpu']}")
    return 0

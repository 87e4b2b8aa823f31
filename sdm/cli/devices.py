"""``sdm devices``: the device presets, their model figures and the source of each number;
``sdm devices calibrate PATH`` fits the device model to the disk holding PATH."""

from __future__ import annotations

import json
import sys

from sdm.cli import check_output_folder, write_text

from sdm.devices import DEVICES, DeviceSpec

# (field, column header, format) of the table, in order.
_COLUMNS = (
    ("access_bytes", "block B", "{:.0f}"),
    ("read_latency_us", "lat us", "{:g}"),
    ("max_read_iops", "max IOPS", "{:,.0f}"),
    ("read_bandwidth_gbps", "GB/s", "{:g}"),
    ("active_watts", "W act", "{:g}"),
    ("idle_watts", "W idle", "{:g}"),
    ("capacity_gb", "GB", "{:g}"),
    ("usd_per_gb", "$/GB", "{:g}"),
)


def register(sub) -> None:
    p = sub.add_parser("devices", help="list device presets with their figures and sources",
                       description="List the device presets of sdm.DEVICES: the figures the device "
                                   "model uses and where each comes from. '*' marks a figure no "
                                   "public source here confirms (a parameter).")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_run)
    sub_devices = p.add_subparsers(dest="devices_command", metavar="SUBCOMMAND")
    c = sub_devices.add_parser(
        "calibrate", help="fit the device model to the disk holding PATH (O_DIRECT reads)",
        description="Measure the device holding PATH with O_DIRECT random reads at queue depths "
                    "1-64 (and 1 MiB reads for bandwidth), fit the device model (latency, max "
                    "IOPS: units = IOPS x latency; bandwidth), print the fit error and the host's "
                    "CPU time per read at each queue depth, and write the device as TOML, which a "
                    "hierarchy names with device = \"FILE.toml\".")
    c.add_argument("path", metavar="PATH", help="a directory on the device (a test file is written "
                                                "there and removed) or a file of >= 64 MiB")
    c.add_argument("--seconds", type=float, default=1.0, help="seconds per queue depth (default 1)")
    c.add_argument("--file-mib", type=int, default=1024, help="test file size in MiB (default 1024)")
    c.add_argument("--name", help="the device's name (default disk-<device id>)")
    c.add_argument("-o", "--output", metavar="TOML", help="write the fitted device here")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(func=_calibrate)


def _run(args) -> int:
    devices = list(DEVICES.values())
    if args.json:
        print(json.dumps([device_json(d) for d in devices], indent=1))
    else:
        print(render_table(devices))
    return 0


def _calibrate(args) -> int:
    from sdm.tiers.calibrate import calibrate

    if args.output:
        check_output_folder(args.output)
    cal = calibrate(args.path, seconds=args.seconds, file_bytes=args.file_mib << 20, name=args.name,
                    progress=lambda text: print(f"sdm devices calibrate: {text}", file=sys.stderr))
    if args.output:
        write_text(args.output, cal.to_toml())
    if args.json:
        print(json.dumps(cal.to_json(), indent=1))
        return 0
    print("| queue depth | IOPS | latency us | CPU us per read | model IOPS | model latency us | IOPS error "
          "| latency error |")
    print("|---|---|---|---|---|---|---|---|")
    for p in cal.points:
        print(f"| {p['queue_depth']} | {p['iops']:,.0f} | {p['latency_us']:.1f} | {p['cpu_us_per_read']:.1f} "
              f"| {p['model_iops']:,.0f} | {p['model_latency_us']:.1f} | {p['iops_error']:+.1%} "
              f"| {p['latency_error']:+.1%} |")
    d = cal.device
    print(f"\nfit: latency {d.read_latency_us:.1f} us, max {d.max_read_iops:,.0f} IOPS, "
          f"{cal.units:.1f} units, {d.read_bandwidth_gbps:.2f} GB/s"
          + (f"; wrote {args.output}" if args.output else ""))
    return 0


def device_json(device: DeviceSpec) -> dict:
    """A device's fields, sources, unverified fields and modeled latency at QD 1/4/16/64."""
    data = device.to_json()
    data["modeled"] = {f"qd{q}": {"latency_us": device.latency_ns(q) / 1e3, "iops": device.iops(q)}
                       for q in (1, 4, 16, 64)}
    return data


def render_table(devices) -> str:
    """The Markdown-style table of ``devices`` and, below it, every figure's source."""
    header = ["device", "media"] + [h for _, h, _ in _COLUMNS]
    rows = []
    for d in devices:
        cells = [d.name, d.media]
        for name, _, fmt in _COLUMNS:
            cells.append(fmt.format(getattr(d, name)) + ("*" if name in d.unverified else ""))
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    lines.append("")
    lines.append("* = unverified: a parameter, not a published figure.")
    lines.append("Model: units = max IOPS x lat reads in service at once, shared by every request (a batch "
                 "takes the units earlier ones left free, first come first served once all are busy); a "
                 "lone batch at queue depth q: max(lat, q / max IOPS) per read; reads are whole blocks.")
    lines.append("")
    lines.append("Sources:")
    for d in devices:
        lines.append(f"  {d.name}:")
        for name, text in d.sources:
            lines.append(f"    {name}: {text}")
    return "\n".join(lines)

"""``sdm devices``: the device presets, their model figures and the source of each number."""

from __future__ import annotations

import json

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


def _run(args) -> int:
    devices = list(DEVICES.values())
    if args.json:
        print(json.dumps([device_json(d) for d in devices], indent=1))
    else:
        print(render_table(devices))
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
    lines.append("Model: latency at queue depth q = max(lat, q / max IOPS); reads are whole blocks.")
    lines.append("")
    lines.append("Sources:")
    for d in devices:
        lines.append(f"  {d.name}:")
        for name, text in d.sources:
            lines.append(f"    {name}: {text}")
    return "\n".join(lines)

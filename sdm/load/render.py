"""Renderers of :class:`~sdm.load.run.LoadResult`: Markdown and the latency-throughput PNG.
Renderers only format; every number comes from the result."""

from __future__ import annotations

import os

__all__ = ["load_markdown", "plot_load"]


def _us(x) -> str:
    return "-" if x is None else f"{x:,.0f}"


def load_markdown(r) -> str:
    """The result as a Markdown table, one row per offered rate, ascending."""
    head = [f"# sdm load: {os.path.basename(r.trace)} under {r.config} ({r.io_mode})", "",
            f"CPU: {r.cpu}. Latency: {r.latency_note}. {r.duration_s:g} s per rate"
            + (f", DLRM {r.model} forward per request" if r.model else "") + ".", ""]
    devices = sorted({d for p in r.points for d in p.devices})
    cols = ["offered QPS", "achieved QPS", "p50 us", "p95 us", "p99 us", "p99.9 us", "requests",
            "DRAM hit rate", "CPU util"] + [f"{d} util / QD" for d in devices]
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for p in sorted(r.points, key=lambda p: p.offered_qps):
        lat = p.latency_us
        cells = [f"{p.offered_qps:,.4g}", f"{p.achieved_qps:,.4g}", _us(lat["p50"]), _us(lat["p95"]),
                 _us(lat["p99"]), _us(lat["p999"]),
                 f"{p.requests:,}" + (f" ({p.runs} runs)" if p.runs > 1 else ""),
                 "-" if p.dram_hit_rate is None else f"{p.dram_hit_rate:.3f}",
                 "-" if p.cpu_utilization is None else f"{p.cpu_utilization:.2f}"]
        for d in devices:
            dev = p.devices.get(d)
            cells.append("-" if dev is None else f"{dev['utilization']:.2f} / {dev['mean_queue_depth']:.1f}")
        rows.append("| " + " | ".join(cells) + " |")
    tail = [""]
    if r.knee_qps is not None:
        tail.append(f"Knee: the store kept up with offered load up to {r.knee_qps:,.0f} requests/s "
                    f"(achieved within 5%).")
    if r.sla_us is not None and r.qps_at_sla is not None:
        tail.append(f"QPS at the p99 SLA of {r.sla_us:,.0f} us: {r.qps_at_sla:,.0f} requests/s.")
    if any(p.runs > 1 for p in r.points):
        tail.append("A rate whose p99 missed the SLA was run again and is judged on both runs' "
                    "requests (\"runs\").")
    return "\n".join(head + rows + tail) + "\n"


def _pyplot():
    import matplotlib  # on the first plot only: importing it costs ~0.5 s
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_load(results, path) -> str:
    """p50 and p99 latency against achieved throughput, one line pair per result; one PNG."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for r in results:
        pts = sorted(r.points, key=lambda p: p.offered_qps)
        x = [p.achieved_qps for p in pts]
        line, = ax.plot(x, [p.latency_us["p99"] for p in pts], marker="o", label=f"{r.config} p99")
        ax.plot(x, [p.latency_us["p50"] for p in pts], marker=".", linestyle="--",
                color=line.get_color(), label=f"{r.config} p50")
        if r.sla_us is not None:
            ax.axhline(r.sla_us, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("achieved throughput (requests/s)")
    ax.set_ylabel("latency from scheduled arrival (us)")
    ax.set_yscale("log")
    ax.set_title(f"sdm load ({results[0].io_mode}) on {results[0].cpu}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return os.fspath(path)

"""Renderers of a :class:`~sdm.host.predict.HostResult`: Markdown and the latency-load PNG.

Renderers only format; matplotlib is imported only when a plot is asked for.
"""

from __future__ import annotations

import os

from sdm.errors import InvalidArgumentError
from sdm.tiers.slots import cpu_slots_text

__all__ = ["host_markdown", "plot_host"]


def _us(x) -> str:
    return "-" if x is None else (f"{x / 1e3:,.2f} ms" if x >= 1e4 else f"{x:,.1f} µs")


def host_markdown(r) -> str:
    """A Markdown summary: the QPS at the SLA, the bottleneck, utilizations and the curve."""
    p, s = r.profile, r.sla
    prof = p.summary()
    cpu = prof["cpu_us_per_request"]
    lines = [
        f"# sdm host: `{os.path.basename(p.trace)}` through `{p.config}` on `{p.host.name}`", "",
        f"- host: {p.host.cores} cores at speed {p.host.core_speed:g}; devices: "
        + ", ".join(f"{d['name']} ({d['units']:.1f} units, {d['latency_us']:g} µs)" for d in prof["devices"]),
        f"- {p.requests:,} profiled requests (warm: the trace's second pass), {prof['lookups_per_request']:,.0f} "
        f"lookups each; DRAM hit rate {p.hit_rate:.4f}"
        + ("" if p.settles_after is None else f", settled after {p.settles_after:,} requests"),
        f"- CPU per request: embeddings {_us(cpu['embeddings'])}, bottom MLP {_us(cpu['bottom_mlp'])}, "
        f"interaction + top MLP {_us(cpu['interaction_top_mlp'])}"
        + (f", device reads {_us(cpu['device_reads'])} (direct IO's readers)" if cpu["device_reads"] else "")
        + (f" (model `{p.model}`)" if p.model else ""),
        _platform_line(p.host.platform),
        _cold_line(prof["cold_core"], p.io_mode, prof["reads_issue_after_us"]),
        f"- {r.arrivals:,} simulated Poisson arrivals per rate"
        + ("" if r.workers is None else f", at most {r.workers} in service"
           + (" (threads of one process)" if r.threads else " (worker processes)")),
        *([] if prof["threads"] is None else [_threads_line(prof["threads"], prof["cpu_slots"])]), "",
        f"**QPS at SLA (p{s.percentile:g} <= {_us(s.sla_us)}): {s.qps:,.1f} requests/s**; bottleneck: "
        f"**{s.bottleneck}**; zero-load p{s.percentile:g} {_us(s.zero_load_us)}; saturation "
        f"{'-' if s.saturation_qps == float('inf') else f'{s.saturation_qps:,.1f}'}/s", "",
    ]
    if r.utilization:
        lines += ["| resource | utilization at the QPS at SLA |", "|---|---|"]
        lines += [f"| {k} | {v:.3f} |" for k, v in r.utilization.items()]
        lines.append("")
    lines += ["| offered QPS | p50 | p95 | p99 | p99.9 | cores busy |", "|---|---|---|---|---|---|"]
    for c in r.curve:
        lat = c.latency_us
        lines.append(f"| {c.offered_qps:,.1f} | {_us(lat['p50'])} | {_us(lat['p95'])} | {_us(lat['p99'])} "
                     f"| {_us(lat['p999'])} | {c.utilization['cores']:.2f} |")
    return "\n".join(lines) + "\n"


def _threads_line(curve, cpu_slots: int) -> str:
    line = (f"- one process's threads ({cpu_slots_text(cpu_slots)}), closed loop: " + ", ".join(
        f"{c['threads']} at {c['qps']:,.0f}/s ({_us(c['cpu_us_per_request'])} CPU each)" for c in curve))
    late = [c for c in curve if "wake_late_us" in c]
    if late:
        line += ("\n- a thread waking among them ran late by: " + "; ".join(
            f"p50 {_us(c['wake_late_us']['p50'])}, p95 {_us(c['wake_late_us']['p95'])} with {c['threads']} serving"
            for c in late))
    return line


def _cold_line(cold, io_mode, issue) -> str:
    reads = (f"reads issue as the CPU work reaches them (paced: the first {_us(issue['first'])}, the last "
             f"{_us(issue['last'])} into it, warm)" if io_mode == "paced" else "reads start after the embedding task")
    if not cold:
        return f"- cold cores: not modeled; {reads}"
    return ("- CPU after a core's idle gap: " + ", ".join(f"{c['cpu_factor']:.2f}x after {_us(c['idle_us'])}"
                                                      for c in cold if c["idle_us"] > 0) + f"; {reads}")


def _platform_line(platform) -> str:
    if platform is None:
        return "- platform: no stalls or wake-ups modeled"
    m = platform.summary()
    return (f"- platform: {m['stall_rate_per_s']:,.0f} stalls/s of running ({m['stolen_share']:.1%} of a core; "
            f"p50 {_us(m['stall_us']['p50'])}, p99 {_us(m['stall_us']['p99'])}, max {_us(m['stall_us']['max'])}), "
            f"wake-ups p50 {_us(m['wakeup_us']['p50'])}, p99 {_us(m['wakeup_us']['p99'])} late")


def plot_host(results, path) -> str:
    """Latency percentiles against offered QPS of one or more results, the SLA and each
    QPS at the SLA marked; one PNG at ``path``."""
    import matplotlib  # on the first plot only: importing it costs ~0.5 s
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if os.path.isdir(path):
        raise InvalidArgumentError(f"cannot write the plot to {os.fspath(path)!r}: it is a directory")
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for r in results:
        xs = [c.offered_qps for c in r.curve]
        label = f"{r.profile.config} on {r.profile.host.name}"
        for key, style in (("p50", ":"), ("p99", "-"), ("p999", "--")):
            ax.plot(xs, [c.latency_us[key] / 1e3 for c in r.curve], style, marker=".", label=f"{label} {key}")
        if r.sla.qps > 0:
            ax.axvline(r.sla.qps, color="grey", lw=0.8)
    if results:
        ax.axhline(results[0].sla.sla_us / 1e3, color="k", ls="--", lw=1, label="SLA")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.set_title("host model: latency against load")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
    return path

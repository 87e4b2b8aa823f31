"""Renderers of replay and sweep results: Markdown, the ``make run`` comparison table, PNG.

Renderers only format; every number comes from :class:`sdm.replay.live.ReplayResult` or
:class:`sdm.replay.sweep.SweepResult`. matplotlib is imported only
when plots are asked for.
"""

from __future__ import annotations

import os

import numpy as np

from sdm.errors import InvalidArgumentError

__all__ = ["replay_markdown", "comparison_table", "sweep_markdown", "plot_replay", "plot_sweep", "check_plot_path",
           "plural", "request_text"]


def _us(x) -> str:
    if x is None:
        return "-"
    return f"{x / 1e3:,.2f} ms" if x >= 1e4 else f"{x:,.1f} µs"


def _qps(x) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:,.2f}"


def _bytes(n) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,} B"


def plural(n: int, word: str) -> str:
    """``"1 batch"``, ``"32 batches"``, ``"1,024 requests"``."""
    return f"{n:,} {word if n == 1 else (word + 'es' if word.endswith(('s', 'ch')) else word + 's')}"


def request_text(definition: str) -> str:
    """What one request of a replay is, from its ``request_definition``."""
    return {"batch": "one trace batch",
            "request_ids": "one request id (user x items) of a batch"}.get(definition, f"{definition} of a batch")


def replay_markdown(r) -> str:
    """A Markdown summary of one :class:`~sdm.replay.live.ReplayResult`."""
    j = r.to_json()
    lat = j["latency_us"]
    what = (f"{plural(r.requests, 'request')} ({plural(r.samples, 'sample')}, {plural(r.lookups, 'lookup')}) "
            f"from {plural(r.batches, 'batch')}")
    lines = [
        f"# sdm replay: `{os.path.basename(r.trace)}` through `{r.config}`", "",
        f"- {what}; a request is {request_text(r.request_definition)}",
        f"- rows: dim {r.dim}, {r.fmt}; io mode `{r.io_mode}`" + (f"; model `{r.model}`" if r.model else ""),
        f"- replay speed: {r.lookups_per_s:,.0f} lookups/s ({r.wall_s:.3f} s in serving calls; "
        f"{r.lookups_per_s_after_first:,.0f} after the first request, which pays the store's setup); "
        f"CPU {r.cpu_us_per_request:,.1f} µs per request",
        "- DRAM hit rate (share of row reads served from DRAM; a cache counts distinct rows "
        "per request" + ("; each lookup of a bag the pooled cache served whole counts as one"
                          if r.pooled else "") + f"): {r.hit_rate:.4f}",
        f"- modeled device time: {j['modeled_s']:.4f} s; energy over it {r.energy_j:.4f} J", "",
        "## Latency per request (zero load)", "",
        "| | p50 | p95 | p99 | p99.9 |", "|---|---|---|---|---|",
        f"| modeled (device model) | {_us(lat['p50'])} | {_us(lat['p95'])} | {_us(lat['p99'])} "
        f"| {_us(lat['p999'])} |",
    ]
    if r.io_mode != "modeled":  # the devices really read (direct) or were waited for (paced)
        m = j["measured_latency_us"]
        lines.append(f"| measured (wall clock, {r.io_mode}) | {_us(m['p50'])} | {_us(m['p95'])} "
                     f"| {_us(m['p99'])} | {_us(m['p999'])} |")
    lines.append("")
    if r.pooled:
        p = r.pooled
        lines += ["## Pooled-embedding cache", "",
                  f"- {p['hits']:,} of {p['bags'] - p['empty']:,} non-empty bags served whole "
                  f"({p['bag_share']:.1%}: {p['cache_hits']:,} cached, {p['batch_repeats']:,} repeated "
                  f"within a batch); their {p['served_lookups']:,} lookups ({p['lookup_share']:.1%} of "
                  f"all) never reached a tier",
                  f"- {p['entries']:,} entries, {_bytes(p['bytes_used'])} of {_bytes(p['capacity_bytes'])}", ""]
    if r.sla is not None:
        s = r.sla
        at = "" if s.point is None else f"; p{s.percentile:g} there {_us(s.point.latency_us['p99'])}"
        lines += ["## Throughput under the SLA", "",
                  f"- SLA: p{s.percentile:g} <= {_us(s.sla_us)}; the host model (`sdm host`) on host "
                  f"`{r.host}`: the warm trace's requests as Poisson traffic on its cores and devices",
                  f"- **QPS at SLA: {_qps(r.qps_at_sla)}** requests/s per host (bottleneck {s.bottleneck}"
                  f"{at}; zero-load p{s.percentile:g} {_us(s.zero_load_us)})"]
        lines += [f"- no rate meets the SLA: {s.reason}", ""] if s.qps == 0 else [""]
    lines += ["## Tiers", "",
              "| tier | device | io mode | hits | misses | reads (blocks) | bytes read | read amp. "
              "| busy share | util. at SLA | energy J | modeled ms | measured ms |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in r.tiers:
        util = t.get("utilization_at_sla")
        lines.append(
            f"| {t['name']} | {t.get('device', '-')} | {t.get('io_mode', '-')} | {t.get('hits', 0):,} "
            f"| {t.get('misses', 0):,} | {t.get('reads', 0):,} | {_bytes(t.get('bytes_read', 0))} "
            f"| {t.get('read_amplification', 0.0):.2f} | {t.get('utilization', 0.0):.3f} "
            f"| {'-' if util is None else f'{util:.3f}'} | {t.get('energy_j', 0.0):.4f} "
            f"| {t.get('modeled_ns', 0) / 1e6:,.3f} | {t.get('wall_ns', 0) / 1e6:,.3f} |")
    lines += ["", "measured ms: each tier's own wall-clock time in reads (a cache's without the "
                  "tier below it)"]
    if r.extra:
        lines += ["", "## Extra", ""] + [f"- {k}: {v}" for k, v in r.extra.items()]
    return "\n".join(lines) + "\n"


def comparison_table(results) -> str:
    """One Markdown row per replay: the ``make run`` table."""
    host = next((r.host for r in results if r.host), None)
    rows = [f"| config | lookups/s | after 1st request | hit rate | p50 | p99 | QPS at SLA ({host or 'no host'}) "
            "| blocks read (last tier) | read amp. |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lat = r.latency_us
        last = r.tiers[-1] if r.tiers else {}
        blocks = f"{last.get('reads', 0):,} x {last.get('device', '?')}"
        rows.append(f"| {r.config} | {r.lookups_per_s:,.0f} | {r.lookups_per_s_after_first:,.0f} "
                    f"| {r.hit_rate:.3f} | {_us(lat['p50'])} "
                    f"| {_us(lat['p99'])} | {_qps(r.qps_at_sla)} | {blocks} "
                    f"| {last.get('read_amplification', 0.0):.2f} |")
    return "\n".join(rows)


def sweep_markdown(s) -> str:
    """A Markdown table of a :class:`~sdm.replay.sweep.SweepResult`: one row per point."""
    head = ["# sdm sweep: `" + os.path.basename(s.trace) + "`", "",
            f"{s.requests:,} requests, {s.lookups:,} lookups, {s.keys:,} cache keys; rows {s.row_bytes} B "
            f"(dim {s.dim}, {s.fmt}); queue depth SCM {s.queue_depth}, DRAM {s.cache_queue_depth}; SLA p99 <= {_us(s.sla_us)}; "
            f"{len(s.points)} points on {s.workers} threads in {s.wall_s:.2f} s", ""]
    cols = " | ".join(f"QPS {d}" for d in s.devices)
    head += [f"| policy | cache | rows | miss ratio | lookups/s | {cols} |",
             "|---|---|---|---|---|" + "---|" * len(s.devices)]
    for p in s.points:
        qps = " | ".join(_qps(p.devices[d]["qps_at_sla"]) for d in s.devices)
        head.append(f"| {p.policy} | {_bytes(p.cache_bytes)} | {p.capacity_rows:,} | {p.miss_ratio:.4f} "
                    f"| {p.lookups_per_s:,.0f} | {qps} |")
    return "\n".join(head) + "\n"


def _pyplot():
    import matplotlib  # on the first plot only: importing it costs ~0.5 s
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_replay(r, outdir) -> list[str]:
    """Write ``latency_cdf.png`` and ``hit_rate.png`` into ``outdir`` (created); returns the
    paths."""
    plt = _pyplot()
    os.makedirs(outdir, exist_ok=True)
    paths = []
    lat = np.sort(r.service_ns) / 1e3
    fig, ax = plt.subplots(figsize=(7, 4))
    if lat.size:
        ax.step(lat, np.arange(1, lat.size + 1) / lat.size, where="post", label="modeled, zero load")
    if r.sla is not None:
        ax.axvline(r.sla.sla_us, color="k", ls="--", lw=1, label=f"SLA {r.sla.sla_us:g} µs")
    ax.set_xlabel("modeled request latency (µs)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{r.config}: latency CDF ({r.requests} requests)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    paths.append(_save(plt, fig, outdir, "latency_cdf.png"))
    fig, ax = plt.subplots(figsize=(7, 4))
    if len(r.curve):
        ax.plot(r.curve[:, 0], r.curve[:, 1], marker=".")
    ax.set_xlabel("requests served")
    ax.set_ylabel("running DRAM hit rate")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{r.config}: hit rate over time")
    ax.grid(alpha=0.3)
    paths.append(_save(plt, fig, outdir, "hit_rate.png"))
    return paths


def check_plot_path(path) -> None:
    """InvalidArgumentError when ``path``, where a plot goes, is a directory."""
    if os.path.isdir(path):
        raise InvalidArgumentError(f"cannot write the sweep plot to {os.fspath(path)!r}: it is a "
                                   f"directory (give a file name like sweep.png)")


def plot_sweep(s, path) -> str:
    """Miss-ratio curves per policy (belady dashed, the lower bound) and QPS at SLA per device
    and cache size; one PNG at ``path``."""
    check_plot_path(path)
    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    mib = np.asarray(s.cache_sizes, dtype=np.float64) / (1 << 20)
    for policy, curve in s.curves.items():
        style = dict(ls="--", color="k") if policy == "belady" else {}
        a.plot(mib, curve, marker="o", label=policy, **style)
    a.set_xscale("log")
    a.set_xlabel("DRAM cache (MiB)")
    a.set_ylabel("miss ratio (distinct rows per request)")
    a.set_title("miss-ratio curves")
    a.grid(alpha=0.3)
    a.legend()
    for d in s.devices:
        for policy in s.policies:
            pts = sorted((p for p in s.points if p.policy == policy), key=lambda p: p.cache_bytes)
            qps = [np.nan if p.devices[d]["qps_at_sla"] is None else p.devices[d]["qps_at_sla"] for p in pts]
            b.plot([p.cache_bytes / (1 << 20) for p in pts], qps, marker=".", label=f"{policy} / {d}",
                   ls="--" if policy == "belady" else "-")
    b.set_xscale("log")
    b.set_yscale("log")
    b.set_xlabel("DRAM cache (MiB)")
    b.set_ylabel(f"QPS at p99 <= {s.sla_us:g} µs")
    b.set_title("modeled throughput under the SLA")
    b.grid(alpha=0.3)
    b.legend(fontsize=7)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    return _save(plt, fig, d, os.path.basename(path))


def _save(plt, fig, outdir, name) -> str:
    p = os.path.join(outdir, name)
    fig.tight_layout()
    fig.savefig(p, dpi=100, format="png")  # exactly at p, even without a .png suffix
    plt.close(fig)
    return p

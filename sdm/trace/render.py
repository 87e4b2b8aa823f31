"""Renderers of :class:`~sdm.trace.stats.TraceStats`: text, JSON (``TraceStats.to_json``), PNG.

Renderers only format; every number comes from the stats object. matplotlib is imported
only when plots are asked for.
"""

from __future__ import annotations

import os

import numpy as np

from sdm.errors import ConfigError
from sdm.trace.generate import REUSE_BIN_EDGES
from sdm.trace.stats import TraceStats

__all__ = ["stats_text", "plot_stats", "bin_labels"]


def bin_labels() -> list[str]:
    """Labels of the reuse bins in the locality_stats spelling: ``(0, 1]`` ... ``(32768+``."""
    lo = (0,) + REUSE_BIN_EDGES
    return [f"({a}, {b}]" for a, b in zip(lo, REUSE_BIN_EDGES)] + [f"({REUSE_BIN_EDGES[-1]}+"]


def stats_text(s: TraceStats) -> str:
    """A plain-text report; the two histograms use the locality_stats layout."""
    src = s.metadata.get("profile") or s.metadata.get("source") or s.metadata.get("generator") or "?"
    out = [
        f"trace      {s.path}  ({src})",
        f"batches    {s.batches}   samples {s.samples:,}   tables {len(s.tables)}",
        f"lookups    {s.lookups:,}   distinct (table,row) {s.distinct:,}",
        f"per batch  lookups {np.mean(s.lookups_per_batch):,.0f}   unique {np.mean(s.unique_per_batch):,.0f}"
        f"   avg reuse {s.avg_reuse_per_batch:.2f}" if s.batches else "per batch  -",
        f"zipf alpha {s.zipf_alpha:.3f}" if s.zipf_alpha is not None else "zipf alpha -",
        "",
        f"{'reuse bin':>16} {'rows':>7} {'lookups':>8}",
    ]
    for lab, r, lk in zip(bin_labels(), s.reuse_row_shares, s.reuse_lookup_shares):
        out.append(f"{lab:>16} {r:7.3f} {lk:8.3f}")
    st = s.stack
    out += ["", f"stack distance over the first {st['lookups']:,} lookups: cold {st['cold']:.3f}"
                f"   p50 {st['p50']}   p90 {st['p90']}   p99 {st['p99']}", "",
            f"{'table':>5} {'rows':>11} {'lookups':>11} {'distinct':>10} {'pooling':>8} {'alpha':>6}"]
    for t in s.tables:
        a = f"{t.zipf_alpha:6.3f}" if t.zipf_alpha is not None else f"{'-':>6}"
        out.append(f"{t.table:5d} {t.size:11,d} {t.lookups:11,d} {t.distinct:10,d} {t.pooling:8.2f} {a}")
    return "\n".join(out)


def _pyplot():
    import matplotlib  # on the first plot only: importing it costs ~0.5 s
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_stats(s: TraceStats, outdir) -> list[str]:
    """Write PNG plots of ``s`` into ``outdir`` (created); returns the paths written."""
    plt = _pyplot()
    outdir = os.fspath(outdir)
    try:
        os.makedirs(outdir, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot write plots into {outdir!r}: {exc.strerror}") from None
    paths = []

    def save(fig, name):
        p = os.path.join(outdir, name)
        fig.tight_layout()
        fig.savefig(p, dpi=100)
        plt.close(fig)
        paths.append(p)

    x = np.arange(len(bin_labels()))
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar(x - 0.2, s.reuse_row_shares, 0.4, label="distinct rows")
    ax.bar(x + 0.2, s.reuse_lookup_shares, 0.4, label="lookups")
    ax.set_xticks(x, bin_labels(), rotation=60, fontsize=7)
    ax.set_xlabel("reuse per batch")
    ax.set_ylabel("share")
    ax.legend()
    ax.set_title("reuse histogram")
    save(fig, "reuse_histogram.png")

    fig, ax = plt.subplots(figsize=(5, 4))
    f = s.rank_frequency
    if f.size:
        ax.loglog(np.arange(1, f.size + 1), f, ".", ms=2)
    ax.set_xlabel("rank")
    ax.set_ylabel("lookups")
    ttl = f"rank-frequency (zipf alpha {s.zipf_alpha:.2f})" if s.zipf_alpha else "rank-frequency"
    ax.set_title(ttl)
    save(fig, "rank_frequency.png")

    fig, ax = plt.subplots(figsize=(5, 4))
    st = s.stack
    if st["bins"]:
        cdf = st["cold"] + np.cumsum(st["shares"])
        ax.semilogx(st["bins"], cdf, drawstyle="steps-post")
    ax.set_xlabel("LRU stack distance")
    ax.set_ylabel("share of lookups (cold included)")
    ax.set_title("stack distance CDF = LRU hit ratio vs cache rows")
    save(fig, "stack_distance.png")

    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(s.unique_per_batch, label="unique")
    ax.plot(s.lookups_per_batch, label="lookups")
    ax.set_xlabel("batch")
    ax.legend()
    ax.set_title("per batch")
    save(fig, "per_batch.png")

    if s.working_set is not None:
        fig, ax = plt.subplots(figsize=(5, 4))
        ax.plot(s.working_set[0], s.working_set[1])
        ax.set_xlabel("lookups replayed")
        ax.set_ylabel("distinct rows seen")
        ax.set_title("working set")
        save(fig, "working_set.png")
    return paths

"""Renderers of a power/cost report: Markdown, self-contained HTML, JSON, PNG plots.

They only format the dict :func:`sdm.report.build_report` computed. The HTML inlines its
style and embeds every plot as a ``data:image/png;base64`` URI, so it reads offline and
references nothing outside itself. matplotlib is imported only when plots are
drawn, with the Agg backend.
"""

from __future__ import annotations

import base64
import html
import json
import os

__all__ = ["markdown", "html_page", "json_text", "plot_all", "PLOT_FILES", "ESTIMATE_NOTE"]

ESTIMATE_NOTE = ("Model estimate: every host count, watt and dollar below is computed by the fleet "
                 "model of sdm.report.fleet from the inputs listed with their sources; none is a "
                 "measurement of a real fleet.")
PLOT_FILES = {"power": "power_by_config.png", "size": "savings_vs_model_size.png",
              "tornado": "sensitivity_tornado.png", "latency": "latency_load.png",
              "mrc": "miss_ratio_curve.png"}


_NO_REPLAYS = ("No replay results given: per-host QPS and hit rates come from the host model on each "
               "scenario's workload (QPS source host-model), or from a QPS typed in the scenario (override).")


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def _num(x, unit="") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, str):
        return x
    if isinstance(x, float) and not x.is_integer() or abs(x) < 1:
        text = f"{x:,.4g}" if abs(x) < 1e4 else f"{x:,.0f}"
    else:
        text = f"{int(x):,}"
    return f"{text} {unit}".rstrip()


def _kw(w) -> str:
    return "n/a" if w is None else f"{w / 1e3:,.1f} kW"


def _usd(x) -> str:
    return "n/a" if x is None else f"${x / 1e6:,.2f}M" if abs(x) >= 1e6 else f"${x:,.0f}"


def _config_rows(sc: dict) -> list[list[str]]:
    rows = []
    for c in sc["configs"]:
        wph = c["watts_per_host"]
        rows.append([c["name"], c["device"] or "-", c["regime"], c.get("bound", "-"), _num(c["qps_per_host"], "/s"),
                     c.get("qps_source", "-"), _num(c.get("hit_rate")),
                     _num(c["hosts_per_replica"]), _num(c["replicas"]), _num(c["hosts"]),
                     _num(c["dram_gb_per_host"], "GB"), _num(c["scm_devices_per_host"]),
                     "n/a" if wph is None else f"{sum(wph.values()):,.0f} W",
                     _kw(c["power_watts"]), _usd(c["capex_usd"]), _usd(c["opex_usd"]),
                     _usd(c["cost_usd"]), _pct(c["savings_vs_dram"]), _pct(c["cost_savings_vs_dram"])])
    return rows


_CONFIG_HEAD = ["config", "SCM device", "regime", "bound by", "QPS/host", "QPS source", "hit rate",
                "hosts/replica", "replicas", "hosts",
                "DRAM/host", "SCM devices/host", "W/host", "fleet power", "capex", "opex", "total cost",
                "power savings", "cost savings"]
_INPUT_HEAD = ["input", "value", "unit", "source"]
_SENS_HEAD = ["config", "input", "savings at -p", "savings at +p", "QPS/host at -p / +p", "hit rate at -p / +p"]
_HOST_HEAD = ["config", "hierarchy", "host", "cores", "SCM devices", "DRAM cache (share of rows)", "hit rate",
              "QPS at SLA", "bottleneck", "p99 at zero load", "CPU per request", "result"]


def _sens_rows(sc: dict) -> list[list[str]]:
    s = sc["sensitivity"]
    rows = [[r["config"], r["label"], _pct(r["low"]), _pct(r["high"]),
             f"{_num(r.get('qps_low'))} / {_num(r.get('qps_high'))}",
             f"{_num(r.get('hit_low'))} / {_num(r.get('hit_high'))}"] for r in s["rows"]]
    for name, (lo, hi) in s["corners"].items():
        rows.append([name, f"all inputs at once at their unfavourable / favourable end (+-{s['percent']:g}%)",
                     _pct(lo), _pct(hi), "", ""])
    return rows


def _host_rows(sc: dict) -> list[list[str]]:
    rows = []
    for name, r in sc.get("host_runs", {}).items():
        rows.append([name, r["hierarchy"], r["host"], _num(r["cores"]), _num(r["scm_devices"]),
                     _num(r["cache_fraction"]) if r["cache_fraction"] is not None else "all rows",
                     _num(r["hit_rate"]), _num(r["qps_at_sla"], "/s"), r["bottleneck"],
                     _num(r["zero_load_us"], "us"), _num(r.get("cpu_us_per_request"), "us"),
                     "cached" if r.get("cached") else f"computed in {r['seconds']:.1f} s"])
    return rows


_CHOICE_HEAD = ["config", "SCM devices/host", "QPS/host", "bottleneck", "hosts", "fleet power", "total cost",
                "chosen"]


def _choice_rows(sc: dict) -> list[list[str]]:
    rows = []
    for c in sc["configs"]:
        choice = c.get("scm_devices_choice") or {}
        for t in choice.get("candidates", []):
            rows.append([c["name"], _num(t["devices"]), _num(t["qps_per_host"], "/s"), t["bottleneck"] or "-",
                         _num(t["hosts"]), _kw(t["power_watts"]), _usd(t["cost_usd"]),
                         "yes" if t["devices"] == choice["chosen"] else ""])
    return rows


def _explain_lines(sc: dict) -> list[str]:
    out = []
    for x in sc.get("explain", []):
        bound = "; ".join(x["bound_text"])
        line = f"{x['config']}: host count bound by {x['bound']} (DRAM-only by {x['baseline_bound']}): {bound}."
        if x.get("scm_devices_text"):
            line += f" SCM devices per host: {x['scm_devices_text']}."
        if x.get("largest_measured_input"):
            line += (f" Of the measured inputs, {x['largest_measured_label']} moves its savings most "
                     f"({100 * x['largest_measured_spread']:.1f} points between -p and +p)")
            if x.get("largest_input") and x["largest_input"] != x["largest_measured_input"]:
                line += (f"; of all inputs, {x['largest_label']} "
                         f"({100 * x['largest_spread']:.1f} points)")
            line += "."
        elif x.get("largest_input"):
            line += (f" {x['largest_label']} moves its savings most ({100 * x['largest_spread']:.1f} points); "
                     f"no host-model input moves it (typed or replayed figures).")
        out.append(line)
    return out


def _md_table(head, rows) -> str:
    def cell(x):
        return str(x).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def markdown(report: dict) -> str:
    """The report as Markdown (plots referenced by file name beside it)."""
    out = [f"# {report['title']}", "", f"**{ESTIMATE_NOTE}**", "", report["summary"], ""]
    if report["replays"]:
        out += ["## Replay results used", "", _md_table(
            ["result", "config", "SCM device", "hit rate", "QPS at SLA", "SLA", "DRAM share"],
            [[r["source"], r["config"] or "-", r["device"] or "-", _num(r["hit_rate"]),
              _num(r["qps_at_sla"], "/s"), _num(r["sla_us"], "us"), _num(r["dram_fraction"])]
             for r in report["replays"]]), ""]
    else:
        out += [_NO_REPLAYS, ""]
    plots = report.get("plots") or {}
    if plots:
        out += ["## Plots", ""] + [f"![{k}]({v})" for k, v in plots.items()] + [""]
    for sc in report["scenarios"]:
        out += [f"## Scenario `{sc['name']}`", "", sc["description"], ""]
        out += ["### Where it lands against the paper's 5%-29% power savings", ""]
        out += [f"- **{p['config']}**: {_pct(p['savings'])} — {p['position']} the range. {p['why']}"
                for p in sc["paper"]] + [""]
        if sc.get("workload"):
            out += [f"Workload of the host model: {sc['workload']}; SLA p99 <= {sc['sla_us']:g} us.", ""]
        out += ["### What bounds it, and what moves it", ""] + [f"- {x}" for x in _explain_lines(sc)] + [""]
        out += ["### Fleet (model estimate)", "", _md_table(_CONFIG_HEAD, _config_rows(sc)), ""]
        if _choice_rows(sc):
            out += ["### SCM devices per host: the counts tried (host model), the least fleet power chosen", "",
                    _md_table(_CHOICE_HEAD, _choice_rows(sc)), ""]
        if sc.get("host_runs"):
            out += ["### Host model (per-host QPS and hit rate of each configuration)", "",
                    _md_table(_HOST_HEAD, _host_rows(sc)), ""]
        out += [f"### Sensitivity (each input +-{sc['sensitivity']['percent']:g}%)", "",
                _md_table(_SENS_HEAD, _sens_rows(sc)), "", sc["sensitivity_note"], ""]
        if sc["notes"]:
            out += ["### Notes", ""] + [f"- {n}" for n in sc["notes"]] + [""]
        out += ["### Inputs", "", _md_table(_INPUT_HEAD, [[i["key"], _num(i["value"]), i["unit"], i["source"]]
                                                          for i in sc["inputs"]]), ""]
    out += ["## Model", "", report["model_text"], ""]
    return "\n".join(out)


def _h_table(head, rows) -> str:
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


_CSS = """body{font-family:sans-serif;max-width:78em;margin:1em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.2em;font-size:.88em}
th,td{border:1px solid #bbb;padding:.2em .45em;text-align:left;vertical-align:top}
th{background:#eee}.estimate{background:#fff4d6;border:1px solid #e0b84c;padding:.6em}
img{max-width:100%;border:1px solid #ddd;margin:.4em 0}pre{white-space:pre-wrap}"""


def html_page(report: dict, images: dict[str, bytes]) -> str:
    """The report as one HTML page; ``images`` maps a plot key to its PNG bytes, embedded
    as data URIs (no file, network or script reference)."""
    e = html.escape
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{e(report['title'])}</title>"
             f"<style>{_CSS}</style></head><body>", f"<h1>{e(report['title'])}</h1>",
             f"<p class='estimate'><strong>{e(ESTIMATE_NOTE)}</strong></p>", f"<p>{e(report['summary'])}</p>"]
    if report["replays"]:
        parts += ["<h2>Replay results used</h2>", _h_table(
            ["result", "config", "SCM device", "hit rate", "QPS at SLA", "SLA", "DRAM share"],
            [[r["source"], r["config"] or "-", r["device"] or "-", _num(r["hit_rate"]),
              _num(r["qps_at_sla"], "/s"), _num(r["sla_us"], "us"), _num(r["dram_fraction"])]
             for r in report["replays"]])]
    else:
        parts.append(f"<p>{html.escape(_NO_REPLAYS)}</p>")
    if images:
        parts.append("<h2>Plots</h2>")
        for key, png in images.items():
            uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
            parts.append(f"<figure><img alt='{e(key)}' src='{uri}'><figcaption>{e(key)} "
                         f"(model estimate)</figcaption></figure>")
    for sc in report["scenarios"]:
        parts += [f"<h2>Scenario <code>{e(sc['name'])}</code></h2>", f"<p>{e(sc['description'])}</p>",
                  "<h3>Where it lands against the paper's 5%-29% power savings</h3><ul>"]
        parts += [f"<li><strong>{e(p['config'])}</strong>: {e(_pct(p['savings']))} &mdash; {e(p['position'])} "
                  f"the range. {e(p['why'])}</li>" for p in sc["paper"]]
        parts.append("</ul>")
        if sc.get("workload"):
            parts.append(f"<p>Workload of the host model: {e(sc['workload'])}; SLA p99 &le; {sc['sla_us']:g} us.</p>")
        parts += ["<h3>What bounds it, and what moves it</h3><ul>"] + [
            f"<li>{e(x)}</li>" for x in _explain_lines(sc)] + ["</ul>"]
        parts += ["<h3>Fleet (model estimate)</h3>", _h_table(_CONFIG_HEAD, _config_rows(sc))]
        if _choice_rows(sc):
            parts += ["<h3>SCM devices per host: the counts tried (host model), the least fleet power chosen</h3>",
                      _h_table(_CHOICE_HEAD, _choice_rows(sc))]
        if sc.get("host_runs"):
            parts += ["<h3>Host model (per-host QPS and hit rate of each configuration)</h3>",
                      _h_table(_HOST_HEAD, _host_rows(sc))]
        parts += [
                  f"<h3>Sensitivity (each input &plusmn;{sc['sensitivity']['percent']:g}%)</h3>",
                  _h_table(_SENS_HEAD, _sens_rows(sc)), f"<p>{e(sc['sensitivity_note'])}</p>"]
        if sc["notes"]:
            parts += ["<h3>Notes</h3><ul>"] + [f"<li>{e(n)}</li>" for n in sc["notes"]] + ["</ul>"]
        parts += ["<h3>Inputs</h3>", _h_table(_INPUT_HEAD, [[i["key"], _num(i["value"]), i["unit"], i["source"]]
                                                            for i in sc["inputs"]])]
    parts += ["<h2>Model</h2>", f"<pre>{e(report['model_text'])}</pre>", "</body></html>"]
    return "\n".join(parts) + "\n"


def json_text(report: dict) -> str:
    """``report.json``: the report dict, indented."""
    return json.dumps(report, indent=1, allow_nan=False) + "\n"


# -- plots -----------------------------------------------------------------------------------


def _pyplot():
    import matplotlib  # on the first plot only: importing it costs ~0.5 s
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_all(report: dict, outdir: str) -> dict[str, str]:
    """Draw the plots into ``outdir`` (the latency-load and miss-ratio curves only when a
    scenario ran the host model); returns ``{key: file name}``."""
    plt = _pyplot()
    files = {}
    for key, draw in (("power", _plot_power), ("latency", _plot_latency), ("mrc", _plot_mrc),
                      ("size", _plot_size), ("tornado", _plot_tornado)):
        fig = draw(plt, report)
        if fig is None:
            continue
        fig.savefig(os.path.join(outdir, PLOT_FILES[key]), dpi=90)
        plt.close(fig)
        files[key] = PLOT_FILES[key]
    return files


_COLORS = {"base": "#8c8c8c", "dram": "#3b75af", "scm": "#e08a2c"}


def _plot_power(plt, report):
    scs = report["scenarios"]
    fig, axes = plt.subplots(1, len(scs), figsize=(max(5.0, 3.6 * len(scs)), 4.2), squeeze=False)
    for ax, sc in zip(axes[0], scs):
        names = [c["name"] for c in sc["configs"]]
        bottom = [0.0] * len(names)
        for part in ("base", "dram", "scm"):
            vals = [(c["power_breakdown"] or {}).get(part, 0.0) / 1e3 for c in sc["configs"]]
            ax.bar(names, vals, bottom=bottom, color=_COLORS[part], label=part)
            bottom = [b + v for b, v in zip(bottom, vals)]
        for i, c in enumerate(sc["configs"]):
            label = "infeasible" if c["power_watts"] is None else f"{c['hosts']} hosts"
            ax.annotate(label, (i, bottom[i]), ha="center", va="bottom", fontsize=7)
        ax.set_title(sc["name"], fontsize=9)
        ax.set_ylabel("fleet power (kW)")
        ax.tick_params(axis="x", labelsize=7, rotation=20)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Power by configuration, stacked by component (model estimate)", fontsize=10)
    fig.tight_layout()
    return fig


def _plot_size(plt, report):
    scs = report["scenarios"]
    fig, axes = plt.subplots(1, len(scs), figsize=(max(5.0, 3.6 * len(scs)), 4.0), squeeze=False, sharey=True)
    lo, hi = report["paper_savings_range"]
    for ax, sc in zip(axes[0], scs):
        curve = sc["model_size_curve"]
        for name, ys in curve["savings"].items():
            pts = [(x, 100 * y) for x, y in zip(curve["table_gb"], ys) if y is not None]
            if pts:
                ax.plot(*zip(*pts), marker=".", label=name)
        ax.axhspan(100 * lo, 100 * hi, color="#9c9", alpha=0.25, label="paper: 5%-29%")
        ax.axvline(sc["model_gb"], color="#999", lw=0.8, ls="--", label="this scenario")
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xscale("log")
        ax.set_xlabel("embedding tables (GB)", fontsize=8)
        ax.set_title(sc["name"], fontsize=9)
    axes[0][0].set_ylabel("power savings vs DRAM-only (%)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Savings versus model size: the host model at each size's SCM devices per host, everything "
                 "else as in each scenario (model estimate)", fontsize=9)
    fig.tight_layout()
    return fig


def _plot_tornado(plt, report):
    panels = [(sc, name) for sc in report["scenarios"] for name in sc["sensitivity"]["nominal"]]
    if not panels:
        return None
    cols = min(2, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 2.3 * rows + 0.6), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (sc, name) in zip(axes.flat, panels):
        s = sc["sensitivity"]
        nominal = s["nominal"][name]
        rows_ = [r for r in s["rows"] if r["config"] == name]
        rows_.sort(key=lambda r: abs((r["high"] or 0) - (r["low"] or 0)))
        for i, r in enumerate(rows_):
            if nominal is None or r["low"] is None or r["high"] is None:
                continue
            for end, color in ((r["low"], "#3b75af"), (r["high"], "#e08a2c")):
                ax.barh(i, 100 * (end - nominal), left=100 * nominal, color=color, height=0.6)
        ax.set_yticks(range(len(rows_)))
        ax.set_yticklabels([r["label"] for r in rows_], fontsize=7)
        if nominal is not None:
            ax.axvline(100 * nominal, color="k", lw=0.8)
        ax.set_title(f"{sc['name']}: {name} (blue -{s['percent']:g}%, orange +{s['percent']:g}%)", fontsize=8)
        ax.set_xlabel("power savings (%)", fontsize=8)
    fig.suptitle("Sensitivity of the savings (model estimate)", fontsize=10)
    fig.tight_layout()
    return fig


def _plot_latency(plt, report):
    """Per scenario, each host-model configuration's p99 against offered load, the SLA and
    the QPS at the SLA marked: the curve behind each per-host QPS."""
    scs = [sc for sc in report["scenarios"] if any(r.get("curve") for r in sc.get("host_runs", {}).values())]
    if not scs:
        return None
    fig, axes = plt.subplots(1, len(scs), figsize=(max(5.0, 3.8 * len(scs)), 4.0), squeeze=False)
    for ax, sc in zip(axes[0], scs):
        for i, (name, run) in enumerate(sc["host_runs"].items()):
            pts = [(p["offered_qps"], p["latency_us"]["p99"] / 1e3) for p in run["curve"]]
            if not pts:
                continue
            color = f"C{i}"
            ax.plot(*zip(*pts), marker=".", color=color, label=f"{name}: {run['qps_at_sla']:,.4g}/s")
            if run["qps_at_sla"] > 0:
                ax.axvline(run["qps_at_sla"], color=color, lw=0.8, ls=":")
        ax.axhline(sc["sla_us"] / 1e3, color="k", lw=0.8, ls="--", label=f"SLA p99 {sc['sla_us'] / 1e3:g} ms")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())  # minor labels of a short log span overlap
        ax.set_xlabel("offered load (requests/s per host)", fontsize=8)
        ax.set_ylabel("p99 latency (ms)", fontsize=8)
        ax.set_title(sc["name"], fontsize=9)
        ax.legend(fontsize=6)
    fig.suptitle("Host model: p99 against offered load per host; dotted: the QPS at the SLA", fontsize=10)
    fig.tight_layout()
    return fig


def _plot_mrc(plt, report):
    """Per scenario, the workload's warm miss ratio against the DRAM cache's share of the
    rows, with the scenario's cache share and the host model's miss ratio there marked."""
    scs = [sc for sc in report["scenarios"] if sc.get("miss_ratio_curves")]
    if not scs:
        return None
    fig, axes = plt.subplots(1, len(scs), figsize=(max(5.0, 3.8 * len(scs)), 4.0), squeeze=False, sharey=True)
    for ax, sc in zip(axes[0], scs):
        for i, (name, m) in enumerate(sc["miss_ratio_curves"].items()):
            ax.plot(m["fractions"], m["miss_ratios"], marker=".", color=f"C{i}", label=f"{name} ({m['policy']})")
            ax.plot([m["chosen"]], [1.0 - m["hit_rate"]], marker="o", ms=8, mfc="none", color=f"C{i}")
            ax.axvline(m["chosen"], color=f"C{i}", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_ylim(0, 1)
        ax.set_xlabel("DRAM cache (share of the trace's rows)", fontsize=8)
        ax.set_title(sc["name"], fontsize=9)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("warm miss ratio (1 - hit rate)")
    fig.suptitle("Workload miss-ratio curve; circle: the chosen cache size and the host model's miss ratio",
                 fontsize=10)
    fig.tight_layout()
    return fig

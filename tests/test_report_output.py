"""Report files, the self-contained HTML, report.json's keys, and replay/sweep results as inputs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sdm.cli import main
from sdm.errors import ConfigError
from sdm.report import (apply_results, build_report, load_results, load_scenario, shipped_scenarios,
                        write_report)

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "traces" / "tiny-zipf.npz")  # 2 tables x 1000 rows
# The scenarios as shipped before they named a workload: every per-host QPS and hit rate typed
# in (overrides), so these tests of the fleet and of replay results run no host model.
TYPED = ROOT / "tests" / "data" / "typed-scenarios"


def typed_scenarios() -> list[str]:
    return sorted(str(p) for p in TYPED.glob("*.toml"))


def _replay(config, hits, misses, qps, *, device="nand-p4500", trace=TINY, capacity=400, cached=100):
    tiers = [{"name": "dram", "kind": "dram", "device": "dram", "hits": hits + misses, "misses": 0,
              "reads": 1, "bytes_read": 64, "read_amplification": 1.0}]
    if config != "dram":
        tiers = [{"name": "cache", "kind": "cache", "device": "dram", "hits": hits, "misses": misses,
                  "capacity_rows": capacity, "cached_rows": cached, "reads": hits, "bytes_read": 64 * hits,
                  "read_amplification": 1.0},
                 {"name": "mmap", "kind": "mmap", "device": device, "hits": misses, "misses": 0,
                  "reads": misses, "bytes_read": 4096 * misses, "read_amplification": 16.0}]
    return (f"{config}.json", {"config": config, "trace": trace, "lookups": 1000, "requests": 10,
                               "tiers": tiers, "latency_us": {"p50": 1, "p95": 2, "p99": 3, "p999": 4},
                               "sla_us": 30000.0, "qps_at_sla": qps, "cpu_us_per_request": 5.0})


REPLAYS = [_replay("dram", 900, 100, 20.0), _replay("sdm-nand", 800, 200, 10.0),
           _replay("sdm-3dxp", 800, 200, 50.0, device="optane-p4800x-512")]


def in_mode(name, mode, tmp_path):
    """A typed scenario with ``traffic.replay_qps`` set to ``mode``."""
    text = (TYPED / f"{name}.toml").read_text()
    p = tmp_path / f"{name}-{mode}.toml"
    p.write_text(re.sub(r'replay_qps = "\w+"', f'replay_qps = "{mode}"', text))
    return p


def test_replays_set_hit_rate_ratio_and_dram_share(tmp_path):
    s = load_scenario(in_mode("qps-bound", "ratio", tmp_path))
    s2 = apply_results(s, load_results(REPLAYS))
    nand = next(c for c in s2.configs if c.name == "sdm-nand")
    xp = next(c for c in s2.configs if c.name == "sdm-3dxp")
    assert nand.hit_rate == pytest.approx(0.8)
    assert nand.qps_ratio == pytest.approx(0.5)            # 10 / 20
    assert xp.qps_ratio == 1.0                              # 50 / 20, capped
    # The cache never filled: 100 cached rows of 2000 in the trace.
    assert nand.dram_fraction == pytest.approx(100 / 2000)
    assert "replay sdm-nand.json" in s2.source("configs.sdm-nand.qps_ratio")
    assert any("capped at 1x" in n for n in s2.notes)
    # The baseline's per-host QPS stays the scenario's (ratio mode).
    assert s2.baseline.qps_per_host == s.baseline.qps_per_host


def test_scenario_mode_takes_hit_rates_but_keeps_the_scenarios_qps():
    s = load_scenario(TYPED / "qps-bound.toml")
    assert s.traffic.replay_qps == "scenario"
    s2 = apply_results(s, load_results(REPLAYS))
    for before, after in zip(s.configs, s2.configs):
        assert (after.qps_per_host, after.qps_ratio) == (before.qps_per_host, before.qps_ratio)
    assert next(c for c in s2.configs if c.name == "sdm-nand").hit_rate == pytest.approx(0.8)
    assert any('replay_qps = "scenario"' in n for n in s2.notes)


def test_absolute_mode_and_unmatched_results(tmp_path):
    p = in_mode("small-model", "absolute", tmp_path)
    p.write_text(p.read_text().replace("sla_p99_us = 30000.0", "sla_p99_us = 20000.0"))
    extra = _replay("three-tier", 1, 1, 1.0)
    s = apply_results(load_scenario(p), load_results(REPLAYS + [extra]))
    assert s.baseline.qps_per_host == 20.0
    assert next(c for c in s.configs if c.name == "sdm-nand").qps_per_host == 10.0
    assert any("'three-tier' matches no configuration" in n for n in s.notes)
    assert any("SLA of 30000 us" in n for n in s.notes)


def test_sweep_result_applies_by_device(tmp_path):
    sweep = ("sweep.json", {"trace": TINY, "sla_us": 30000.0, "requests": 10, "lookups": 1000, "points": [
        {"policy": "lru", "cache_bytes": 1 << 16, "capacity_rows": 200, "hits": 70, "misses": 30,
         "devices": {"nand-p4500": {"qps_at_sla": 5.0}}},
        {"policy": "lru", "cache_bytes": 1 << 14, "capacity_rows": 50, "hits": 40, "misses": 60,
         "devices": {"nand-p4500": {"qps_at_sla": 2.0}}},
        {"policy": "belady", "cache_bytes": 1 << 16, "capacity_rows": 200, "hits": 90, "misses": 10,
         "devices": {"nand-p4500": {"qps_at_sla": 9.0}}}]})
    (m,) = load_results([sweep])
    assert (m.device, m.hit_rate, m.qps_at_sla, m.dram_fraction) == ("nand-p4500", 0.7, 5.0, 0.1)
    s = apply_results(load_scenario(in_mode("mixed", "ratio", tmp_path)), [m])
    nand = next(c for c in s.configs if c.name == "sdm-nand")
    assert nand.hit_rate == 0.7 and nand.dram_fraction == 0.1
    assert any("no replay of the baseline" in n for n in s.notes)


@pytest.mark.parametrize("data,message", [
    ({"config": "x"}, "neither an `sdm replay` result"),
    ({"config": "x", "tiers": []}, "'tiers' must be a non-empty list"),
    ({"config": "x", "tiers": [{"hits": "a", "misses": 1}]}, "numeric 'hits' and 'misses'"),
    ({"points": [{"policy": "belady"}]}, "no point with a policy other than belady"),
    ([1, 2], "must be a JSON object"),
])
def test_bad_results_are_config_errors(data, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_results([("r.json", data)])


def test_result_files_missing_or_not_json(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_results([tmp_path / "none.json"])
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(ConfigError, match="is not JSON"):
        load_results([tmp_path / "bad.json"])


def test_write_report_files_html_and_json(tmp_path):
    out = tmp_path / "rep"
    report = write_report(shipped_scenarios(), REPLAYS, out)
    names = {"report.md", "report.html", "report.json", "power_by_config.png",
             "savings_vs_model_size.png", "sensitivity_tornado.png"}
    assert names <= {p.name for p in out.iterdir()}
    assert all(Path(f).exists() for f in report["files"])
    assert (out / "power_by_config.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (out / "report.html").read_text()
    # Self-contained: no external src/href, no scripts or stylesheets, images inlined.
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert not re.search(r"<script|<link|@import|url\(", html, re.I)
    assert html.count("src='data:image/png;base64,") == 3
    assert "Model estimate" in html
    data = json.loads((out / "report.json").read_text())
    assert data["estimate"] is True and data["paper_savings_range"] == [0.05, 0.29]
    assert [s["name"] for s in data["scenarios"]] == [load_scenario(p).name for p in shipped_scenarios()]
    for sc in data["scenarios"]:
        for c in sc["configs"]:
            assert {"name", "hosts", "power_watts", "cost_usd", "savings_vs_dram"} <= set(c)
        assert {p["position"] for p in sc["paper"]} <= {"below", "within", "above", "n/a"}
        assert all(i["source"] for i in sc["inputs"])
    md = (out / "report.md").read_text()
    assert "Model estimate" in md and "| host.dram_w_per_gb |" in md and "![power](power_by_config.png)" in md
    assert "replay sdm-nand.json" in md


def test_report_without_replays_says_so_and_states_paper_positions():
    report = build_report(typed_scenarios())
    assert report["replays"] == []
    by_name = {sc["name"]: sc for sc in report["scenarios"]}
    # The typed scenarios, from their own figures: capacity-bound lands above the paper's
    # range (SCM removes hosts), qps-bound within (SCM trims DRAM per host), the small model
    # below (its tables fit the DRAM a host has anyway).
    pos = {(n, p["config"]): p["position"] for n, sc in by_name.items() for p in sc["paper"]}
    assert pos[("capacity-bound", "sdm-nand")] == "above"
    assert pos[("qps-bound", "sdm-nand")] == "within" and pos[("qps-bound", "sdm-3dxp")] == "within"
    assert pos[("small-model", "sdm-nand")] == "below"
    assert "removes 4 of 6 hosts" in next(p["why"] for p in by_name["capacity-bound"]["paper"])


def test_cli_report(tmp_path, capsys):
    scen = str(TYPED / "capacity-bound.toml")
    replay = tmp_path / "sdm-nand.json"
    replay.write_text(json.dumps(REPLAYS[1][1]))
    code = main(["report", "--scenario", scen, "--replay", str(replay), "-o", str(tmp_path / "o"), "--no-plots"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "capacity-bound" in out and "sdm-nand" in out and "Model estimate" in out
    data = json.loads((tmp_path / "o" / "report.json").read_text())
    assert data["scenarios"][0]["name"] == "capacity-bound"
    assert not (tmp_path / "o" / "power_by_config.png").exists()
    code = main(["report", "--scenario", scen, "--replay", str(tmp_path / "missing.json"), "-o", str(tmp_path / "p")])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "missing.json" in err


def test_real_replays_in_process_and_as_files(tmp_path):
    """The live `sdm replay` result shape, as objects and as `--json` files."""
    from sdm.host import replay_on_host

    results = [replay_on_host(TINY, c, progress=False, arrivals=5_000) for c in ("dram", "sdm-nand")]
    paths = []
    for r in results:
        p = tmp_path / f"{r.config}.json"
        p.write_text(json.dumps(r.to_json()))
        paths.append(p)
    for given in (results, paths):
        (d, n) = load_results(given)
        assert (d.config, n.config, n.device) == ("dram", "sdm-nand", "nand-p4500")
        assert n.hit_rate == pytest.approx(results[1].hit_rate)
        assert n.qps_at_sla == pytest.approx(results[1].qps_at_sla)
        assert 0 < n.dram_fraction <= 1
        s = apply_results(load_scenario(in_mode("mixed", "ratio", tmp_path)), [d, n])
        nand = next(c for c in s.configs if c.name == "sdm-nand")
        assert nand.qps_ratio == pytest.approx(min(1.0, n.qps_at_sla / d.qps_at_sla))
    report = write_report(TYPED / "mixed.toml", results, tmp_path / "out", plots=False)
    assert len(report["replays"]) == 2 and (tmp_path / "out" / "report.json").exists()

"""Scenario files: the shipped ones load, and every kind of bad file gets a ConfigError
naming the field (and one clean CLI line)."""

from __future__ import annotations

import pytest

from sdm.cli import main
from sdm.errors import ConfigError
from sdm.report import load_scenario, shipped_scenarios

GOOD = """
name = "t"
[model]
tables_gb = 100.0
[traffic]
target_qps = 1000.0
sla_p99_us = 30000.0
[host]
base_watts = 300.0
base_usd = 5000.0
dram_slots = 8
gb_per_dimm = 64.0
dram_w_per_gb = 0.3
dram_usd_per_gb = 3.0
ssd_slots = 4
[host.sources]
base_watts = "assumption: test"
[cost]
usd_per_kwh = 0.1
years = 3.0
[[configs]]
name = "dram"
qps_per_host = 500.0
[[configs]]
name = "sdm-nand"
device = "nand-p4500"
dram_fraction = 0.1
"""


def _write(tmp_path, text, name="s.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_good_scenario_loads_with_sources(tmp_path):
    s = load_scenario(_write(tmp_path, GOOD))
    assert s.name == "t" and s.model.table_gb == pytest.approx(100.0)
    assert s.source("host.base_watts") == "assumption: test"
    assert s.source("host.dram_slots").startswith("scenario file")
    # Device figures default to the preset's, with the preset's sources.
    dev = s.device("nand-p4500")
    assert dev.watts == 12.0 and dev.capacity_gb == 2000.0 and dev.usd == pytest.approx(500.0)
    assert "sdm.DEVICES" in s.source("devices.nand-p4500.watts")
    keys = {i["key"] for i in s.inputs()}
    assert {"host.base_watts", "devices.nand-p4500.watts", "cost.years", "configs.sdm-nand.dram_fraction"} <= keys
    assert all(i["source"] for i in s.inputs())


def test_shipped_scenarios_name_their_workload_and_type_no_qps():
    from sdm.host import HOST_PRESETS
    from sdm.model import PRESETS

    paths = shipped_scenarios()
    assert len(paths) >= 2
    for p in paths:
        s = load_scenario(p)
        w = s.workload
        assert w is not None, p
        assert (w.trace is not None) != (w.profile is not None)   # a trace file or a generator ...
        if w.profile is not None:
            assert dict(w.scale) and isinstance(w.seed, int)      # ... with its seed and scale
        assert w.model in PRESETS and w.host in HOST_PRESETS and s.traffic.sla_p99_us > 0
        # every per-host QPS and hit rate is the host model's: nothing typed
        assert not any(c.has_override for c in s.configs), p
        assert all(c.hit_rate is None for c in s.configs if not c.is_baseline), p
        assert all(s.source(f"workload.{k}") != "scenario file (no source given)" for k in ("profile", "model", "host"))


def test_typed_scenarios_load_and_cover_both_regimes():
    from pathlib import Path

    from sdm.report import evaluate

    paths = sorted(Path(__file__).resolve().parent.joinpath("data", "typed-scenarios").glob("*.toml"))
    assert len(paths) >= 2
    regimes = set()
    for p in paths:
        r = evaluate(load_scenario(p))
        regimes.add(r.baseline.regime)
        assert all(c.feasible and c.qps_source == "override" for c in r.configs)
    assert regimes == {"qps-bound", "capacity-bound"}


BAD = [
    # (change to GOOD, text expected in the message)
    (lambda t: t.replace("base_watts = 300.0\n", ""), "host.base_watts is missing"),
    (lambda t: t.replace("base_watts = 300.0", 'base_watts = "lots"'), "host.base_watts must be a finite number >= 0, got 'lots'"),
    (lambda t: t.replace("dram_slots = 8", "dram_slots = 8.5"), "host.dram_slots must be an integer in [1, 1024], got 8.5"),
    (lambda t: t.replace("dram_slots = 8", "dram_slots = true"), "host.dram_slots must be an integer in [1, 1024], got True"),
    (lambda t: t.replace("base_watts = 300.0", "base_watts = -3.0"), "host.base_watts must be a finite number >= 0, got -3.0"),
    (lambda t: t.replace("target_qps = 1000.0", "target_qps = 0.0"), "traffic.target_qps must be a finite number > 0, got 0.0"),
    (lambda t: t.replace("years = 3.0", "years = -1.0"), "cost.years must be a finite number >= 0, got -1.0"),
    (lambda t: t.replace("dram_fraction = 0.1", "dram_fraction = 1.5"), "dram_fraction must be a finite number in (0, 1], got 1.5"),
    (lambda t: t.replace("ssd_slots = 4", "ssd_slots = 4\nturbo = true"), "unknown key(s) ['turbo']"),
    (lambda t: t.replace("years = 3.0", "years = 3.0\n[extra]\nx = 1"), "unknown section(s) ['extra']"),
    (lambda t: t.replace('device = "nand-p4500"', 'device = "floppy"'), "device 'floppy' is not a preset"),
    (lambda t: t.replace("tables_gb = 100.0", 'preset = "gpt-9"'), "model.preset 'gpt-9' is not one of"),
    (lambda t: t.replace("tables_gb = 100.0", 'tables_gb = 100.0\npreset = "rm1"'), "exactly one of preset"),
    (lambda t: t.replace("tables_gb = 100.0", 'table_rows = [10, -1]\ndim = 4'), "model.table_rows must be"),
    (lambda t: t.replace("tables_gb = 100.0", 'tables_gb = 100.0\nfmt = "fp8"'), "model.fmt 'fp8' is not one of"),
    (lambda t: t.replace("[traffic]", "[traffic\n"), "is not valid TOML"),
    (lambda t: t.replace("[cost]", "[cost]\n[cost]"), "is not valid TOML"),
    (lambda t: t + "\n[devices.floppy]\nwatts = 1.0\n", "device 'floppy' is not a preset"),
    (lambda t: t + "\n[devices.nand-p4500]\nwattz = 1.0\n", "unknown key(s) ['wattz']"),
    (lambda t: t.replace('name = "sdm-nand"\ndevice = "nand-p4500"\ndram_fraction = 0.1', 'name = "dram2"'),
     "exactly one config must have no device"),
    (lambda t: t.replace('name = "sdm-nand"', 'name = "dram"'), "name 'dram' is used twice"),
    (lambda t: t.replace("dram_fraction = 0.1", "dram_fraction = 0.1\nqps_ratio = 1.0\nqps_per_host = 5.0"),
     "give qps_ratio or qps_per_host, not both"),
    (lambda t: t.replace("dram_w_per_gb = 0.3", "dram_w_per_gb = 0.3\nmin_dimms = 9"), "min_dimms 9 exceeds"),
    (lambda t: t.replace("dram_w_per_gb = 0.3", "dram_w_per_gb = 0.3\ndram_reserved_gb = 600.0"),
     "leaves no DRAM for tables"),
    (lambda t: t.replace('base_watts = "assumption: test"', 'bogus = "x"'), "sources names unknown key(s)"),
    (lambda t: t.replace("[traffic]", "[traffic]\nreplay_qps = \"maybe\""), "replay_qps 'maybe' is not one of"),
    (lambda t: t.replace("[[configs]]\nname = \"dram\"", "[[configs]]\nname = \"dram\"\ndram_fraction = 0.5"),
     "does not apply to the DRAM-only baseline"),
    (lambda t: t.replace("[cost]\nusd_per_kwh = 0.1\nyears = 3.0\n", ""), "section [cost] is missing"),
    (lambda t: t.replace("sla_p99_us = 30000.0", "sla_p99_us = nan"), "traffic.sla_p99_us must be a finite number > 0, got nan"),
]


@pytest.mark.parametrize("change,message", BAD, ids=[m for _, m in BAD])
def test_bad_scenarios_name_the_field(tmp_path, change, message):
    path = _write(tmp_path, change(GOOD))
    with pytest.raises(ConfigError) as err:
        load_scenario(path)
    assert message in str(err.value)


def test_missing_and_binary_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_scenario(tmp_path / "nope.toml")
    p = tmp_path / "bin.toml"
    p.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="scenario file"):
        load_scenario(p)


def test_baseline_without_qps_is_named_when_loaded(tmp_path):
    # Without a [workload] nothing measures it, so the file is refused as it is read.
    with pytest.raises(ConfigError, match=r"configs\.dram\.qps_per_host is missing \(required without a "
                                          r"\[workload\]"):
        load_scenario(_write(tmp_path, GOOD.replace("qps_per_host = 500.0\n", "")))


_CLI_BAD = BAD[:3] + BAD[10:12] + BAD[15:16]


@pytest.mark.parametrize("change,message", _CLI_BAD, ids=[m[:30] for _, m in _CLI_BAD])
def test_cli_prints_one_clean_error_line(tmp_path, capsys, change, message):
    path = _write(tmp_path, change(GOOD))
    code = main(["report", "--scenario", str(path), "-o", str(tmp_path / "out"), "--no-plots"])
    _, errtext = capsys.readouterr()
    assert code == 2
    lines = errtext.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sdm report: error: ")
    assert message in lines[0]
    assert not (tmp_path / "out" / "report.json").exists()

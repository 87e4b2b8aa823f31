"""``sdm host``: the JSON contract, the PNG, the Markdown with the CPU line, bad input."""

from __future__ import annotations

import json
from pathlib import Path

from sdm.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "traces" / "tiny-zipf.npz")


def test_sdm_host_writes_the_contract(tmp_path, capsys):
    out, png = tmp_path / "h.json", tmp_path / "h.png"
    assert main(["host", TINY, "--config", "sdm-nand", "--host", "this-machine", "--json", str(out), "--plot",
                 str(png), "--arrivals", "3000", "--dim", "8"]) == 0
    data = json.loads(out.read_text())
    assert data["qps_at_sla"] > 0 and isinstance(data["bottleneck"], str)
    assert set(data["utilization"]) >= {"cores", "dram bandwidth", "mmap tier"}
    assert 0 <= data["hit_rate"] <= 1 and data["host"]["name"] == "this-machine"
    assert all(set(c) >= {"offered_qps", "latency_us"} for c in data["curve"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "QPS at SLA" in capsys.readouterr().out


def test_sdm_host_rates_and_workers(tmp_path, capsys):
    assert main(["host", TINY, "--config", "dram", "--rate", "50", "100", "--workers", "2", "--processes",
                 "--arrivals", "2000", "--dim", "8", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [c["offered_qps"] for c in data["curve"]] == [50.0, 100.0] and data["workers"] == 2
    assert data["worker_kind"] == "processes" and data["profile"]["threads"] is None


def test_sdm_host_bad_input(tmp_path, capsys):
    assert main(["host", TINY, "--host", "nope", "--dim", "8"]) == 2
    assert "neither a preset" in capsys.readouterr().err
    assert main(["host", TINY, "--sla-us", "0", "--dim", "8", "--arrivals", "100"]) == 2
    assert "SLA" in capsys.readouterr().err
    assert main(["host", TINY, "--workers", "0", "--dim", "8", "--arrivals", "100"]) == 2
    assert "workers" in capsys.readouterr().err

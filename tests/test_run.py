"""The main job (`sdm run`, what `make run` calls) and the ingest bench run at toy size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sdm.cli import main
from sdm.replay.demo import DEFAULT_TRACE, run_demo

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "traces" / "tiny-zipf.npz")


def test_demo_presets_agree_and_count_reads(tmp_path):
    runs = run_demo(("dram", "sdm-nand", "sdm-3dxp"), trace=TINY, dim=8, workdir=str(tmp_path))
    dram, nand, xp = runs
    assert dram.lookups == nand.lookups == xp.lookups > 0
    sums = [r.extra["checksum"] for r in runs]
    assert max(sums) - min(sums) < 1e-6 * max(1.0, abs(sums[0]))
    assert [t["name"] for t in dram.tiers] == ["dram"]
    assert [t["name"] for t in nand.tiers] == ["cache", "mmap"]
    assert nand.tiers[1]["device"] == "nand-p4500" and xp.tiers[1]["device"] == "optane-p4800x-512"
    assert nand.tiers[1]["reads"] > 0 and nand.tiers[1]["bytes_read"] == nand.tiers[1]["reads"] * 4096
    # same misses, but 512 B sectors read far fewer bytes than 4 KiB pages
    assert nand.tiers[0]["misses"] == xp.tiers[0]["misses"]
    assert xp.tiers[1]["bytes_read"] < nand.tiers[1]["bytes_read"]
    assert all(r.qps_at_sla > 0 for r in runs)


def test_default_trace_is_bundled():
    assert DEFAULT_TRACE.is_file()


def test_cli_run_prints_a_table_and_writes_the_report(capsys, tmp_path):
    report = tmp_path / "report"
    assert main(["run", "--trace", TINY, "--dim", "8", "--batches", "2", "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "pooled results identical across presets: yes" in out
    for preset in ("dram", "sdm-nand", "sdm-3dxp"):
        assert f"| {preset} |" in out
    assert "QPS at SLA" in out and "read amp." in out
    assert "savings vs dram" in out and "| qps-bound | sdm-nand |" in out
    data = json.loads((report / "report.json").read_text())
    assert {c["name"] for sc in data["scenarios"] for c in sc["configs"]} >= {"dram", "sdm-nand", "sdm-3dxp"}
    assert (report / "report.md").is_file() and (report / "report.html").is_file()


def test_cli_run_json(capsys, tmp_path):
    assert main(["run", "--trace", TINY, "--dim", "8", "--batches", "1", "--presets", "dram", "--json",
                 "--no-report"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["identical"] and data["runs"][0]["config"] == "dram" and "report" not in data
    assert not (tmp_path / "report").exists()


def test_ingest_bench_smoke():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_ingest.py"), "--quick", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert '"rows_per_s"' in proc.stdout

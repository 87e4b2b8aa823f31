"""The main job (`sdm run`, what `make run` calls) and the ingest bench run at toy size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sdm.cli import main
from sdm.demo import run_demo

ROOT = Path(__file__).resolve().parents[1]


def test_demo_presets_agree_and_count_reads(tmp_path):
    runs = run_demo(("dram", "ssd"), batches=3, bags=32, workdir=str(tmp_path))
    dram, ssd = runs
    assert dram.lookups == ssd.lookups > 0
    assert abs(dram.checksum - ssd.checksum) < 1e-3 * max(1.0, abs(dram.checksum))
    assert [t["name"] for t in dram.tiers] == ["dram"]
    assert [t["name"] for t in ssd.tiers] == ["lmdb"] and ssd.tiers[0]["reads"] > 0
    assert ssd.tiers[0]["bytes_read"] >= ssd.tiers[0]["reads"] * 4096


def test_cli_run_prints_a_table(capsys):
    assert main(["run", "--batches", "2"]) == 0
    out = capsys.readouterr().out
    assert "pooled results identical across presets: yes" in out
    assert "dram" in out and "ssd" in out


def test_ingest_bench_smoke():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_ingest.py"), "--quick", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert '"rows_per_s"' in proc.stdout

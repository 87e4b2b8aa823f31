"""Smoke test: bench/bench_devices.py runs at toy size and its modeled figures equal the formula."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import assert_prints_cpu

ROOT = Path(__file__).resolve().parents[1]


def test_bench_devices_smoke(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_devices.py"), "--rows", "40000", "--batches", "4",
         "--direct-reads", "64", "--dir", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert_prints_cpu(report["machine"])
    assert report["targets"]["modeled = formula"] is True
    devices = {p["device"] for p in report["model"]}
    assert {"nand-p4500", "optane-p4800x-512", "dram"} <= devices
    assert {p["qd"] for p in report["model"]} == {1, 4, 16, 64}
    assert [p["qd"] for p in report["direct"]["points"]] == [1, 4, 16, 64]
    assert all(p["reads"] > 0 for p in report["direct"]["points"])

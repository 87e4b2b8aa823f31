"""Smoke test: bench/bench_open.py runs at toy size and prints every measure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_open_smoke(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_open.py"), "--rows", "20000",
                           "--reps", "1", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for measure in ("LMDB tree check", "open + first lookup", "pages unchecked", "every page checked"):
        assert measure in proc.stdout

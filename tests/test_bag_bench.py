"""Smoke tests: the gather and compile benchmarks run at toy size, so they cannot rot."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys

import pytest

from helpers import BENCH, assert_prints_cpu


def test_bench_gather_quick(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench_gather.py", "--quick", "--reps", "2"])
    monkeypatch.syspath_prepend(BENCH)  # as running the script would (bench/machine.py)
    with pytest.raises(SystemExit) as done:
        runpy.run_path(os.path.join(BENCH, "bench_gather.py"), run_name="__main__")
    assert done.value.code == 0
    out = capsys.readouterr().out
    for name in ("sdm-fp32", "sdm-fp16", "sdm-int8", "numpy"):
        assert f"| {name} |" in out
    assert "commit" in out
    assert_prints_cpu(out)


@pytest.mark.slow
def test_bench_compile_and_stale_check():
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "bench_compile.py"), "--check-stale"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK, edit picked up" in proc.stdout
    assert_prints_cpu(proc.stdout)

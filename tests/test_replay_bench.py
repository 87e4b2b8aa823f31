"""Smoke test: bench/bench_replay.py runs at toy size (so it cannot rot)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import bench_replay  # noqa: E402
from helpers import assert_prints_cpu  # noqa: E402


def test_bench_replay_quick(capsys):
    out = bench_replay.main(["--quick"])
    assert [row[0] for row in out["replay"]] == ["dram", "sdm-nand", "sdm-3dxp"]
    assert all(row[1] > 0 for row in out["replay"])
    s, rates = out["sweep_2"]
    assert len(s.points) == 3 * 2 and (rates > 0).all()
    out = capsys.readouterr().out
    assert "serving lookups/s" in out
    assert_prints_cpu(out)

"""Smoke test: bench/bench_policies.py runs at toy size (so it cannot rot)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import bench_policies  # noqa: E402
from helpers import assert_prints_cpu  # noqa: E402


def test_bench_policies_quick(capsys):
    rows = bench_policies.main(["--quick", "--policies", "lru,sieve,belady"])
    assert [r[0] for r in rows] == ["lru", "sieve", "belady"]
    belady = rows[-1][6]
    for policy, rate_sdm, rate_lcs, rate_lcs_default, ratio, ratio_default, mr_sdm, mr_lcs in rows:
        assert rate_sdm > 0 and 0.0 < mr_sdm < 1.0
        assert belady <= mr_sdm, policy  # Belady's MIN misses least at every capacity
    out = capsys.readouterr().out
    assert "regret vs belady" in out
    assert_prints_cpu(out)

"""Smoke test: bench/bench_pooled.py runs at toy size (so it cannot rot): every contender is
timed and the CPU model printed."""

from __future__ import annotations

from helpers import assert_prints_cpu, run_bench


def test_bench_pooled_quick():
    out = run_bench("bench_pooled", "--quick", timeout=600)
    assert_prints_cpu(out)
    for name in ("direct", "pooled-cache (user tables)", "pooled-cache (all tables)"):
        assert f"| {name} |" in out

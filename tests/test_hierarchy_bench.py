"""Smoke test: bench/bench_hierarchy.py runs at toy size (so it cannot rot) and prints every
section with the CPU model."""

from __future__ import annotations

from helpers import assert_prints_cpu, run_bench


def test_bench_hierarchy_quick(tmp_path):
    out = run_bench("bench_hierarchy", "--quick", "--dir", str(tmp_path), timeout=900)
    assert_prints_cpu(out)
    for section in ("## Presets and DRAM cache size", "## Each feature alone", "## Live data plane, all hits"):
        assert section in out
    for row in ("| sdm-nand | 5% |", "| baseline (lru, no placement) |", "| live store |", "| raw embedding_bag |"):
        assert row in out
    assert "All-hit, policy lru" in out and "All-hit, policy sieve" in out

"""Smoke test: bench/bench_open.py runs at toy size and prints every measure."""

from __future__ import annotations

from helpers import assert_prints_cpu, run_bench


def test_bench_open_quick(tmp_path):
    out = run_bench("bench_open", "--quick", "--dir", str(tmp_path), timeout=300)
    assert_prints_cpu(out)
    assert "1 table x 20,000 x 64 fp32" in out
    for measure in ("LMDB tree check", "open + first lookup", "pages unchecked", "every page checked"):
        assert measure in out

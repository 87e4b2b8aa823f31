"""Smoke test: bench/bench_updates.py runs at toy size (so it cannot rot) and prints both
tables with the CPU model."""

from __future__ import annotations

import re

from helpers import assert_prints_cpu, run_bench


def test_bench_updates_quick():
    out = run_bench("bench_updates", "--quick", timeout=600)
    assert_prints_cpu(out)
    assert "## Reader latency" in out and "## update_rows throughput" in out
    # the reader served batches beside a writer that applied updates
    row = re.search(r"^\| 1,000-row updates back to back \| (\d+) \| .* \| (\d+) \| (\d+) \|$", out, flags=re.M)
    assert row, out
    assert int(row[1]) > 0 and int(row[2]) > 0

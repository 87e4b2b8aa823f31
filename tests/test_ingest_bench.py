"""Smoke test: bench/bench_ingest.py runs at toy size (32 MiB) and reads its rows back (the
bench raises if they differ), printing the CPU model with its figures."""

from __future__ import annotations

import json

from helpers import assert_prints_cpu, run_bench
from sdm.load.run import cpu_model


def test_bench_ingest_quick():
    out = run_bench("bench_ingest", "--quick", timeout=600)
    assert_prints_cpu(out)
    assert "ingest 131,072 rows x 64 fp32" in out and "rows/s" in out


def test_bench_ingest_quick_json():
    result = json.loads(run_bench("bench_ingest", "--quick", "--json", timeout=600))
    assert result["rows"] == 131_072 and result["rows_per_s"] > 0
    assert result["cpu"] == cpu_model()

"""Smoke test: bench/bench_io_engine.py runs at toy size and prints every queue depth."""

from __future__ import annotations

import json

from helpers import assert_prints_cpu, run_bench


def test_bench_io_engine_quick(tmp_path):
    out = run_bench("bench_io_engine", "--quick", "--qd", "1", "4", "--dir", str(tmp_path),
                    "--json", str(tmp_path / "io.json"), timeout=300)
    assert_prints_cpu(out)
    rows = json.loads((tmp_path / "io.json").read_text())["rows"]
    assert [(r["qd"], r["callers"]) for r in rows] == [(1, 1), (1, 2), (4, 1), (4, 2)]
    for r in rows:
        assert "threads" in r and all(v["reads_per_s"] > 0 and v["cpu_us_per_read"] > 0
                                      for k, v in r.items() if k in ("aio", "threads"))
    assert "qd   4 x 2 callers" in out

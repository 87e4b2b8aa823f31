"""Smoke test: bench/bench_dlrm.py runs at toy size and reports every contender."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import assert_prints_cpu

BENCH = os.path.join(os.path.dirname(__file__), "..", "bench", "bench_dlrm.py")


def test_bench_dlrm_quick():
    proc = subprocess.run([sys.executable, BENCH, "--quick", "--json", "--threads", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    res = out["results"][0]
    assert res["threads"] == 1
    names = set(res["contenders"])
    assert {"sdm", "sdm-serial"} <= names
    for v in res["contenders"].values():
        assert v["median_s"] > 0 and v["samples_per_s"] > 0
        assert set(v["stages"]) == {"bottom_s", "embeddings_s", "interaction_s", "top_s"}
    assert "commit" in out["machine"]
    assert_prints_cpu(out["machine"])

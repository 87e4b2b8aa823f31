"""Smoke test: bench/bench_host.py runs at toy size (so it cannot rot): it finds a QPS at the
SLA, names a bottleneck for every configuration of the 2-socket host, and prints the CPU model."""

from __future__ import annotations

import re

from helpers import assert_prints_cpu, run_bench


def test_bench_host_quick():
    out = run_bench("bench_host", "--quick", timeout=900)
    assert_prints_cpu(out)
    speed = re.findall(r"^\| tiny-zipf.npz \| sdm-nand \| 5,000 \| (\d+) \| ([\d.]+) s \| ([\d,.]+) \|", out, re.M)
    assert speed and int(speed[0][0]) > 1 and float(speed[0][2].replace(",", "")) > 0, out
    rows = re.findall(r"^\| (meta-2021|rm2)-shaped .*? \| (dram|sdm-nand|sdm-3dxp) \| [\d.]+ \| .*? \| ([\d,]+) "
                      r"\| (cores|dram bandwidth|mmap tier|latency floor) \|", out, re.M)
    assert len(rows) == 6, out

"""Smoke test: bench/bench_serving.py runs at toy size (so it cannot rot): both worker counts
served every request, the CPU model is printed and the plot written, and no worker count
served more than the Nand model's ceiling (every unit busy) the bench prints."""

from __future__ import annotations

import re

from helpers import assert_prints_cpu, run_bench


def test_bench_serving_quick(tmp_path):
    png = tmp_path / "serving.png"
    out = run_bench("bench_serving", "--quick", "--plot", str(png), timeout=600)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_prints_cpu(out)
    rows = re.findall(r"^\| (\d+) \| ([\d,]+) \| ([\d.]+)x \|", out, flags=re.M)
    assert [int(w) for w, _, _ in rows] == [1, 4], out
    assert all(int(qps.replace(",", "")) > 0 for _, qps, _ in rows) and rows[0][2] == "1.00"
    ceiling = re.search(r"^Nand ceiling \(every unit busy\): ([\d,]+) requests/s = ([\d.]+)x one thread", out, flags=re.M)
    assert ceiling, out
    # paced reads complete within the run, so its reads per second never pass the device's
    assert int(ceiling[1].replace(",", "")) >= max(int(q.replace(",", "")) for _, q, _ in rows), out

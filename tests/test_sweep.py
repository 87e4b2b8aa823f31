"""sdm sweep: grid shape and JSON, points equal to sdm.simulate and to a live replay, belady
below every curve, threads agree with one thread, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import sdm
from sdm.cli import main
from sdm.errors import ConfigError, InvalidArgumentError
from sdm.replay.live import replay
from sdm.replay.requests import key_stream
from sdm.replay.queueing import qps_at_sla
from sdm.replay.sweep import DEFAULT_CACHE_QUEUE_DEPTH, parse_size, sweep
from sdm.trace import load

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "traces" / "tiny-zipf.npz")
SIZES = [64 * 32, 256 * 32, 1024 * 32]  # 64, 256, 1024 rows of 32 bytes (dim 8 fp32)


@pytest.fixture(scope="module")
def grid():
    return sweep(TINY, policies=["lru", "sieve", "s3fifo"], cache_sizes=SIZES,
                 devices=["nand-p4500", "optane-p4800x-512"], dim=8, sla_us=5_000)


def test_grid_json(grid):
    data = json.loads(json.dumps(grid.to_json()))
    assert data["policies"] == ["lru", "sieve", "s3fifo", "belady"]
    assert len(data["points"]) == 4 * 3 and data["lookups"] == 4082 and data["requests"] == 8
    for p in data["points"]:
        assert {"policy", "cache_bytes", "capacity_rows", "hits", "misses", "miss_ratio", "lookups_per_s",
                "devices"} <= set(p)
        assert p["capacity_rows"] == p["cache_bytes"] // 32
        for d in ("nand-p4500", "optane-p4800x-512"):
            entry = p["devices"][d]
            assert set(entry["latency_us"]) == {"p50", "p95", "p99", "p999"}
            assert entry["qps_at_sla"] is None or entry["qps_at_sla"] > 0
    assert set(data["curves"]) == set(data["policies"])


def test_points_equal_simulate(grid):
    with load(TINY) as tr:
        keys = key_stream(tr).keys
    for p in grid.points:
        sim = sdm.simulate(keys, policy=p.policy, capacity=p.capacity_rows)
        assert (p.hits, p.misses) == (sim.hits, sim.misses)


def test_belady_is_the_lower_bound(grid):
    curves = grid.curves
    for policy, curve in curves.items():
        assert all(b <= c + 1e-12 for b, c in zip(curves["belady"], curve)), policy
        assert all(a >= b - 1e-12 for a, b in zip(curve, curve[1:])) or policy != "lru"  # LRU: no anomaly


def test_point_latency_equals_a_live_replay(tmp_path):
    s = sweep(TINY, policies=["lru"], cache_sizes=[256 * 32], devices=["optane-p4800x-512"], dim=8,
              sla_us=5_000, request_size=16)
    toml = tmp_path / "c.toml"
    toml.write_text(f'[[tiers]]\nkind = "cache"\ncapacity_rows = 256\nqueue_depth = {DEFAULT_CACHE_QUEUE_DEPTH}\n'
                    '[[tiers]]\nkind = "mmap"\ndevice = "optane-p4800x-512"\nqueue_depth = 16\n')
    r = replay(TINY, str(toml), dim=8, request_size=16, sla_us=5_000, workdir=str(tmp_path))
    point = s.points[0]
    assert (point.hits, point.misses) == (r.tiers[0]["hits"], r.tiers[0]["misses"])
    got = point.devices["optane-p4800x-512"]
    assert got["device_reads"] == r.tiers[1]["reads"]
    assert got["latency_us"] == r.latency_us
    # the sweep's single-queue QPS over the live replay's own service times (a replay's QPS at
    # the SLA is now the host model's, sdm.host)
    assert got["qps_at_sla"] == pytest.approx(qps_at_sla(r.service_ns, 5_000).qps)


def test_threads_agree_with_one_thread(grid):
    one = sweep(TINY, policies=["lru", "sieve", "s3fifo"], cache_sizes=SIZES,
                devices=["nand-p4500", "optane-p4800x-512"], dim=8, sla_us=5_000, workers=1)
    for a, b in zip(grid.points, one.points):
        assert (a.policy, a.cache_bytes, a.hits, a.misses, a.devices) == \
               (b.policy, b.cache_bytes, b.hits, b.misses, b.devices)


def test_unmeetable_sla_is_reported_per_device():
    s = sweep(TINY, policies=["lru"], cache_sizes=["2K"], devices=["nand-p4500"], dim=8, sla_us=10)
    entry = s.points[0].devices["nand-p4500"]
    assert entry["qps_at_sla"] == 0 and "zero load" in entry["error"]


def test_parse_size():
    assert parse_size("64M") == parse_size("64MiB") == 64 << 20
    assert parse_size("1.5k") == 1536 and parse_size(4096) == 4096
    for bad in ("x", "12Q", "0", -1):
        with pytest.raises(InvalidArgumentError):
            parse_size(bad)


def test_errors(tmp_path):
    with pytest.raises(InvalidArgumentError, match="policy"):
        sweep(TINY, policies=["nope"], dim=8)
    with pytest.raises(ConfigError, match="not a preset"):
        sweep(TINY, devices=["floppy"], dim=8)
    with pytest.raises(InvalidArgumentError, match="holds no row"):
        sweep(TINY, cache_sizes=[16], dim=8)
    with pytest.raises(sdm.trace.TraceNotFoundError):
        sweep(str(tmp_path / "missing.npz"))


def test_cli(tmp_path, capsys):
    out = tmp_path / "s.json"
    plot = tmp_path / "mrc.png"
    assert main(["sweep", TINY, "--policies", "lru,fifo", "--cache-sizes", "2K", "8K", "--devices",
                 "nand-p4500", "--dim", "8", "--json", str(out), "--plot", str(plot)]) == 0
    assert "| lru |" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["policies"] == ["lru", "fifo", "belady"] and len(data["points"]) == 6
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["sweep", TINY, "--policies", "bogus", "--dim", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sdm sweep: error:")

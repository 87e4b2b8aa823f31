"""``sdm devices calibrate``: the model fit on synthetic measurements, and a real (short)
O_DIRECT run on this machine's disk whose TOML a hierarchy names."""

from __future__ import annotations

import numpy as np
import pytest

from sdm.cli import main
from sdm.errors import ConfigError, InvalidArgumentError
from sdm.store.config import load_device, load_toml
from sdm.tiers.calibrate import _fit_model, calibrate


@pytest.mark.parametrize("latency_us, iops", [(85.0, 645_000.0), (33.0, 95_000.0), (8.9, 585_000.0)])
def test_the_fit_recovers_a_device_the_model_describes(latency_us, iops):
    q = np.array([1, 2, 4, 8, 16, 32, 64], dtype=float)
    lat = np.maximum(latency_us, q / iops * 1e6)
    got_lat, got_iops = _fit_model(np.column_stack([q, lat]), iops)
    assert got_lat == pytest.approx(latency_us, rel=0.01)
    if (q / iops * 1e6 > latency_us).any():  # the throughput cap is visible only if reached
        assert got_iops == pytest.approx(iops, rel=0.01)


def test_calibrate_this_disk_and_name_it_in_a_hierarchy(tmp_path, capsys):
    out = tmp_path / "disk.toml"
    assert main(["devices", "calibrate", str(tmp_path), "--seconds", "0.05", "--file-mib", "64",
                 "--name", "this-disk", "-o", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| queue depth |" in table and "CPU us per read" in table and "fit: latency" in table
    device = load_device(out)
    assert device.name == "this-disk" and device.read_latency_us > 0 and device.max_read_iops > 0
    assert device.unverified == {"active_watts", "idle_watts", "usd_per_gb"}
    config = tmp_path / "h.toml"
    config.write_text('[[tiers]]\nkind = "cache"\ncapacity_bytes = 1048576\n'
                      '[[tiers]]\nkind = "mmap"\ndevice = "disk.toml"\n')
    assert load_toml(config).tiers[1].device == device
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".sdm-calibrate")]  # cleaned up


def test_calibrate_measures_each_depth_and_its_cpu(tmp_path):
    """Every depth asked is measured through the GIL-free loop: reads finished, a latency no
    shorter than a microsecond, and the process's CPU per read; the file is removed."""
    cal = calibrate(tmp_path, queue_depths=(1, 4), seconds=0.05, file_bytes=64 << 20)
    assert [p["queue_depth"] for p in cal.points] == [1, 4]
    for p in cal.points:
        assert p["iops"] > 0 and p["latency_us"] >= 1.0 and p["cpu_us_per_read"] > 0
        assert p["latency_us"] * 1e-6 * p["iops"] == pytest.approx(p["queue_depth"], rel=0.5)  # Little's law
    assert not list(tmp_path.iterdir())


def test_bad_input(tmp_path):
    with pytest.raises(InvalidArgumentError, match="neither a directory nor a file"):
        calibrate(tmp_path / "missing")
    small = tmp_path / "small.bin"
    small.write_bytes(b"x" * 4096)
    with pytest.raises(InvalidArgumentError, match="at least"):
        calibrate(small)
    with pytest.raises(InvalidArgumentError, match="power of two"):
        calibrate(tmp_path, block_bytes=3000)
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n')
    with pytest.raises(ConfigError, match="one \\[device\\] table"):
        load_device(bad)

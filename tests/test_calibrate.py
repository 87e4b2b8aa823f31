"""``sdm devices calibrate``: the model fit on synthetic measurements, and a real (short)
O_DIRECT run on this machine's disk whose TOML a hierarchy names."""

from __future__ import annotations

import errno
import os
import threading

import numpy as np
import pytest

import sdm.tiers.calibrate as calibrate_module
from sdm.cli import main
from sdm.errors import ConfigError, InvalidArgumentError, StoreError
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


def _test_file(tmp_path) -> tuple[int, int]:
    """``(fd, blocks)``: a 64 MiB file opened with O_DIRECT and its 4 KiB blocks."""
    target = str(tmp_path / "test.bin")
    calibrate_module._write_file(target, 64 << 20)
    return calibrate_module._open_direct(target), (64 << 20) // 4096


def test_calibrate_counts_the_reads_it_makes(tmp_path, monkeypatch):
    """Every depth asked is measured through the GIL-free loop, and its figures are the reads
    made: IOPS x the window is about the reads counted (each thread's window runs past the
    deadline by less than one loop), with a latency and the process's CPU per read."""
    made = {}
    real = calibrate_module.pread_pages

    def counted(fd, pages, first, stride, base, page_bytes, got):
        real(fd, pages, first, stride, base, page_bytes, got)
        made[threading.get_ident()] = made.get(threading.get_ident(), 0) + pages.shape[0]

    monkeypatch.setattr(calibrate_module, "pread_pages", counted)
    fd, blocks = _test_file(tmp_path)
    try:
        for q in (1, 4):
            made.clear()
            iops, latency_us, cpu_us = calibrate_module._random_reads(fd, blocks, 4096, q, 0.1)
            assert len(made) == q  # q threads, each reading
            assert iops * 0.1 == pytest.approx(sum(made.values()), rel=0.3)
            assert latency_us > 0 and cpu_us > 0
    finally:
        os.close(fd)


def test_a_read_that_fails_again_is_a_typed_error_with_its_reason(tmp_path, monkeypatch):
    """The loop's -1 is read once more for its errno; a second failure raises StoreError
    naming it, from every depth's threads, and no thread is left waiting."""
    def failing(fd, pages, first, stride, base, page_bytes, got):
        got[:] = -1

    def eio(fd, buffers, offset):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(calibrate_module, "pread_pages", failing)
    monkeypatch.setattr(calibrate_module.os, "preadv", eio)
    fd, blocks = _test_file(tmp_path)
    before = threading.active_count()
    try:
        with pytest.raises(StoreError, match="Input/output error"):
            calibrate_module._random_reads(fd, blocks, 4096, 4, 0.05)
    finally:
        os.close(fd)
    assert threading.active_count() == before


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

"""Device specs, the device model and the Metered wrapper: formulas, block counting against a
naive reference, read amplification, energy, a fixed access sequence's modeled time, paced
waits, and the ``sdm devices`` command."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sdm
from sdm.cli import main
from sdm.tiers.clock import SimClock, paced_request, wait_until_ns
from sdm.devices import DEVICES, block_ranges, count_blocks, get_device
from sdm.errors import ConfigError, InvalidArgumentError
from sdm.tiers.manifest import TableLayout, TableSpec
from sdm.tiers.base import Tier
from sdm.tiers.metered import Metered

HEADER = 4096  # the SCM row file's header; rows start page aligned


class ArrayTier(Tier):
    """Rows in a numpy array, laid out like the SCM row file (row i at HEADER + i * width)."""

    name = "array"

    def __init__(self, rows: np.ndarray):
        self.rows = rows

    def read_rows(self, layout, ids, out):
        np.take(self.rows, ids, axis=0, out=out)

    def row_offsets(self, layout, ids):
        return HEADER + np.asarray(ids, dtype=np.int64) * layout.spec.row_bytes


def int8_table(num_rows=1000):
    spec = TableSpec("t", num_rows, 64, "int8")  # 72-byte rows
    layout = TableLayout(spec, 0, 56, generation=1)
    rows = np.random.default_rng(0).integers(0, 256, (num_rows, spec.row_bytes), dtype=np.uint8)
    return layout, rows


def read(tier, layout, ids):
    ids = np.asarray(ids, dtype=np.int64)
    out = np.empty((len(ids), layout.spec.row_bytes), dtype=np.uint8)
    tier.read_rows(layout, ids, out)
    return out


def custom(**changes):
    return dataclasses.replace(DEVICES["nand-p4500"], name="custom", **changes)


# -- specs and presets -------------------------------------------------------------------

def test_presets_cover_the_issue_and_cite_every_number():
    for name in ("nand-p4500", "nand-p3700", "optane-p4800x-4k", "optane-p4800x-512", "optane-pmem", "dram"):
        assert name in sdm.DEVICES
    assert sdm.DEVICES["optane-p4800x-512"].access_bytes == 512
    assert sdm.DEVICES["optane-p4800x-4k"].access_bytes == 4096
    assert sdm.DEVICES["nand-p4500"].access_bytes == 4096
    for device in sdm.DEVICES.values():
        assert isinstance(device, sdm.DeviceSpec)
        for field in ("access_bytes", "read_latency_us", "max_read_iops", "read_bandwidth_gbps",
                      "active_watts", "idle_watts", "capacity_gb", "usd_per_gb"):
            assert device.source(field), (device.name, field)
        with pytest.raises(dataclasses.FrozenInstanceError):
            device.read_latency_us = 1.0


@pytest.mark.parametrize("field, value", [
    ("read_latency_us", -1.0), ("read_latency_us", 0.0), ("max_read_iops", 0), ("max_read_iops", -5),
    ("read_bandwidth_gbps", 0.0), ("capacity_gb", 0), ("active_watts", -0.5), ("idle_watts", -1),
    ("usd_per_gb", -2.0), ("read_latency_us", float("nan")), ("max_read_iops", float("inf")),
    ("read_latency_us", "fast"), ("active_watts", True),
])
def test_bad_numbers_raise_config_error_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        custom(**{field: value})


@pytest.mark.parametrize("value", [0, 3, 1000, -4096, 4096.0, True])
def test_access_bytes_must_be_a_power_of_two(value):
    with pytest.raises(ConfigError, match="access_bytes"):
        custom(access_bytes=value)


def test_unknown_device_names_the_presets():
    with pytest.raises(ConfigError, match="nand-p4500"):
        get_device("floppy")
    assert isinstance(ConfigError("x"), ValueError)


# -- the model -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(DEVICES))
@pytest.mark.parametrize("qd", [1, 4, 16, 64])
def test_latency_and_iops_follow_littles_law(name, qd):
    d = DEVICES[name]
    lat_ns = max(d.read_latency_us * 1e3, qd * 1e9 / d.max_read_iops)
    assert d.latency_ns(qd) == pytest.approx(lat_ns)
    # qd reads in one wave take one latency, unless bandwidth is the tighter limit
    assert d.service_ns(qd, qd) == round(max(lat_ns, qd * d.access_bytes / d.read_bandwidth_gbps))
    assert d.iops(qd) == pytest.approx(min(qd * 1e9 / lat_ns, d.read_bandwidth_gbps * 1e9 / d.access_bytes))


def test_p4800x_at_qd16_matches_the_measured_latency_within_10_percent():
    assert DEVICES["optane-p4800x-4k"].latency_ns(16) / 1e3 == pytest.approx(25.5, rel=0.1)


def test_service_time_waves_and_bandwidth_cap():
    d = DEVICES["nand-p4500"]
    assert d.service_ns(0, 4) == 0
    assert d.service_ns(1, 4) == 85_000  # one read at QD 1 (a lone read cannot queue)
    assert d.service_ns(10, 4) == 3 * 85_000  # ceil(10 / 4) waves of max(85 us, 4 / 645K)
    slow = custom(read_bandwidth_gbps=0.001)  # 1 byte per microsecond
    assert slow.service_ns(2, 2) == 2 * 4096 * 1000


def test_energy_is_active_over_busy_and_idle_otherwise():
    d = custom(active_watts=10.0, idle_watts=2.0)
    assert d.energy_j(1e6, 10e6) == pytest.approx(10 * 1e-3 + 2 * 9e-3)
    assert d.energy_j(0, 0) == 0


# -- blocks ----------------------------------------------------------------------------------

def naive_blocks(offsets, width, block):
    return sorted({b for o in offsets for b in range(o // block, (o + width - 1) // block + 1)})


@given(st.lists(st.integers(0, 20_000), max_size=40), st.integers(1, 5000), st.sampled_from([64, 256, 512, 4096]))
def test_count_blocks_and_block_ranges_match_a_naive_reference(offsets, width, block):
    want = naive_blocks(offsets, width, block)
    assert count_blocks(np.array(offsets, dtype=np.int64), width, block) == len(want)
    assert block_ranges(np.array(offsets, dtype=np.int64), width, block).tolist() == want


def test_count_blocks_rejects_zero_sizes():
    with pytest.raises(InvalidArgumentError):
        count_blocks(np.zeros(1, dtype=np.int64), 0, 4096)


# -- Metered ------------------------------------------------------------------------------------

def test_read_amplification_of_a_72_byte_row():
    layout, rows = int8_table()
    for device, block in (("nand-p4500", 4096), ("optane-p4800x-512", 512)):
        tier = Metered(ArrayTier(rows), device)
        got = read(tier, layout, [0])  # row 0 at offset 4096: inside one block
        np.testing.assert_array_equal(got, rows[[0]])
        s = tier.stats()
        assert (s["reads"], s["bytes_read"], s["useful_bytes"]) == (1, block, 72)
        assert s["read_amplification"] == pytest.approx(block / 72)


def test_a_row_straddling_two_blocks_costs_two_reads():
    layout, rows = int8_table()
    tier = Metered(ArrayTier(rows), "optane-p4800x-512")
    read(tier, layout, [7])  # bytes 4600..4672 cross the 512 B boundary at 4608
    assert tier.stats()["reads"] == 2
    assert tier.stats()["read_amplification"] == pytest.approx(1024 / 72)


def test_rows_sharing_a_block_in_a_batch_read_it_once():
    layout, rows = int8_table()
    tier = Metered(ArrayTier(rows), "nand-p4500")
    read(tier, layout, np.arange(56))  # 56 * 72 = 4032 bytes from offset 4096: one block
    assert tier.stats()["reads"] == 1
    read(tier, layout, np.arange(57))  # row 56 ends past 8192
    assert tier.stats()["reads"] == 3


def test_modeled_time_of_a_fixed_access_sequence_is_deterministic():
    layout, rows = int8_table()
    sequence = [[0], np.arange(57), [3, 500, 900], np.arange(0, 1000, 57)]

    def replay(qd):
        clock = SimClock()
        tier = Metered(ArrayTier(rows), "nand-p4500", clock, queue_depth=qd)
        for ids in sequence:
            read(tier, layout, ids)
        return clock.now_ns(), tier.stats()

    # blocks per batch: 1, 2 (row 56 ends past 8192), 3, and the last as the naive reference counts
    blocks = [1, 2, 3, len(naive_blocks((HEADER + np.arange(0, 1000, 57) * 72).tolist(), 72, 4096))]
    now, s = replay(1)
    assert now == sum(blocks) * 85_000 == s["modeled_ns"]
    assert s["reads"] == sum(blocks)
    now4, _ = replay(4)
    assert now4 == sum(-(-b // 4) for b in blocks) * 85_000
    assert replay(1)[0] == now and replay(4)[0] == now4


def test_energy_counts_idle_time_on_the_shared_clock():
    layout, rows = int8_table()
    device = custom(active_watts=10.0, idle_watts=2.0)
    clock = SimClock()
    tier = Metered(ArrayTier(rows), device, clock)
    read(tier, layout, [0])  # 85 us busy
    clock.advance_ns(915_000)  # another tier's time, or the model's think time
    assert tier.stats()["energy_j"] == pytest.approx(10 * 85e-6 + 2 * 915e-6)


def test_paced_mode_waits_for_the_modeled_completion():
    layout, rows = int8_table()
    read(Metered(ArrayTier(rows), "nand-p4500", io_mode="paced"), layout, [0])  # kernels loaded
    tier = Metered(ArrayTier(rows), "nand-p4500", io_mode="paced")
    start = time.perf_counter_ns()
    read(tier, layout, [0, 100, 200])  # three blocks at QD 1: 255 us
    wall = time.perf_counter_ns() - start
    assert 255_000 <= wall < 255_000 + 20_000_000
    assert tier.stats()["wall_ns"] >= 255_000


def test_a_paced_request_waits_once_at_its_end():
    """Inside paced_request the reads return at once; each next read issues at the previous
    one's completion (as if it had waited), and the block's end waits for the last."""
    layout, rows = int8_table()
    tier = Metered(ArrayTier(rows), custom(read_latency_us=100_000.0, max_read_iops=1000.0),
                   io_mode="paced")
    start = time.perf_counter_ns()
    with paced_request() as request:
        read(tier, layout, [0])
        read(tier, layout, [100])
        returned = time.perf_counter_ns()
        deadline = request.deadline_ns
    end = time.perf_counter_ns()
    assert returned - start < 100_000_000  # neither read waited
    assert deadline - start >= 200_000_000  # the second issued at the first's completion
    assert end >= deadline


def test_a_paced_request_that_raises_does_not_wait():
    layout, rows = int8_table()
    tier = Metered(ArrayTier(rows), custom(read_latency_us=5_000_000.0, max_read_iops=1000.0),
                   io_mode="paced")
    start = time.perf_counter_ns()
    with pytest.raises(KeyError), paced_request():
        read(tier, layout, [0])  # completes 5 s from now
        raise KeyError("boom")
    assert time.perf_counter_ns() - start < 2_000_000_000


def test_wait_until_is_close_for_short_and_long_waits():
    for wait in (30_000, 2_000_000):
        start = time.perf_counter_ns()
        reached = wait_until_ns(start + wait)
        assert reached - start >= wait


def test_metered_rejects_bad_arguments():
    layout, rows = int8_table()
    with pytest.raises(ConfigError, match="io_mode"):
        Metered(ArrayTier(rows), "dram", io_mode="turbo")
    with pytest.raises(ConfigError, match="queue_depth"):
        Metered(ArrayTier(rows), "dram", queue_depth=0)
    with pytest.raises(ConfigError, match="device"):
        Metered(ArrayTier(rows), "tape")
    with pytest.raises(InvalidArgumentError):
        SimClock().advance_ns(-1)


# -- CLI -------------------------------------------------------------------------------------------

def test_devices_command_prints_the_table_with_sources(capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    for name in DEVICES:
        assert name in out
    assert "AnandTech" in out and "Sources:" in out and "*" in out


def test_devices_command_json(capsys):
    assert main(["devices", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    by_name = {d["name"]: d for d in data}
    assert set(by_name) == set(DEVICES)
    p = by_name["optane-p4800x-4k"]
    assert p["sources"]["read_latency_us"] and "capacity_gb" in p["unverified"]
    assert p["modeled"]["qd16"]["latency_us"] == pytest.approx(16 / 585_000 * 1e6)
    assert math.isclose(p["modeled"]["qd1"]["latency_us"], 8.9)

"""SCM devices per host: the fleet tries the counts from what holding the rows needs up to the
host's slots, the host model runs each (one profile, its blocks striped over each count), and
the count of least fleet power is kept. Striping a profile again equals building it for that
count; the choice is a minimum over counts that depend on capacity only; a device-bound host
gets more devices and a higher QPS at no more power."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdm.errors import ConfigError
from sdm.host.profile import build_profile, segment_block_ids
from sdm.host.spec import HostSpec, ScmSlot
from sdm.host.variants import vary_profile, with_scm_devices
from sdm.replay.requests import key_stream
from sdm.replay.sweep import segment_blocks
from sdm.report import Measurer, ResultCache, build_report, evaluate, load_scenario, scenario_from_dict
from sdm.report.fleet import choose_scm_devices, config_fleet, scm_device_counts
from sdm.tiers.rowfile import HEADER_BYTES
from sdm.trace.format import load

from test_report_measure import TINY, write_scenario

# -- striping a profile over another count of devices ----------------------------------------

_PROFILE_ARRAYS = ("batch_ptr", "batch_qd", "sub_ptr", "sub_dev", "sub_reads", "scm_block_ptr", "scm_block_ids")


def _host(count, device="nand-p4500"):
    return HostSpec("h", cores=4, dram_cache_fraction=0.1, scm=(ScmSlot(device, count),))


@pytest.fixture(scope="module")
def profiles():
    """The tiny trace profiled on hosts of 1 and of 3 Nand devices."""
    return {k: build_profile(TINY, "sdm-nand", _host(k), request_size=8, dim=8) for k in (1, 3)}


@pytest.mark.parametrize("count", [2, 3, 4, 8])
def test_striping_again_equals_a_profile_built_for_that_count(profiles, count):
    built = profiles[3] if count == 3 else build_profile(TINY, "sdm-nand", _host(count), request_size=8, dim=8)
    for start in (profiles[1], profiles[3]):
        got = with_scm_devices(start, count)
        for name in _PROFILE_ARRAYS:
            assert np.array_equal(getattr(got, name), getattr(built, name)), name
        assert got.devices == built.devices and got.host.scm == built.host.scm
        # what the trace and the cache decide, and what the cores cost, are left as they were
        assert np.array_equal(got.hits, start.hits) and np.array_equal(got.cpu_emb_ns, start.cpu_emb_ns)
        assert got.reads_per_request()[1:].sum() == pytest.approx(start.reads_per_request()[1:].sum())
    assert with_scm_devices(profiles[3], 3) is profiles[3]


def test_more_devices_share_the_reads_and_raise_the_host_s_device_throughput(profiles):
    from sdm.host.simulate import HostSimulation

    one, four = profiles[1], with_scm_devices(profiles[1], 4)
    assert len(four.devices) == 1 + 4 and [d.name for d in four.devices[1:]] == [f"nand-p4500#{i}" for i in range(4)]
    per_device = four.reads_per_request()[1:]
    assert per_device.max() < one.reads_per_request()[1]  # each of 4 serves a share of the one's reads
    # the SCM tier's saturation rate (its busiest device) rises with the devices
    demand = [HostSimulation(p, arrivals=200).demand_ns()["mmap tier"] for p in (one, four)]
    assert demand[1] < 0.5 * demand[0]
    # the sensitivity's device variants keep the count
    slow = vary_profile(four, "nand-p4500", scm_latency=2.0)
    assert len(slow.devices) == 5 and slow.devices[1].latency_ns == pytest.approx(2 * four.devices[1].latency_ns)


def test_a_read_s_cpu_follows_the_devices_and_the_core_speed(profiles):
    # direct IO's CPU per read stays with the SCM devices however they are striped or slowed,
    # and scales with the cores' speed as the requests' CPU does
    direct = dataclasses.replace(profiles[1], devices=[profiles[1].devices[0],
                                                       dataclasses.replace(profiles[1].devices[1], read_cpu_ns=900.0)])
    three = with_scm_devices(direct, 3)
    assert [d.read_cpu_ns for d in three.devices] == [0.0, 900.0, 900.0, 900.0]
    assert three.cpu_ns_per_request() == pytest.approx(direct.cpu_ns_per_request())
    slow = vary_profile(three, "nand-p4500", scm_latency=2.0)
    assert [d.read_cpu_ns for d in slow.devices] == [0.0, 900.0, 900.0, 900.0]
    fast = vary_profile(three, "nand-p4500", core_speed=2.0)
    assert [d.read_cpu_ns for d in fast.devices] == [0.0, 450.0, 450.0, 450.0]
    assert fast.cpu_ns_per_request() == pytest.approx(direct.cpu_ns_per_request() / 2)


def test_striping_bad_counts_and_profiles_are_config_errors(profiles):
    for bad in (0, -1, 1025, 2.5, "4"):
        with pytest.raises(ConfigError, match="SCM devices per host"):
            with_scm_devices(profiles[1], bad)
    dram = build_profile(TINY, "dram", HostSpec("h", cores=4), request_size=8, dim=8)
    with pytest.raises(ConfigError, match="has no SCM tier"):
        with_scm_devices(dram, 2)
    with pytest.raises(ConfigError, match="keeps no SCM block numbers"):
        with_scm_devices(dataclasses.replace(profiles[1], scm_block_ptr=None), 2)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), miss=st.floats(0.0, 1.0), row_bytes=st.sampled_from([8, 40, 72, 300, 5000]),
       block=st.sampled_from([64, 256, 512, 4096]), stripes=st.integers(1, 9))
def test_block_numbers_count_as_the_striping_kernel(seed, miss, row_bytes, block, stripes):
    """The block numbers a profile keeps, counted by ``block % stripes``, are exactly what the
    store's striping kernel (``segment_blocks``) counts, for any hits, row and block size."""
    with load(TINY) as tr:
        stream = key_stream(tr, 8)
    mask = np.random.default_rng(seed).random(stream.keys.shape[0]) >= miss
    ptr, ids = segment_block_ids(stream, mask, row_bytes, block)
    nseg = stream.segments.shape[0] - 1
    want = np.empty((nseg, stripes), dtype=np.int64)
    segment_blocks(stream.keys, mask, stream.segments, np.int64(row_bytes), np.int64(HEADER_BYTES),
                   np.int64(block), want)
    got = np.zeros((nseg, stripes), dtype=np.int64)
    seg = np.repeat(np.arange(nseg), np.diff(ptr))
    np.add.at(got, (seg, ids % stripes), 1)
    assert np.array_equal(got, want)
    for s in range(nseg):  # distinct and ascending within a segment
        assert np.all(np.diff(ids[ptr[s]:ptr[s + 1]]) > 0)


# -- the choice, with the host model replaced by a function of the count ---------------------

# 1000 GB of tables; a host of 4 x 64 GB DIMMs: rows fit 2 hosts per replica of DRAM-only, and
# one Nand device of 4000 GB holds the rows (capacity need 1 of 8 slots).
CHOICE = {
    "name": "choice",
    "model": {"tables_gb": 1000.0},
    "traffic": {"target_qps": 200000.0, "sla_p99_us": 30000.0},
    "host": {"base_watts": 300.0, "base_usd": 5000.0, "dram_slots": 16, "gb_per_dimm": 64.0,
             "min_dimms": 4, "dram_reserved_gb": 32.0, "dram_w_per_gb": 0.25,
             "dram_usd_per_gb": 3.0, "ssd_slots": 8},
    "devices": {"nand-p4500": {"watts": 12.0, "usd": 600.0, "capacity_gb": 4000.0}},
    "cost": {"usd_per_kwh": 0.1, "years": 3.0},
    "configs": [
        {"name": "dram", "qps_per_host": 20000.0},
        {"name": "nand", "device": "nand-p4500", "dram_fraction": 0.1, "qps_ratio": 1.0},
    ],
}


def _scenario(**host):
    data = copy.deepcopy(CHOICE)
    data["host"].update(host)
    return scenario_from_dict(data)


def _spec(s):
    return dataclasses.replace(s.configs[1], qps_ratio=None, qps_source="host-model")


def _measure(c, per_device, cores_qps):
    """A host whose rate is ``per_device`` requests/s per device up to ``cores_qps``."""
    def measure(d):
        q = min(d * per_device, cores_qps)
        return dataclasses.replace(c, qps_per_host=q, hit_rate=0.8,
                                   bottleneck="mmap tier" if d * per_device < cores_qps else "cores")
    return measure


def test_counts_tried_double_from_the_capacity_need_to_the_slots():
    s = _scenario()
    c = _spec(s)
    assert scm_device_counts(s, c) == (1, 2, 4, 8)
    assert scm_device_counts(_scenario(ssd_slots=6), c) == (1, 2, 4, 6)
    assert scm_device_counts(_scenario(ssd_slots=1), c) == (1,)
    small = dataclasses.replace(s, devices=tuple(dataclasses.replace(d, capacity_gb=350.0) for d in s.devices))
    assert scm_device_counts(small, c) == (3, 6, 8)  # 1000 GB on 350 GB devices: 3 at least
    assert scm_device_counts(s, s.configs[0]) == ()  # the baseline has none to choose
    assert scm_device_counts(_scenario(ssd_slots=0), c) == ()  # no slots: it cannot serve


def test_a_device_bound_host_gets_devices_until_the_cores_bound_it():
    s = _scenario()
    c = _spec(s)
    got = choose_scm_devices(s, c, _measure(c, 2000.0, 7000.0))
    choice = got.scm_devices_choice
    assert got.scm_devices == choice["chosen"] == 4 and got.qps_per_host == 7000.0
    assert [t["devices"] for t in choice["candidates"]] == [1, 2, 4, 8]
    assert choice["reason"].startswith("4 x nand-p4500: more devices stop raising QPS (x1.00 at 8), bottleneck cores")
    at_need = config_fleet(s, dataclasses.replace(_measure(c, 2000.0, 7000.0)(1), scm_devices=1))
    chosen = config_fleet(s, got)
    assert chosen.scm_devices_per_host == 4 and chosen.power_watts < at_need.power_watts
    assert chosen.scm_devices_choice == choice
    # a host whose devices bound it at every count fills every slot
    full = choose_scm_devices(s, c, _measure(c, 2000.0, 1e9))
    assert full.scm_devices == 8 and "every slot filled, and the SCM devices still bound the host" in \
        full.scm_devices_choice["reason"]
    # one whose cores bound it already at the capacity need keeps it
    cores = choose_scm_devices(s, c, _measure(c, 2000.0, 1500.0))
    assert cores.scm_devices == 1 and "more devices stop raising QPS" in cores.scm_devices_choice["reason"]


def test_a_count_outside_the_need_and_the_slots_is_a_config_error():
    s = _scenario()
    c = dataclasses.replace(_measure(_spec(s), 2000.0, 7000.0)(9), scm_devices=9)
    with pytest.raises(ConfigError, match=r"9 SCM devices per host is outside \[1, 8\]"):
        config_fleet(s, c)


@settings(max_examples=200, deadline=None)
@given(per_device=st.floats(50.0, 50000.0), cores=st.floats(100.0, 200000.0), device_watts=st.floats(0.0, 200.0),
       slots=st.integers(1, 24), capacity=st.floats(100.0, 5000.0), worse=st.lists(st.floats(0.2, 1.0), min_size=24,
                                                                                   max_size=24))
def test_the_chosen_count_is_the_least_power_and_never_helped_by_a_worse_host(per_device, cores, device_watts,
                                                                              slots, capacity, worse):
    data = copy.deepcopy(CHOICE)
    data["host"]["ssd_slots"] = slots
    data["devices"]["nand-p4500"].update(watts=device_watts, capacity_gb=capacity)
    s = scenario_from_dict(data)
    c = _spec(s)
    counts = scm_device_counts(s, c)
    if not counts:
        return
    measure = _measure(c, per_device, cores)
    got = choose_scm_devices(s, c, measure)
    need = counts[0]
    assert need <= got.scm_devices <= max(need, slots) and got.scm_devices in counts
    power = {d: config_fleet(s, dataclasses.replace(measure(d), scm_devices=d)).power_watts for d in counts}
    best = config_fleet(s, got).power_watts
    assert best == min(power.values()) and best <= power[need]
    # A host that is no faster at any count (a smaller cache, a slower device) never gets a
    # fleet of less power: the counts tried are the same, each one's power no lower.
    def slower(d):
        m = measure(d)
        return dataclasses.replace(m, qps_per_host=m.qps_per_host * worse[d % len(worse)])
    assert config_fleet(s, choose_scm_devices(s, c, slower)).power_watts >= best


# -- through the host model --------------------------------------------------------------------


def test_a_device_bound_scenario_gets_more_devices_and_more_qps_at_no_more_power(tmp_path):
    """The tiny scenario on a 64-core host: one Nand device bounds it; the report gives its
    hosts more (of 4 slots), a higher per-host QPS, and no more fleet power than one device."""
    s = load_scenario(write_scenario(tmp_path, sla=3000.0, cores=64))
    with Measurer(ResultCache(tmp_path / "cache")) as m:
        resolved, runs = m.resolve(s)
        nand = next(c for c in resolved.configs if c.name == "sdm-nand")
        one = m.run(s, s.configs[1], scm_devices=1)
        assert one.bottleneck == "mmap tier"
        choice = nand.scm_devices_choice
        assert [t["devices"] for t in choice["candidates"]] == [1, 2, 4]
        assert 1 < nand.scm_devices <= 4 and runs["sdm-nand"].scm_devices == nand.scm_devices
        assert runs["sdm-nand"].qps_at_sla > one.qps_at_sla
        qps = [t["qps_per_host"] for t in choice["candidates"]]
        assert qps == sorted(qps)  # more devices never serve less
        got = evaluate(resolved).config("sdm-nand")
        at_one = config_fleet(resolved, dataclasses.replace(nand, qps_per_host=one.qps_at_sla, scm_devices=1))
        assert got.power_watts <= at_one.power_watts and got.scm_devices_per_host == nand.scm_devices
        # The sensitivity keeps the count: a pinned resolve runs that count only.
        pinned, pruns = m.resolve(s, {"device_latency": 1.2}, scm_devices={"sdm-nand": nand.scm_devices})
        assert pruns["sdm-nand"].scm_devices == nand.scm_devices
        assert "kept from the choice at the nominal inputs" in pinned.configs[1].scm_devices_choice["reason"]


def test_the_report_states_the_chosen_count_and_why(tmp_path):
    rep = build_report([write_scenario(tmp_path, sla=3000.0, cores=64)], cache=ResultCache(tmp_path / "c"),
                       progress=False)
    sc = rep["scenarios"][0]
    nand = next(c for c in sc["configs"] if c["name"] == "sdm-nand")
    assert nand["scm_devices_per_host"] == nand["scm_devices_choice"]["chosen"] > 1
    assert sc["host_runs"]["sdm-nand"]["scm_devices"] == nand["scm_devices_per_host"]
    text = sc["explain"][0]["scm_devices_text"]
    assert text.startswith(f"{nand['scm_devices_per_host']} x nand-p4500: ")
    json.dumps(rep, allow_nan=False)
    from sdm.report import render

    page = render.html_page(rep, {})
    assert "SCM devices per host: the counts tried" in page and text.split(":")[0] in page
    # the sensitivity's rows were run at the chosen count; the size curve chose per size
    curve = sc["model_size_curve"]
    assert len(curve["scm_devices_per_host"]["sdm-nand"]) == len(curve["scale"])
    assert all(1 <= d <= 4 for d in curve["scm_devices_per_host"]["sdm-nand"])


def test_an_sla_no_rate_reaches_gives_the_busiest_resource_s_saturation_rate(tmp_path):
    """A run of 2,000 requests on 64 cores drains within a 10 s SLA however fast they come:
    the bisection finds no edge, and the report takes the rate the cores saturate at."""
    from sdm.host.simulate import HostSimulation

    s = load_scenario(write_scenario(tmp_path, sla=1e7, cores=64))
    with Measurer(ResultCache(enabled=False)) as m:
        run = m.run(s, s.configs[0], scm_devices=0, curve=True)
        profile = m._profile(s, s.configs[0], 0, m._inputs(s, s.configs[0], 0))
    assert run.bottleneck == "cores" and "saturation rate of the busiest resource, cores" in run.reason
    assert run.qps_at_sla == pytest.approx(HostSimulation(profile, arrivals=2000).saturation_qps())
    assert len(run.curve) >= 5

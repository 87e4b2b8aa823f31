"""The fleet model against numbers computed by hand, and its monotonic properties."""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sdm.report import evaluate, scenario_from_dict, sensitivity
from sdm.report.fleet import paper_position, with_model_scale
from sdm.report.sensitivity import vary

# A small scenario whose every figure is worked out below.
HAND = {
    "name": "hand",
    "model": {"tables_gb": 1000.0},
    "traffic": {"target_qps": 3000.0, "sla_p99_us": 30000.0},
    "host": {"base_watts": 300.0, "base_usd": 5000.0, "dram_slots": 8, "gb_per_dimm": 64.0,
             "min_dimms": 2, "dram_reserved_gb": 32.0, "dram_w_per_gb": 0.5,
             "dram_usd_per_gb": 4.0, "ssd_slots": 4},
    "devices": {"nand-p4500": {"watts": 10.0, "usd": 400.0, "capacity_gb": 1000.0}},
    "cost": {"usd_per_kwh": 0.1, "years": 1.0},
    "configs": [
        {"name": "dram", "qps_per_host": 2000.0},
        {"name": "nand", "device": "nand-p4500", "dram_fraction": 0.1, "qps_ratio": 0.5},
        {"name": "xp", "device": "optane-p4800x-512", "dram_fraction": 0.1},
    ],
}


def test_hand_computed_hosts_watts_and_dollars():
    r = evaluate(scenario_from_dict(copy.deepcopy(HAND)))
    d, n, x = r.config("dram"), r.config("nand"), r.config("xp")
    # DRAM-only: a host offers 8 x 64 - 32 = 480 GB to rows, so 1000 GB need ceil(2.08) = 3
    # hosts per replica; 3000 QPS / 2000 per host need only 2 hosts -> capacity-bound, and
    # one replica of 3 hosts serves 6000 >= 3000 QPS: 3 hosts.
    assert (d.hosts_per_replica, d.hosts_for_qps, d.replicas, d.hosts) == (3, 2, 1, 3)
    assert d.regime == "capacity-bound"
    # Per host 1000/3 + 32 = 365.3 GB -> ceil(5.71) = 6 DIMMs = 384 GB -> 192 W; 300 + 192 = 492 W.
    assert (d.dimms_per_host, d.dram_gb_per_host) == (6, 384.0)
    assert d.watts_per_host == {"base": 300.0, "dram": 192.0, "scm": 0.0}
    assert d.power_watts == pytest.approx(3 * 492.0)                     # 1476 W
    assert d.capex_usd == pytest.approx(3 * (5000 + 384 * 4.0))          # 19,608 USD
    assert d.opex_usd == pytest.approx(1.476 * 8760 * 1 * 0.1)           # 1,292.98 USD
    assert d.cost_usd == pytest.approx(19608 + 1292.976)
    assert d.savings_vs_dram == 0.0
    # Nand: 1000 QPS per host (0.5 x 2000). DRAM cache 100 GB, SCM 1000 GB = 1 device of
    # 1000 GB: one host per replica; 3000 / 1000 -> 3 replicas = 3 hosts (QPS-bound).
    assert (n.qps_per_host, n.hosts_per_replica, n.replicas, n.hosts) == (1000.0, 1, 3, 3)
    assert n.regime == "qps-bound"
    # 100 + 32 = 132 GB -> 3 DIMMs = 192 GB -> 96 W; 1 device 10 W: 406 W per host.
    assert (n.dimms_per_host, n.scm_devices_per_host) == (3, 1)
    assert n.power_watts == pytest.approx(3 * 406.0)                     # 1218 W
    assert n.capex_usd == pytest.approx(3 * (5000 + 192 * 4.0 + 400))    # 18,504 USD
    assert n.opex_usd == pytest.approx(1.218 * 876)                      # 1,066.97 USD
    assert n.savings_vs_dram == pytest.approx(1 - 1218 / 1476)           # 17.5%
    assert n.cost_savings_vs_dram == pytest.approx(1 - (18504 + 1066.968) / (19608 + 1292.976))
    # 3DXP preset defaults: 375 GB, 9 W (active), 2.5 USD/GB -> 937.5 USD; qps_ratio 1.
    # 1000 GB over 4 slots x 375 fits one host with ceil(2.67) = 3 devices; 3000 / 2000 -> 2 hosts.
    assert (x.hosts_per_replica, x.hosts, x.scm_devices_per_host) == (1, 2, 3)
    assert x.power_watts == pytest.approx(2 * (300 + 96 + 27))           # 846 W
    assert x.capex_usd == pytest.approx(2 * (5000 + 768 + 3 * 937.5))    # 17,161 USD
    assert x.savings_vs_dram == pytest.approx(1 - 846 / 1476)            # 42.7%
    assert paper_position(x.savings_vs_dram) == "above"
    assert paper_position(n.savings_vs_dram) == "within"


def test_pue_and_years_scale_operating_cost_only():
    data = copy.deepcopy(HAND)
    data["cost"].update(pue=1.5, years=3.0)
    d = evaluate(scenario_from_dict(data)).config("dram")
    assert d.opex_usd == pytest.approx(1.476 * 8760 * 3 * 1.5 * 0.1)
    assert d.capex_usd == pytest.approx(19608)


def test_model_larger_than_a_host_of_scm_needs_more_hosts_per_replica():
    data = copy.deepcopy(HAND)
    data["model"] = {"tables_gb": 4500.0}
    r = evaluate(scenario_from_dict(data))
    # Nand: 4500 GB over 4 x 1000 GB per host -> 2 hosts per replica, 3 devices each (2250 / 1000).
    n = r.config("nand")
    assert (n.hosts_per_replica, n.scm_devices_per_host) == (2, 3)
    # DRAM-only: ceil(4500 / 480) = 10 hosts per replica, far more than the 2 QPS needs.
    assert r.config("dram").hosts == 10 and r.config("dram").regime == "capacity-bound"


def test_preset_model_bytes_and_infeasible_configs():
    data = copy.deepcopy(HAND)
    data["model"] = {"preset": "rm2", "fmt": "int8"}     # 32 x 500K rows of 64 + 8 bytes
    data["host"]["ssd_slots"] = 0
    s = scenario_from_dict(data)
    assert s.model.table_bytes == 32 * 500_000 * 72
    r = evaluate(s)
    assert not r.config("nand").feasible and r.config("nand").hosts is None
    assert "no SSD slots" in r.config("nand").infeasible
    assert r.config("nand").savings_vs_dram is None


def test_sensitivity_brackets_nominal_and_lists_every_input():
    s = scenario_from_dict(copy.deepcopy(HAND) | {"sensitivity": {"percent": 10.0}})
    sens = sensitivity(s)
    assert sens.percent == pytest.approx(10.0)
    assert {r.input for r in sens.rows} == {"cache_size", "device_latency", "device_iops", "cpu_speed",
                                             "dram_w_per_gb", "device_watts", "base_watts"}
    for name, (lo, hi) in sens.corners.items():
        assert lo <= sens.nominal[name] <= hi
    # The fleet inputs: every one moves the nand fleet's savings, and the largest is named.
    assert all(r.low != r.high for r in sens.rows if r.config == "nand" and r.input in
               ("dram_w_per_gb", "device_watts", "base_watts"))
    spreads = {r.input: abs(r.high - r.low) for r in sens.rows if r.config == "nand"}
    assert sens.largest["nand"]["input"] == max(spreads, key=spreads.get)
    # DRAM W/GB +10%: the DRAM-only fleet's 3 x 384 GB against the nand fleet's 3 x 192 GB.
    row = next(r for r in sens.rows if r.config == "nand" and r.input == "dram_w_per_gb")
    assert row.high == pytest.approx(1 - 3 * (300 + 192 * .55 + 10) / (3 * (300 + 384 * .55)))


def test_typed_qps_do_not_move_with_the_host_model_inputs():
    """No formula beside the host model: with every QPS typed (overrides), the host-model inputs
    (cache size, SCM latency and IOPS, CPU speed) leave the per-host QPS and hit rate alone; the
    cache size still sets the DRAM a fleet holds only for measured configurations."""
    data = copy.deepcopy(HAND)
    data["configs"][1]["hit_rate"] = 0.8
    s = scenario_from_dict(data)
    sens = sensitivity(s)
    for r in sens.rows:
        if r.input in ("cache_size", "device_latency", "device_iops", "cpu_speed"):
            assert r.low == r.high == sens.nominal[r.config], r
            assert r.qps_low == r.qps_high
    assert vary(s, {"cache_size": 0.5}).configs == s.configs  # typed: the cache is the file's
    # The fleet reads the hit rate it reports (the one the QPS was measured at).
    r = evaluate(s).config("nand")
    assert (r.hit_rate, r.qps_source, r.bound) == (0.8, "override", "qps")
    assert evaluate(s).config("dram").bound == "capacity"


# -- properties ------------------------------------------------------------------------------

_pos = st.floats(min_value=0.01, max_value=1e4, allow_nan=False, allow_infinity=False)


@st.composite
def scenarios(draw):
    slots = draw(st.integers(1, 32))
    gpd = draw(st.sampled_from([8.0, 16.0, 32.0, 64.0, 128.0]))
    reserved = draw(st.floats(0, 0.9)) * slots * gpd
    return {
        "name": "prop",
        "model": {"tables_gb": draw(st.floats(1.0, 2e4))},
        "traffic": {"target_qps": draw(st.floats(1.0, 1e6)), "sla_p99_us": 30000.0},
        "host": {"base_watts": draw(st.floats(0.0, 2000.0)), "base_usd": draw(st.floats(0.0, 5e4)),
                 "dram_slots": slots, "gb_per_dimm": gpd, "min_dimms": draw(st.integers(0, slots)),
                 "dram_reserved_gb": reserved, "dram_w_per_gb": draw(st.floats(0.0, 1.0)),
                 "dram_usd_per_gb": draw(st.floats(0.0, 10.0)), "ssd_slots": draw(st.integers(1, 16))},
        "devices": {"nand-p4500": {"watts": draw(st.floats(0.0, 30.0)),
                                   "capacity_gb": draw(st.floats(100.0, 8000.0))}},
        "cost": {"usd_per_kwh": draw(st.floats(0.0, 0.5)), "years": draw(st.floats(0.0, 6.0))},
        "configs": [
            {"name": "dram", "qps_per_host": draw(_pos)},
            {"name": "nand", "device": "nand-p4500", "dram_fraction": draw(st.floats(0.001, 1.0)),
             "qps_ratio": draw(st.floats(0.05, 1.0))},
        ],
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.floats(1.0, 5.0))
def test_more_dram_watts_per_gb_never_lowers_scm_savings(data, factor):
    s = scenario_from_dict(data)
    r = evaluate(s)
    d, n = r.config("dram"), r.config("nand")
    # The physical domain: an SCM host carries no more DRAM than a DRAM-only host (the cache
    # is a share of the rows). There the SCM fleet's DRAM per non-DRAM watt is the smaller,
    # so dearer DRAM can only widen the gap. (Outside it, e.g. a cache of 90% of a model
    # sharded over fewer hosts, it can narrow.)
    assume(n.dram_gb_per_host <= d.dram_gb_per_host and d.power_watts > 0)
    more = evaluate(vary(s, {"dram_w_per_gb": factor})).config("nand")
    assert more.savings_vs_dram >= n.savings_vs_dram - 1e-9
    # And the watts saved (not just the share) never shrink when the SCM fleet holds no more DRAM.
    if n.hosts * n.dram_gb_per_host <= d.hosts * d.dram_gb_per_host:
        dd = evaluate(vary(s, {"dram_w_per_gb": factor})).config("dram")
        assert dd.power_watts - more.power_watts >= d.power_watts - n.power_watts - 1e-6


@settings(max_examples=150, deadline=None)
@given(scenarios(), st.floats(1.0, 50.0))
def test_a_qps_target_needing_more_hosts_never_lowers_power(data, factor):
    s = scenario_from_dict(data)
    low = evaluate(s)
    data = copy.deepcopy(data)
    data["traffic"]["target_qps"] *= factor
    high = evaluate(scenario_from_dict(data))
    for a, b in zip(low.configs, high.configs):
        assert b.hosts >= a.hosts
        assert b.power_watts >= a.power_watts
        assert b.cost_usd >= a.cost_usd - 1e-6
        if b.hosts > a.hosts:
            assert b.power_watts > a.power_watts or b.watts_per_host == {"base": 0.0, "dram": 0.0, "scm": 0.0} \
                or sum(b.watts_per_host.values()) == 0


@settings(max_examples=100, deadline=None)
@given(scenarios(), st.floats(1.0, 20.0))
def test_a_larger_model_never_needs_fewer_hosts_per_replica(data, factor):
    s = scenario_from_dict(data)
    a, b = evaluate(s), evaluate(with_model_scale(s, factor))
    for x, y in zip(a.configs, b.configs):
        assert y.hosts_per_replica >= x.hosts_per_replica
        # Whole replicas of the smallest shard count: the fleet is at least what capacity
        # and traffic each need and less than their sum. (Not monotonic in the model's size:
        # 5 hosts per replica x 2 replicas can exceed 9 x 1.)
        for r in (x, y):
            assert max(r.hosts_per_replica, r.hosts_for_qps) <= r.hosts < r.hosts_per_replica + r.hosts_for_qps
            assert math.isfinite(r.power_watts)

"""The machine's stalls and wake-ups (sdm.host.platform): their measurement, their draws
against the rates and lengths they come from, and what they add to a simulated host."""

from __future__ import annotations

import numpy as np
import pytest

from sdm.errors import ConfigError
from sdm.host.platform import GAP_NS, PlatformNoise, measure_platform
from sdm.host.simulate import HostSimulation
from sdm.host.spec import HostSpec, load_host

from test_host_sim import _profile


def test_a_short_measurement_is_a_valid_platform():
    p = measure_platform(0.05, 5)
    assert p.stall_rate_per_s >= 0 and len(p.wakeup_us) == 5
    assert all(s > GAP_NS / 1e3 for s in p.stall_us)  # only gaps longer than the threshold count
    assert all(w >= 0 for w in p.wakeup_us)  # a paced wait never returns before its deadline
    assert "measured on this machine" in p.source and 0 <= p.stolen_share < 1


@pytest.mark.parametrize("bad, match", [
    (dict(stall_rate_per_s=-1.0, stall_us=(1.0,), wakeup_us=()), "stall_rate_per_s"),
    (dict(stall_rate_per_s=10.0, stall_us=(), wakeup_us=()), "stall_us is empty"),
    (dict(stall_rate_per_s=0.0, stall_us=(), wakeup_us=(float("nan"),)), "wakeup_us"),
    (dict(stall_rate_per_s=0.0, stall_us=("1",), wakeup_us=()), "stall_us"),
])
def test_bad_platforms_are_refused(bad, match):
    with pytest.raises(ConfigError, match=match):
        PlatformNoise(**bad)


def test_stalls_are_the_measured_rate_over_running_time_and_wakeups_the_measured_values():
    p = PlatformNoise(500.0, (30.0, 50.0, 4000.0), (10.0, 2000.0))
    cpu = np.zeros((200_000, 3))
    cpu[:, 0] = 2e6  # 2 ms tasks: one stall each on average
    stall, wake = p.draw(np.random.default_rng(1), cpu, 2)
    assert stall.shape == (200_000, 3) and wake.shape == (200_000, 2)
    assert not stall[:, 1:].any()  # no task, no stall
    mean_length_ns = np.mean(p.stall_us) * 1e3
    assert stall[:, 0].mean() == pytest.approx(500.0 * 2e-3 * mean_length_ns, rel=0.02)
    assert np.mean(stall[:, 0] == 0) == pytest.approx(np.exp(-1.0), rel=0.02)  # Poisson(1) of none
    assert set(np.unique(wake)) == {10e3, 2000e3}
    assert p.stolen_share == pytest.approx(500.0 * mean_length_ns * 1e-9)


def test_a_host_that_wakes_late_adds_its_wakeups_to_each_request():
    # one request: 1 ms of CPU then one read of 100 us; every wake-up 250 us, no stalls
    base = _profile([1e6], batches=[[(1, [(0, 1)])]], devices=[(1e5, 1e5)])
    noisy = _profile([1e6], batches=[[(1, [(0, 1)])]], devices=[(1e5, 1e5)])
    noisy.host = HostSpec("test", cores=1, platform=PlatformNoise(0.0, (), (250.0,)))
    quiet = HostSimulation(base, arrivals=100, warmup=0.0).point(1.0)  # 1/s: no two overlap
    late = HostSimulation(noisy, arrivals=100, warmup=0.0).point(1.0)
    assert quiet.latency_us["p50"] == pytest.approx(1100.0)
    assert late.latency_us["p50"] == pytest.approx(1100.0 + 2 * 250.0)  # at its start and after its read


def test_stalls_are_drawn_per_seed_and_every_rate_sees_the_same_ones():
    p = _profile([1e6] * 4, cores=2)
    p.host = HostSpec("test", cores=2, platform=PlatformNoise(800.0, (20.0, 900.0, 5000.0), (30.0, 800.0)))
    a, b = (HostSimulation(p, arrivals=5_000, seed=3) for _ in range(2))
    np.testing.assert_array_equal(a.stall_ns, b.stall_ns)
    assert a.point(800.0).latency_us == b.point(800.0).latency_us
    other = HostSimulation(p, arrivals=5_000, seed=4)
    assert not np.array_equal(a.stall_ns, other.stall_ns)
    low, high = a.point(100.0), a.point(1500.0)  # common random numbers: latency grows with the rate
    assert all(high.latency_us[k] >= low.latency_us[k] for k in low.latency_us)
    assert a.demand_ns()["cores"] == pytest.approx((1e6 + a.stall_ns.sum() / a.n) / 2)


def test_a_host_toml_names_its_platform(tmp_path):
    good = tmp_path / "h.toml"
    good.write_text('cores = 2\n[platform]\nstall_rate_per_s = 400.0\nstall_us = [30.0, 900.0]\n'
                    'wakeup_us = [60.0, 2000.0]\nsource = "sdm host on my VM"\n')
    h = load_host(good)
    assert h.platform == PlatformNoise(400.0, (30.0, 900.0), (60.0, 2000.0), "sdm host on my VM")
    assert h.to_json()["platform"]["wakeup_us"]["max"] == 2000.0
    bad = tmp_path / "b.toml"
    bad.write_text('cores = 2\n[platform]\nstalls = 3\n')
    with pytest.raises(ConfigError, match="platform: unknown key"):
        load_host(bad)

"""Thread workers in the host model: the load-dependent processor-sharing kernel against a
slow reference and closed-form queueing results (M/M/1, M/M/infinity, M/M/1-PS), the
closed-loop curve it rests on, and how the host simulation and ``sdm host`` use it."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_threadsim import simulate as reference_simulate
from sdm.cli import main
from sdm.errors import ConfigError, InvalidArgumentError
from sdm.host.profile import build_profile
from sdm.host.simulate import HostSimulation
from sdm.host.threads import ThreadCurve, thread_counts
from sdm.kernels.threadsim import simulate_threads
from sdm.host.workers import ClosedLoop, Work, closed_loop
from test_host_sim import _profile

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "traces" / "tiny-zipf.npz")
NONE = np.zeros(0)


def _run(arrivals, work, rate_of_k, workers, gap=NONE, factor=NONE, cpu_share=1.0, late=None, late_q=None,
         cold_rows=None):
    """The kernel; no ``late``: one quantile of zeros; ``factor`` one row or a table of them."""
    n = len(arrivals)
    latency, busy = np.empty(n), np.empty(workers + 1)
    late = np.zeros((workers + 1, 1)) if late is None else np.asarray(late, float)
    late_q = np.zeros(n, np.int64) if late_q is None else np.asarray(late_q, np.int64)
    rows = np.zeros(n, np.int64) if cold_rows is None else np.asarray(cold_rows, np.int64)
    table = np.atleast_2d(np.asarray(factor, float))
    last = simulate_threads(np.asarray(arrivals, float), np.asarray(work, float), np.asarray(rate_of_k, float),
                            np.int64(workers), gap, table, cpu_share, late, late_q, rows, latency, busy)
    return latency, busy, last


@settings(max_examples=200, deadline=None)
@given(gaps=st.lists(st.integers(0, 40), min_size=1, max_size=40),
       work=st.lists(st.integers(1, 30), min_size=1, max_size=6),
       rates=st.lists(st.integers(1, 9), min_size=4, max_size=4), workers=st.integers(1, 4),
       cold=st.booleans(), cpu_share=st.sampled_from([0.0, 0.3, 1.0]),
       late=st.one_of(st.none(), st.lists(st.integers(0, 25), min_size=15, max_size=15)),
       seed=st.integers(0, 2**16))
def test_the_kernel_matches_the_reference(gaps, work, rates, workers, cold, cpu_share, late, seed):
    arrivals = np.cumsum(np.asarray(gaps, dtype=np.float64))
    rate_of_k = np.asarray([1.0] + rates[:workers], dtype=np.float64) / 10.0
    # a cold process: a row of factors drawn per arrival, of three
    gap, factor = (np.array([0.0, 20.0]), np.array([[1.0, 1.5], [1.0, 2.0], [1.0, 3.0]])) if cold else (NONE, NONE)
    rows = np.random.default_rng([seed, 1]).integers(0, 3, len(gaps))
    # per k (rows) three quantiles of lateness; each arrival draws an index
    late_t = None if late is None else np.asarray(late, float)[: 3 * (workers + 1)].reshape(workers + 1, 3)
    if late_t is not None:
        late_t[0] = 0.0  # an idle process: the arrival's own thread is the only one
    lq = np.random.default_rng(seed).integers(0, 3, len(gaps))
    got, busy, last = _run(arrivals, work, rate_of_k, workers, gap, factor, cpu_share, late_t,
                           None if late_t is None else lq, rows)
    want = reference_simulate(arrivals, work, rate_of_k, workers, gap, factor, cpu_share, late_t, lq, rows)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-6)
    if late_t is None:  # else a latency also holds its thread's lateness, after its completion
        assert last == pytest.approx(float(np.max(arrivals + want)))
    assert last <= float(np.max(arrivals + want)) + 1e-6
    assert busy[0] == 0.0 and busy.sum() <= last + 1e-6


def _poisson(n, rate, seed=0):
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, n))


def test_one_thread_at_constant_speed_is_mm1():
    """W = 1: first come first served, exponential work: the response time is exponential
    with rate mu - lambda (its q-quantile -ln(1 - q) / (mu - lambda))."""
    n, lam, mu = 1_000_000, 0.6, 1.0
    work = np.random.default_rng(1).exponential(1.0, n)
    latency, _, _ = _run(_poisson(n, lam), work, [mu, mu], 1)
    for q in (0.5, 0.95, 0.99):
        assert np.quantile(latency[n // 100:], q) == pytest.approx(-math.log(1 - q) / (mu - lam), rel=0.02)


def test_a_rate_per_thread_is_an_infinite_server():
    """rate(k) = k mu: each request runs at mu however many share the process, so its latency is
    its own work over mu, exactly (M/M/infinity while the threads suffice)."""
    n, workers = 20_000, 64
    work = np.random.default_rng(2).exponential(1.0, n)
    rate_of_k = 0.5 * np.arange(workers + 1, dtype=float)
    latency, _, _ = _run(_poisson(n, 1.0), work, rate_of_k, workers)
    np.testing.assert_allclose(latency, work / 0.5, rtol=1e-9, atol=1e-9)  # float residue of shared steps


def test_an_infinite_server_with_late_threads():
    """rate(k) = k mu again, with a thread that runs late whenever another request holds a
    worker at its arrival: its latency is its work over mu, plus that lateness, exactly."""
    n, workers, mu, late_ns = 5_000, 64, 0.5, 0.3
    rng = np.random.default_rng(3)
    work = rng.exponential(1.0, n)
    arrivals = _poisson(n, 1.0)
    lq = rng.integers(0, 2, n)
    late = np.tile([0.0, late_ns], (workers + 1, 1))
    late[0] = 0.0
    latency, _, _ = _run(arrivals, work, 0.5 * np.arange(workers + 1, dtype=float), workers, late=late, late_q=lq)
    wake = np.zeros(n)
    ends = arrivals + work / mu  # each holds its worker from its arrival until then
    for i in range(n):
        if (ends[max(0, i - 50):i] > arrivals[i]).any():
            wake[i] = late_ns * lq[i]
    np.testing.assert_allclose(latency, wake + work / mu, rtol=1e-9, atol=1e-9)


def test_a_constant_rate_shared_is_mm1_processor_sharing():
    """rate(k) = mu, threads enough: M/M/1-PS, whose mean response time is 1 / (mu - lambda)
    whatever the work's distribution (here constant)."""
    n, lam, mu, workers = 1_000_000, 0.7, 1.0, 256
    latency, busy, _ = _run(_poisson(n, lam), [1.0], np.full(workers + 1, mu), workers)
    assert latency[n // 100:].mean() == pytest.approx(1.0 / (mu - lam), rel=0.02)
    assert busy[1:].sum() / busy.sum() == pytest.approx(1.0)


def test_a_request_that_finds_the_process_idle_runs_cold():
    """Requests far apart: each stretched by the factor at the idle gap the one before left,
    on its CPU share only."""
    arrivals = np.arange(5) * 1_000.0
    for share in (1.0, 0.25):
        latency, _, _ = _run(arrivals, [10.0], [1.0, 1.0], 1, np.array([0.0, 2_000.0]), np.array([1.0, 3.0]), share)
        want = [10.0]  # the first finds the process idle since 0, at its own arrival
        for _ in range(4):
            want.append(10.0 * (1.0 + share * 2.0 * (1_000.0 - want[-1]) / 2_000.0))
        np.testing.assert_allclose(latency, want)


def test_the_curve_interpolates_between_the_counts_measured():
    curve = ThreadCurve(np.array([1, 2, 4]), np.array([100.0, 200.0, 100.0]), np.array([1e6, 2e6, 4e6]))
    np.testing.assert_allclose(curve.rate_of_k(4)[1:] * 1e9, [100, 200, 150, 100])
    np.testing.assert_allclose(curve.cpu_of_k(3)[1:], [1e6, 2e6, 3e6])
    assert thread_counts(8) == [1, 2, 3, 4, 6, 8] and thread_counts(1) == [1]
    assert thread_counts(32) == [1, 2, 3, 4, 6, 9, 13, 19, 28, 32]


def test_the_curve_keeps_each_counts_wake_lateness():
    """A count's measured quantiles of a waking thread's lateness; between counts each
    quantile is linear in k; an idle process (row 0) has none, nor a curve without samples."""
    from sdm.host.threads import QUANTILES
    curve = ThreadCurve(np.array([1, 3]), np.array([1_000.0, 1_500.0]), np.array([1e6, 1e6]),
                        wake_late_ns=(np.array([10.0, 30.0]), np.array([50.0, 70.0])))
    late = curve.wake_late_of_k(3)
    assert late.shape == (4, QUANTILES)
    np.testing.assert_allclose(late[0], 0.0)
    np.testing.assert_allclose(late[1], np.r_[np.full(QUANTILES // 2, 10.0), np.full(QUANTILES // 2, 30.0)])
    np.testing.assert_allclose(late[2], late[1] + 40.0 / 2)
    assert curve.to_json()[1]["wake_late_us"]["p50"] == pytest.approx(0.06)
    bare = ThreadCurve(np.array([1, 3]), np.array([1_000.0, 1_500.0]), np.array([1e6, 1e6]))
    np.testing.assert_allclose(bare.wake_late_of_k(3), 0.0)
    assert "wake_late_us" not in bare.to_json()[0]


class _SleepyStore:
    """A store whose every request takes ``seconds`` of wall time asleep (the GIL released)."""

    def __init__(self, seconds, fail=False):
        self.seconds, self.fail = seconds, fail

    def embedding_bags(self, bags):
        if self.fail:
            raise OSError("device gone")
        time.sleep(self.seconds)


def test_closed_loop_counts_a_window_and_waits_for_slow_requests():
    """Two threads, 50 ms requests, a 10 ms window: the window stays open until four requests
    completed in it, so the rate is two threads' 40/s, not a count of zero."""
    works = [Work({}, None, 1)]
    qps, cpu, wake = closed_loop(_SleepyStore(0.05), None, works, 2, 0.01, settle_s=0.0)
    assert 25 < qps < 45 and 0 <= cpu < 5e6
    assert wake.size >= 10 and (wake >= 0).all()  # the probe thread woke in between, 0.5-3 ms apart
    with pytest.raises(OSError, match="device gone"):
        closed_loop(_SleepyStore(0.0, fail=True), None, works, 2, 0.01)
    with pytest.raises(InvalidArgumentError, match="threads"):
        closed_loop(_SleepyStore(0.0), None, works, 0, 0.01)


def _threaded(qps, cpu_ms=1.0):
    p = _profile([1e6, 3e6], cores=2)
    k = np.arange(1, len(qps) + 1)
    p.threads = ThreadCurve(k, np.asarray(qps, float), np.full(len(qps), cpu_ms * 1e6))
    return p


def test_the_host_simulation_over_a_thread_curve():
    p = _threaded([500.0, 800.0, 400.0])
    sim = HostSimulation(p, arrivals=20_000, workers=3, threads=True, seed=5)
    assert sim.saturation_qps() == pytest.approx(400.0)
    sla = sim.qps_at_sla(50_000.0)
    assert 0 < sla.qps < 800 and sla.bottleneck == "gil"
    again = HostSimulation(p, arrivals=20_000, workers=3, threads=True, seed=5).qps_at_sla(50_000.0)
    assert again.qps == sla.qps  # deterministic for a seed
    low = sim.point(10.0)  # one at a time: mean latency is the mean work over one thread's speed
    assert low.latency_us["p50"] == pytest.approx(1e6 / 500.0, rel=0.5)
    assert 0 < low.utilization["cores"] < low.utilization["gil"] < 0.1


def test_late_threads_weigh_on_the_tail_not_the_rate():
    """The same curve with each count's measured wake-up lateness: the mean rate X(k) is the
    same, so the saturation is, and so are requests far apart (each finds the process idle).
    Where arrivals find others in service, a third of them late by 1 ms, the tail is heavier;
    the median is not. Without the samples the simulation is the plain server."""
    p = _threaded([500.0, 800.0, 400.0])
    bare = HostSimulation(p, arrivals=20_000, workers=3, threads=True, seed=5)
    wake = tuple(np.random.default_rng(0).choice([0.0, 0.0, 1e6], 300) for _ in range(3))
    p.threads = ThreadCurve(p.threads.threads, p.threads.qps, p.threads.cpu_ns, wake_late_ns=wake)
    sim = HostSimulation(p, arrivals=20_000, workers=3, threads=True, seed=5)
    assert sim.saturation_qps() == bare.saturation_qps()
    np.testing.assert_allclose(sim.run(0.01), bare.run(0.01))
    low, low_bare = sim.point(50.0).latency_us, bare.point(50.0).latency_us
    assert low["p50"] == low_bare["p50"] and low["p99"] > 1.1 * low_bare["p99"]


def test_a_cold_core_stretches_the_profiled_cpu_not_the_process_cpu():
    """Direct mode: the curve's process CPU per request (80 ms, mostly the IO engine's readers
    in the kernel) is far above the serving thread's profiled 1 ms, which is what the cold
    factors were measured on. Alone, a request takes the curve's 100 ms, and a core idle long
    enough to be 3x slower adds 2 x 1 ms, not 2 x 80 ms."""
    p = _threaded([10.0, 10.0], cpu_ms=80.0)
    p.cpu_emb_ns = np.full(2, 1e6)
    p.cold_gap_ns, p.cold_factor = np.array([0.0, 1e9]), np.array([1.0, 3.0])
    sim = HostSimulation(p, arrivals=200, workers=2, threads=True, seed=1)
    assert sim.cpu_share == pytest.approx(0.01)
    lat = sim.run(0.001)[1:]  # about 1,000 s apart: each finds the process idle past the last gap
    np.testing.assert_allclose(lat, 102e6, rtol=1e-9)


def test_a_lone_thread_request_draws_a_rank_among_the_measured_slowdowns():
    """As in the cores-and-devices simulation: requests far apart each find the process
    idle and take the 1.5x, 2x or 3x cold call, a third of the time each (their CPU share is
    all of them here: 1 ms at 1,000/s alone), the same for a seed; the median 2x without draws."""
    p = _threaded([1000.0, 1000.0])
    p.cpu_emb_ns = np.full(2, 1e6)
    p.cold_gap_ns, p.cold_factor = np.array([0.0, 1e9]), np.array([1.0, 2.0])
    p.cold_draws = np.array([[1.0, 1.5], [1.0, 2.0], [1.0, 3.0]])
    lat = HostSimulation(p, arrivals=3000, workers=2, threads=True, seed=2).run(0.001)[1:]
    for want in (1.5e6, 2e6, 3e6):
        assert np.mean(np.isclose(lat, want)) == pytest.approx(1 / 3, abs=0.04)
    again = HostSimulation(p, arrivals=3000, workers=2, threads=True, seed=2).run(0.001)[1:]
    np.testing.assert_array_equal(lat, again)
    p.cold_draws = np.zeros((0, 0))
    np.testing.assert_allclose(HostSimulation(p, arrivals=50, workers=2, threads=True).run(0.001)[1:], 2e6)


def test_thread_workers_need_a_curve_long_enough():
    p = _threaded([500.0, 800.0])
    with pytest.raises(InvalidArgumentError, match="workers"):
        HostSimulation(p, threads=True)
    with pytest.raises(InvalidArgumentError, match="threads >= 3"):
        HostSimulation(p, workers=3, threads=True)
    with pytest.raises(InvalidArgumentError, match="no thread curve"):
        HostSimulation(_profile([1e6]), workers=1, threads=True)


def test_the_profile_measures_the_curve_on_this_machine_only(tmp_path):
    p = build_profile(TINY, "dram", "this-machine", dim=8, workdir=str(tmp_path), threads=2)
    assert p.threads is not None and p.threads.threads.tolist() == [1, 2]
    assert (p.threads.qps > 0).all() and (p.threads.cpu_ns > 0).all()
    assert p.summary()["threads"][1]["threads"] == 2
    with pytest.raises(ConfigError, match="this-machine"):
        build_profile(TINY, "dram", "2-socket", dim=8, workdir=str(tmp_path), threads=2)


def test_each_count_is_measured_up_then_down_and_averaged(tmp_path, monkeypatch):
    """The counts run 1, 2, 3 then 3, 2, 1; a count's rate is its runs' mean and its CPU per
    request the runs' mean weighted by their requests."""
    import sdm.host.threads as threads_module
    from sdm.store.build import build_store
    from sdm.trace.format import load

    calls = []
    scripted = iter([(100.0, 1e6), (200.0, 2e6), (300.0, 3e6),   # up: 1, 2, 3 threads
                     (100.0, 4e6), (600.0, 2e6), (300.0, 1e6)])  # down: 3, 2, 1 threads

    def fake_closed_loop(store, net, works, k, seconds):
        calls.append(k)
        qps, cpu = next(scripted)
        return ClosedLoop(qps, cpu, np.full(2, float(len(calls))))

    monkeypatch.setattr(threads_module, "closed_loop", fake_closed_loop)
    monkeypatch.setattr(threads_module, "WARM_REQUESTS", 1)
    tr = load(TINY)
    path = build_store(str(tmp_path / "s"), tr.table_sizes, dim=8, progress=False)
    curve = threads_module.measure_threads(path, "dram", tr, None, 3)
    assert calls == [1, 2, 3, 3, 2, 1]
    np.testing.assert_allclose(curve.qps, [200.0, 400.0, 200.0])
    np.testing.assert_allclose(curve.cpu_ns, [(100 * 1e6 + 300 * 1e6) / 400, (200 * 2e6 + 600 * 2e6) / 800,
                                              (300 * 3e6 + 100 * 4e6) / 400])
    assert [w.tolist() for w in curve.wake_late_ns] == [[1, 1, 6, 6], [2, 2, 5, 5], [3, 3, 4, 4]]  # both runs'


@pytest.mark.parametrize("cpu_slots", [None, 0, 1])
def test_the_curve_is_measured_under_the_cpu_slots_asked(tmp_path, monkeypatch, cpu_slots):
    import sdm.host.threads as threads_module
    from sdm.store.build import build_store
    from sdm.tiers.slots import default_cpu_slots
    from sdm.trace.format import load

    seen = []

    def fake_closed_loop(store, net, works, k, seconds):
        seen.append(store.cpu_slots)
        return ClosedLoop(100.0, 1e6, np.zeros(0))

    monkeypatch.setattr(threads_module, "closed_loop", fake_closed_loop)
    tr = load(TINY)
    path = build_store(str(tmp_path / "s"), tr.table_sizes, dim=8, progress=False)
    curve = threads_module.measure_threads(path, "dram", tr, None, 2, cpu_slots=cpu_slots)
    want = default_cpu_slots() if cpu_slots is None else cpu_slots
    assert seen == [want] * 4 and curve.cpu_slots == want


def test_sdm_host_thread_and_process_workers(capsys):
    assert main(["host", TINY, "--config", "dram", "--rate", "50", "--workers", "2", "--arrivals", "2000",
                 "--dim", "8", "--cpu-slots", "1", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["worker_kind"] == "threads" and [t["threads"] for t in data["profile"]["threads"]] == [1, 2]
    assert data["profile"]["cpu_slots"] == 1
    for bad in (["--workers", "2", "--processes"], []):  # slots bound one process's threads only
        assert main(["host", TINY, *bad, "--cpu-slots", "1", "--dim", "8", "--arrivals", "100"]) == 2
        assert "--cpu-slots" in capsys.readouterr().err
    assert main(["host", TINY, "--workers", "2", "--cpu-slots", "-1", "--dim", "8", "--arrivals", "100"]) == 2
    assert "cpu_slots" in capsys.readouterr().err
    assert set(data["curve"][0]["utilization"]) == {"cores", "workers", "gil"}
    assert main(["host", TINY, "--processes", "--dim", "8", "--arrivals", "100"]) == 2
    assert "--workers" in capsys.readouterr().err

"""``sdm load``: the open-loop load generator (contract, determinism, latency from schedule)."""

from __future__ import annotations

import gc
import json

import pytest

from sdm.cli import main
from sdm.errors import InvalidArgumentError
from sdm.load import load_test

TINY = "traces/tiny-zipf.npz"


def test_cli_contract_paced(tmp_path, capsys):
    out = tmp_path / "load.json"
    assert main(["load", TINY, "--config", "sdm-nand", "--rate", "20", "80", "--workers", "2",
                 "--duration", "0.5", "--io-mode", "paced", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [p["offered_qps"] for p in data["points"]] == [20.0, 80.0]
    for p in data["points"]:
        assert set(p) >= {"offered_qps", "achieved_qps", "latency_us", "requests"}
        lat = p["latency_us"]
        assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["p999"]
        assert p["requests"] > 0 and p["achieved_qps"] > 0
        assert 0 <= p["dram_hit_rate"] <= 1 and p["cpu_utilization"] > 0
    assert data["io_mode"] == "paced" and data["cpu"]
    assert "| offered QPS |" in capsys.readouterr().out  # the table still goes to stdout
    assert gc.get_freeze_count() == 0  # the heap frozen while serving is handed back


def test_process_workers_serve_every_request_from_warm_caches():
    """Two worker processes over one store, each with its own DRAM cache: each warms its cache
    on the trace before the first rate, as the parent does, so the tiny trace (which fits the
    cache) hits on every lookup, and the hit rate is counted over the workers' caches."""
    r = load_test(TINY, "sdm-nand", rates=[40], duration_s=1.0, workers=2, processes=True, io_mode="paced")
    p = r.points[0]
    assert r.processes and p.requests >= 30 and p.achieved_qps > 0
    assert 0 < p.latency_us["p50"] <= p.latency_us["p99"]
    assert p.dram_hit_rate == 1.0
    assert p.cpu_us_per_request > 0 and 0 < p.cpu_utilization <= 1


def test_modeled_is_deterministic_for_a_schedule():
    a = load_test(TINY, "sdm-nand", rates=[400], duration_s=0.5, io_mode="modeled", seed=3)
    b = load_test(TINY, "sdm-nand", rates=[400], duration_s=0.5, io_mode="modeled", seed=3)
    assert a.points[0].latency_us == b.points[0].latency_us
    assert a.points[0].requests == b.points[0].requests


def test_modeled_latency_rises_with_load_on_a_saturated_device():
    """A cache of one row: every lookup reads Nand, so load queues on the shared device: a
    little at 3000/s (its units 60% busy), without bound at 6000/s (offered past them)."""
    from sdm.store.config import with_options

    config = with_options("sdm-nand", cache_bytes=512)
    r = load_test(TINY, config, rates=[50, 3000, 6000], duration_s=1.0, io_mode="modeled")
    low, mid, high = (p.latency_us["p99"] for p in r.points)
    busy = [p.devices["nand-p4500"]["utilization"] for p in r.points]
    assert busy[0] < 0.05 and 0.3 < busy[1] < 0.9 and busy[2] > 0.95
    assert low < mid < 5 * low < 10 * low < high


def test_latency_counts_from_the_schedule_not_from_pickup():
    """One worker and more offered load than it can serve: requests wait for the worker, and
    that wait is latency (no coordinated omission): p99 far above a request's service time.

    The flood offers 3,000 requests at 10^6/s, far past what one worker serves on any machine (a
    Python request costs tens of microseconds at least); 20,000/s had been only twice what one
    worker served on a fast machine."""
    calm = load_test(TINY, "sdm-nand", rates=[5], duration_s=0.4, workers=1,
                     io_mode="paced").points[0]
    flooded = load_test(TINY, "sdm-nand", rates=[1e6], duration_s=3e-3, workers=1,
                        io_mode="paced").points[0]
    assert flooded.achieved_qps < 0.5 * flooded.offered_qps
    assert flooded.latency_us["p99"] > 10 * calm.latency_us["p50"]


@pytest.mark.parametrize("kwargs, words", [
    ({"rates": [0]}, "rate"), ({"rates": [-5]}, "rate"), ({"rates": []}, "at least one rate"),
    ({"rates": [10], "workers": 0}, "workers"), ({"rates": [10], "duration_s": 0}, "duration_s"),
    ({"rates": [10], "duration_s": float("nan")}, "duration_s"),
])
def test_bad_arguments_are_typed_errors(kwargs, words):
    with pytest.raises(InvalidArgumentError, match=words):
        load_test(TINY, "sdm-nand", **kwargs)


def test_search_finds_the_qps_at_the_sla():
    """Modeled, so deterministic: the QPS found holds the SLA, twice the rate does not."""
    from sdm.store.config import with_options

    config = with_options("sdm-nand", cache_bytes=512)
    r = load_test(TINY, config, rates=[50], search=True, sla_us=5000, duration_s=0.5,
                  io_mode="modeled")
    assert r.qps_at_sla is not None and r.qps_at_sla > 0
    held = [p for p in r.points if p.latency_us["p99"] <= 5000]
    broke = [p for p in r.points if p.latency_us["p99"] > 5000]
    assert held and broke and max(p.offered_qps for p in held) < min(p.offered_qps for p in broke) * 1.01


# 20 ms: a loaded CI core still holds it at a few hundred requests/s; 100 us: below any
# request's latency, so nothing holds
@pytest.mark.parametrize("sla_us", [20_000, 100])
def test_the_search_counts_no_point_too_small_for_a_p99(sla_us):
    """The first rate is ten times what the store serves, so it misses the SLA: the search
    halves the rate, each probe long enough for 20 requests, and a point of a few requests
    (whose "achieved QPS" is one over its own span) never becomes the QPS at the SLA, which is
    never above what was offered."""
    import sdm.load.run as run
    from sdm.store.config import with_options

    config = with_options("sdm-nand", cache_bytes=512)
    r = load_test(TINY, config, rates=[50_000], search=True, sla_us=sla_us, duration_s=0.05,
                  io_mode="modeled")
    assert r.points[0].latency_us["p99"] > sla_us
    probes = r.points[1:]
    assert probes and all(p.requests >= run._MIN_SLA_REQUESTS for p in probes)
    held = [p for p in probes if p.latency_us["p99"] <= sla_us]
    assert bool(held) == (sla_us > 1000)
    assert r.qps_at_sla == (max(min(p.achieved_qps, p.offered_qps) for p in held) if held else None)
    assert r.qps_at_sla is None or r.qps_at_sla <= max(p.offered_qps for p in held)


def test_each_serving_process_runs_blas_on_its_share_of_the_cores(monkeypatch):
    from sdm.host import workers
    from sdm.host.blas import _openblas, blas_threads, blas_threads_settable

    monkeypatch.setattr(workers.os, "cpu_count", lambda: 8)
    assert [workers.blas_share(w) for w in (1, 2, 3, 8, 32)] == [8, 4, 2, 1, 1]
    if not blas_threads_settable():
        pytest.skip("numpy's BLAS thread count cannot be set here")
    _, get = _openblas()
    before = int(get())
    with blas_threads(1) as done:
        assert done and int(get()) == 1
    assert int(get()) == before

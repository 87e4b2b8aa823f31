"""The host model end to end: host specs and their errors, request profiles against the
control plane and the live store, striping, and ``predict``'s JSON contract."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from sdm.errors import ConfigError
from sdm.host import HOST_PRESETS, build_profile, predict, resolve_host
from sdm.host.profile import hit_rate_settles_after
from sdm.host.spec import load_host
from sdm.policies import simulate
from sdm.replay.requests import key_stream
from sdm.replay.sweep import request_service_ns
from sdm.store.config import with_options
from sdm.trace import load

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "traces" / "tiny-zipf.npz")


def test_presets_carry_a_source_for_every_number():
    for host in HOST_PRESETS.values():
        for name in ("cores", "core_speed", "dram_cache_fraction", "dram_bandwidth_gbps", "scm"):
            assert host.source(name), (host.name, name)
    me = resolve_host("this-machine")
    assert me.cores == os.cpu_count() and me.core_speed == 1.0 and me.source("cores")
    assert HOST_PRESETS["2-socket"].scm[0].count == 8


def test_host_toml_and_its_errors(tmp_path):
    good = tmp_path / "h.toml"
    good.write_text('cores = 12\ncore_speed = 0.5\ndram_cache_bytes = 1048576\n[[scm]]\ndevice = "nand-p3700"\n'
                    'count = 4\n[sources]\ncores = "a guess"\n')
    h = load_host(good)
    assert (h.name, h.cores, h.core_speed, h.scm[0].device.name, h.scm[0].count) == ("h", 12, 0.5, "nand-p3700", 4)
    assert resolve_host(str(good)) == h and h.source("cores") == "a guess"
    cases = {"cores = 0\n": "cores", "cores = 2\nspeed = 3\n": "unknown key", "core_speed = 1\n": "needs cores",
             "cores = 2\ndram_cache_bytes = 5\ndram_cache_fraction = 0.1\n": "not both",
             "cores = 2\n[[scm]]\ncount = 0\n": "count", "cores = 2\n[[scm]]\ndevice = \"nope\"\n": "not a preset"}
    for text, match in cases.items():
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=match):
            load_host(bad)
    with pytest.raises(ConfigError, match="neither a preset"):
        resolve_host("no-such-host")


def test_settling_finds_where_the_hit_rate_stops_moving():
    rows = np.full(100, 10)
    hits = np.concatenate((np.zeros(50), np.full(50, 9))).astype(int)
    k = hit_rate_settles_after(hits, rows)
    assert k is not None and 50 <= k <= 52
    assert hit_rate_settles_after(np.full(100, 7), rows) == 0
    rising = hit_rate_settles_after(np.linspace(0, 10, 100).astype(int), rows)  # settles only near the end
    assert rising is not None and rising > 80
    assert hit_rate_settles_after(np.zeros(100, int), np.zeros(100, int)) is None  # nothing read


SMALL_CACHE = 16384  # bytes: 512 rows of dim 8 fp32, so the tiny trace both hits and misses warm
SMALL = with_options("sdm-nand", cache_bytes=SMALL_CACHE)


@pytest.fixture(scope="module")
def nand(tmp_path_factory):
    return build_profile(TINY, SMALL, "this-machine", dim=8, workdir=str(tmp_path_factory.mktemp("h")))


def test_profile_agrees_with_the_control_plane_and_the_live_store(nand):
    with load(TINY) as tr:
        stream = key_stream(tr)
    rows = SMALL_CACHE // 32
    twice = np.concatenate((stream.keys, stream.keys))
    mask = simulate(twice, policy="lru", capacity=rows, return_mask=True).hit_mask[stream.keys.shape[0]:]
    _, blocks = request_service_ns(stream, mask, row_bytes=32, device="nand-p4500")
    scm = [i for i, d in enumerate(nand.devices) if d.group == "mmap"]
    per_request = np.zeros(nand.requests, dtype=np.int64)
    for r in range(nand.requests):
        parts = slice(nand.sub_ptr[nand.batch_ptr[r]], nand.sub_ptr[nand.batch_ptr[r + 1]])
        on_scm = np.isin(nand.sub_dev[parts], scm)
        per_request[r] = nand.sub_reads[parts][on_scm].sum()
    np.testing.assert_array_equal(per_request, blocks)
    assert blocks.sum() > 0 and 0 < mask.sum() < mask.size
    assert nand.live_hits == int(nand.hits.sum()) == int(mask.sum())
    assert nand.hit_rate == pytest.approx(mask.mean())
    assert (nand.cpu_emb_ns > 0).all() and not nand.cpu_bottom_ns.any()


def test_striping_splits_a_tiers_blocks_over_its_devices(tmp_path, nand):
    host = tmp_path / "h.toml"
    host.write_text("cores = 4\n[[scm]]\ncount = 3\n")
    p = build_profile(TINY, SMALL, str(host), dim=8, workdir=str(tmp_path))
    scm = [d for d in p.devices if d.group == "mmap"]
    assert [d.name for d in scm] == ["nand-p4500#0", "nand-p4500#1", "nand-p4500#2"]
    reads = p.reads_per_request()
    assert reads[1:].sum() == pytest.approx(nand.reads_per_request()[1:].sum())
    assert (reads[1:] > 0).all()
    assert reads[0] == nand.reads_per_request()[0]  # DRAM lines do not depend on the SCM
    assert p.cold_gap_ns.size == 0  # a host that is not this machine: its cores' warmth is unknown


def test_this_machine_measures_its_cold_cores(nand):
    gaps, factors = nand.cold_gap_ns, nand.cold_factor
    assert gaps.size == factors.size >= 2 and gaps[0] == 0.0 and factors[0] == 1.0
    assert (np.diff(gaps) > 0).all() and gaps[-1] >= 10e6  # ascending, out to tens of ms idle
    assert np.isfinite(factors).all() and (factors > 0).all()
    assert [c["idle_us"] for c in nand.summary()["cold_core"]] == pytest.approx(gaps / 1e3)
    # every cold call's slowdown is kept, ascending per gap, the median the factor
    draws = nand.cold_draws
    assert draws.shape[1] == gaps.size and draws.shape[0] >= 2
    assert (np.diff(draws, axis=0) >= 0).all() and (draws[:, 0] == 1.0).all()
    np.testing.assert_allclose(np.median(draws, axis=0), factors)
    assert np.array_equal(nand.cold_table(), draws)
    core = nand.summary()["cold_core"][-1]
    assert core["cpu_factor_q10"] <= core["cpu_factor"] <= core["cpu_factor_q90"] <= core["cpu_factor_max"]


def test_each_batch_issues_where_the_live_store_reached_it(nand):
    # SMALL misses: each request has SCM and DRAM batches, every one inside its request's CPU time
    after, ptr = nand.batch_after_ns, nand.batch_ptr
    assert after is not None and after.shape == nand.batch_qd.shape
    owner = np.repeat(np.arange(nand.requests), np.diff(ptr))
    assert (after >= 0).all() and (after <= nand.cpu_emb_ns[owner] + 1e-9).all()
    has = np.diff(ptr) > 0
    assert (after[ptr[1:][has] - 1] > 0).all()  # the last reads wait for some of the work before them
    issue = nand.summary()["reads_issue_after_us"]  # a cache charges its DRAM reads from before its probe
    assert all(0 <= issue[k] <= nand.cpu_emb_ns.max() / 1e3 for k in ("first", "last"))


def test_batches_take_the_store_charges_of_their_group_in_order():
    from sdm.host.profile import _batch_after

    # one request: SCM, DRAM, SCM, DRAM batches; the store charged one SCM read (a fused
    # batch) at 10% of the request and DRAM reads at 50% and 70%
    issues = [[("mmap", 0.1), ("cache", 0.5), ("cache", 0.7)]]
    got = _batch_after(np.array([0, 4]), np.array([True, False, True, False]), issues, np.array([1000.0]), "mmap")
    np.testing.assert_allclose(got, [100.0, 500.0, 100.0, 700.0])
    none = _batch_after(np.array([0, 1]), np.array([False]), [[]], np.array([1000.0]), None)
    np.testing.assert_allclose(none, [0.0])


def test_predict_gives_the_contract_keys(nand):
    r = predict(None, profile=nand, arrivals=5_000)
    data = json.loads(json.dumps(r.to_json()))
    assert {"qps_at_sla", "bottleneck", "utilization", "hit_rate", "curve"} <= set(data)
    assert data["qps_at_sla"] > 0 and data["bottleneck"] in data["utilization"]
    assert data["curve"] and all(set(c["latency_us"]) == {"p50", "p95", "p99", "p999"} and c["offered_qps"] > 0
                                 for c in data["curve"])
    xs = [c["offered_qps"] for c in data["curve"]]
    assert xs == sorted(xs)
    p99 = [c["latency_us"]["p99"] for c in data["curve"]]
    assert p99[-1] > p99[0]


def test_a_model_adds_its_mlps(tmp_path):
    # TINY has other tables than criteo-kaggle's: refused, or the model rebuilt over them (as replay)
    with pytest.raises(ConfigError, match="fit-model"):
        build_profile(TINY, "dram", "this-machine", model="criteo-kaggle", workdir=str(tmp_path))
    p = build_profile(TINY, "dram", "this-machine", model="criteo-kaggle", workdir=str(tmp_path), fit_model=True)
    assert p.bottom_ns_per_sample > 0 and p.top_ns_per_sample > 0
    np.testing.assert_allclose(p.cpu_bottom_ns, p.samples * p.bottom_ns_per_sample)


def test_the_cpu_time_is_measured_with_the_kernels_on_one_thread(tmp_path, monkeypatch):
    """The profile times each request on the calling thread's clock, which does not see the
    CPU time of Numba's parallel threads; so the kernels must run on that thread only, and the
    caller's thread count is given back after."""
    import numba

    from sdm.store.store import Store

    seen = []
    real = Store.embedding_bags

    def recording(self, requests, **kw):
        seen.append(numba.get_num_threads())
        return real(self, requests, **kw)

    monkeypatch.setattr(Store, "embedding_bags", recording)
    before = numba.get_num_threads()
    build_profile(TINY, "dram", "this-machine", dim=8, workdir=str(tmp_path))
    assert seen and set(seen) == {1}
    assert numba.get_num_threads() == before


def test_a_paced_store_is_timed_as_a_paced_worker_serves(tmp_path, monkeypatch):
    """Under ``paced`` a request's CPU is what a worker spends waiting for its paced reads,
    so the profile keeps the times of a pass over a paced store, and its forward runs the
    lookups beside the bottom MLP; a modeled hierarchy is timed modeled only."""
    from sdm.host import profile
    from sdm.store.config import with_io_mode

    seen = []
    real_emb, real_mlp = profile._emb_cpu, profile._mlp_cpu

    def emb(st, bags, first):
        out = real_emb(st, bags, first)
        seen.append(("emb", st.config.io_mode, out))
        return out

    def mlp(st, reqs, e, model, seed, fit_model, *, overlap):
        seen.append(("mlp", st.config.io_mode, overlap))
        return real_mlp(st, reqs, e, model, seed, fit_model, overlap=overlap)

    monkeypatch.setattr(profile, "_emb_cpu", emb)
    monkeypatch.setattr(profile, "_mlp_cpu", mlp)
    p = build_profile(TINY, with_io_mode(SMALL, "paced"), "2-socket", dim=8, workdir=str(tmp_path))
    assert [(k, m) for k, m, _ in seen] == [("emb", "modeled"), ("emb", "paced"), ("mlp", "paced")]
    assert seen[2][2] is True
    np.testing.assert_allclose(p.cpu_emb_ns, seen[1][2] / resolve_host("2-socket").core_speed)
    seen.clear()
    build_profile(TINY, SMALL, "2-socket", dim=8, workdir=str(tmp_path))
    assert [(k, m, x if k == "mlp" else None) for k, m, x in seen] == [("emb", "modeled", None),
                                                                    ("mlp", "modeled", False)]


def test_unsupported_hierarchies_and_direct_without_a_disk_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="host model covers"):
        build_profile(TINY, "three-tier", dim=8, workdir=str(tmp_path))
    from sdm.store.config import with_io_mode

    with pytest.raises(ConfigError, match="calibrate"):
        build_profile(TINY, with_io_mode("sdm-nand", "direct"), dim=8, workdir=str(tmp_path))


@pytest.mark.parametrize("submission", ["aio", "threads"])
def test_a_direct_store_is_timed_with_the_cpu_its_reads_cost(tmp_path, monkeypatch, submission):
    """Under ``direct`` a request's CPU is timed over a direct store, and the CPU its reads
    cost the threads that read them (the request's own with kernel AIO, the IO engine's
    readers otherwise) becomes its SCM device's ``read_cpu_ns``, which the cores pay per
    read, in one task per batch with AIO; the DRAM device's reads cost none."""
    from sdm.devices import get_device
    from sdm.host import profile
    from sdm.host.spec import this_machine
    from sdm.tiers.aio import aio_supported

    if submission == "aio" and not aio_supported():
        pytest.skip("no kernel AIO here")

    seen = []
    real = profile._direct_cpu

    def direct(st, bags):
        out = real(st, bags)
        seen.append((st.config.io_mode, out))
        return out

    monkeypatch.setattr(profile, "_direct_cpu", direct)
    host = this_machine(disk=get_device("nand-p4500"))
    config = with_options(SMALL, io_mode="direct", io_submission=submission)
    p = build_profile(TINY, config, host, dim=8, workdir=str(tmp_path))
    (mode, (emb, per_read, threads)), = seen
    assert mode == "direct" and per_read > 0 and threads == (submission == "aio")
    np.testing.assert_allclose(p.cpu_emb_ns, emb)
    assert (emb > 0).all()  # with AIO the reads' CPU is taken out of the thread's, not all of it
    dram, disk = p.devices
    assert dram.read_cpu_ns == 0 and disk.read_cpu_ns == pytest.approx(per_read)
    assert dram.read_threads == 0 and disk.read_threads == threads
    reads = p.reads_per_request()
    assert reads[1] > 0
    tasks = float((p.cpu_emb_ns + p.cpu_bottom_ns + p.cpu_top_ns).mean())
    assert p.cpu_ns_per_request() == pytest.approx(tasks + reads[1] * per_read)
    summary = p.summary()
    assert summary["devices"][1]["cpu_us_per_read"] == pytest.approx(per_read / 1e3)
    assert summary["cpu_us_per_request"]["device_reads"] == pytest.approx(reads[1] * per_read / 1e3)

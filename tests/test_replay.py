"""sdm replay: JSON shape, counts equal to the store's and the simulator's, request
definitions, the DLRM path, outputs and errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sdm
from sdm.cli import main
from sdm.errors import ConfigError, SdmError
from sdm.host import HostSimulation, build_profile, replay_on_host
from sdm.replay.queueing import SlaError
from sdm.replay.live import build_store, replay, table_names
from sdm.replay.render import replay_markdown
from sdm.kernels.serve import TABLE_SHIFT
from sdm.replay.requests import iter_requests, key_stream, request_bounds
from sdm.replay.sweep import DEFAULT_CACHE_QUEUE_DEPTH, request_service_ns
from sdm.trace import Batch, TraceNotFoundError, load, save

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "traces" / "tiny-zipf.npz")
INFERENCE = str(ROOT / "traces" / "inference-small.npz")

TIER_KEYS = {"name": str, "device": str, "hits": int, "misses": int, "reads": int,
             "bytes_read": int, "read_amplification": float}


def _toml(tmp_path, capacity_rows, policy="lru", device="nand-p4500", qd=16,
          cache_qd=DEFAULT_CACHE_QUEUE_DEPTH) -> str:
    path = tmp_path / f"c-{policy}-{capacity_rows}-{device}.toml"
    path.write_text(f'[[tiers]]\nkind = "cache"\ncapacity_rows = {capacity_rows}\npolicy = "{policy}"\n'
                    f'queue_depth = {cache_qd}\n'
                    f'[[tiers]]\nkind = "mmap"\ndevice = "{device}"\nqueue_depth = {qd}\n')
    return str(path)


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("replay") / "store"
    with load(TINY) as tr:
        build_store(path, tr.table_sizes, dim=8)
    return str(path)


def test_json_keys_and_types(tiny_store):
    r = replay_on_host(TINY, "sdm-nand", store=tiny_store, checksum=True, arrivals=5_000)
    data = json.loads(json.dumps(r.to_json()))
    assert isinstance(data["lookups"], int) and data["lookups"] == 4082
    assert isinstance(data["requests"], int) and data["requests"] == 8
    assert [t["name"] for t in data["tiers"]] == ["cache", "mmap"]
    for t in data["tiers"]:
        for key, typ in TIER_KEYS.items():
            assert isinstance(t[key], typ), (key, t[key])
    assert set(data["latency_us"]) == {"p50", "p95", "p99", "p999"}
    assert all(isinstance(v, float) for v in data["latency_us"].values())
    lat = data["latency_us"]
    assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["p999"]
    assert data["sla_us"] == 30_000.0
    assert isinstance(data["qps_at_sla"], float) and data["qps_at_sla"] > 0
    assert data["host"] == "this-machine" and data["sla"]["bottleneck"] == data["extra"]["host_model"]["bottleneck"]
    assert isinstance(data["cpu_us_per_request"], float) and data["cpu_us_per_request"] > 0
    assert data["tiers"][1]["utilization_at_sla"] > 0 and data["tiers"][1]["energy_j_per_request_at_sla"] > 0
    assert list(data["extra"]) == ["checksum", "host_model"] and re.fullmatch(r"[0-9a-f]{64}", data["extra"]["checksum"])


def test_counts_equal_the_stores_own(tiny_store):
    r = replay(TINY, "sdm-3dxp", store=tiny_store)
    names = table_names(2)
    with load(TINY) as tr, sdm.Store.open(tiny_store, config="sdm-3dxp") as store:
        for req in iter_requests(tr):
            store.embedding_bags({n: (ix, of) for n, ix, of in zip(names, req.indices, req.offsets)})
        stats = store.stats()
    assert r.lookups == stats["lookups"] == 4082
    assert r.requests == stats["batches"]
    for mine, theirs in zip(r.tiers, stats["tiers"]):
        for key in ("hits", "misses", "reads", "bytes_read", "useful_bytes", "modeled_ns"):
            assert mine[key] == theirs[key], key
    assert int(r.service_ns.sum()) == sum(t["modeled_ns"] for t in stats["tiers"])


@pytest.mark.parametrize("policy", ["lru", "fifo", "sieve", "s3fifo"])
@pytest.mark.parametrize("request_size", [None, 16])
def test_counts_equal_the_simulators(tmp_path, tiny_store, policy, request_size):
    cap = 150  # smaller than a request's distinct rows: evictions inside every request
    r = replay(TINY, _toml(tmp_path, cap, policy), store=tiny_store, request_size=request_size)
    with load(TINY) as tr:
        stream = key_stream(tr, request_size)
    sim = sdm.simulate(stream.keys, policy=policy, capacity=cap, return_mask=True)
    assert (r.tiers[0]["hits"], r.tiers[0]["misses"]) == (sim.hits, sim.misses)
    assert r.tiers[1]["hits"] == sim.misses
    service, blocks = request_service_ns(stream, sim.hit_mask, row_bytes=32, device="nand-p4500")
    assert r.tiers[1]["reads"] == int(blocks.sum())
    np.testing.assert_array_equal(r.service_ns, service)
    assert r.requests == stream.num_requests


def test_request_size_and_request_ids():
    with load(INFERENCE) as tr:
        b = tr[0]
        bounds = request_bounds(b)
        assert len(bounds) - 1 == len(np.unique(b.request_ids))
        assert np.all(np.diff(b.request_ids[bounds[:-1]]) != 0)
        assert list(request_bounds(b, 100)) == [0, 100, 200, 256]
        stream = key_stream(tr)
        assert stream.num_requests == 12 * 8 and stream.num_lookups == tr.num_lookups
        assert int(stream.samples.sum()) == int(tr.batch_sizes.sum())


def _naive_keys(batches, request_size):
    keys = []
    for b in batches:
        bounds = request_bounds(b, request_size)
        for r in range(len(bounds) - 1):
            for t in range(b.num_tables):
                o = b.offsets[t]
                ids = b.indices[t][o[bounds[r]]:o[bounds[r + 1]]]
                keys.extend((int(t) << TABLE_SHIFT) | int(i) for i in sorted(set(ids.tolist())))
    return np.asarray(keys, dtype=np.int64)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), tables=st.integers(1, 3), request_size=st.sampled_from([None, 1, 3]))
def test_key_stream_matches_a_naive_reference(data, tables, request_size):
    batches = []
    for _ in range(data.draw(st.integers(1, 3))):
        bsz = data.draw(st.integers(0, 6))
        indices, offsets = [], []
        for _t in range(tables):
            lengths = data.draw(st.lists(st.integers(0, 4), min_size=bsz, max_size=bsz))
            offsets.append(np.concatenate(([0], np.cumsum(lengths))).astype(np.int64))
            indices.append(np.asarray(data.draw(st.lists(st.integers(0, 9), min_size=sum(lengths),
                                                         max_size=sum(lengths))), dtype=np.int64))
        batches.append(Batch(indices, offsets))
    stream = key_stream(batches, request_size)
    np.testing.assert_array_equal(stream.keys, _naive_keys(batches, request_size))
    assert stream.segments[-1] == stream.keys.shape[0]
    assert stream.segments.shape[0] == stream.num_requests * tables + 1


def test_warmup_batches_are_left_out(tiny_store):
    full = replay(TINY, "sdm-nand", store=tiny_store)
    part = replay(TINY, "sdm-nand", store=tiny_store, warmup_batches=3)
    assert part.requests == 5 and part.batches == 5
    np.testing.assert_array_equal(part.service_ns, full.service_ns[3:])
    assert part.tiers[0]["hits"] + part.tiers[0]["misses"] < full.tiers[0]["hits"] + full.tiers[0]["misses"]
    few = replay(TINY, "sdm-nand", store=tiny_store, max_batches=2)
    assert few.requests == 2


def test_model_forward_serves_the_same_lookups(tmp_path):
    plain = replay(TINY, "sdm-nand", dim=16, workdir=str(tmp_path))
    r = replay(TINY, "sdm-nand", model="criteo-kaggle", workdir=str(tmp_path), fit_model=True)
    assert r.dim == 16 and r.model == "criteo-kaggle" and "2 tables" in r.extra["model_tables"]
    assert 0.0 < r.extra["mean_click_probability"] < 1.0
    assert [t["hits"] for t in r.tiers] == [t["hits"] for t in plain.tiers]
    np.testing.assert_array_equal(r.service_ns, plain.service_ns)


def test_the_qps_at_sla_is_the_host_models(tiny_store, monkeypatch):
    # One QPS everywhere: the replay reports what `sdm host` predicts for the same host, and
    # that rate keeps the simulated p99 within the SLA while 10% more does not. One profile
    # serves both sides: CPU costs re-measured on a shared machine differ from run to run.
    import importlib

    predict_module = importlib.import_module("sdm.host.predict")  # the module, not the function

    profile = build_profile(TINY, "sdm-nand", "this-machine", store=tiny_store)
    monkeypatch.setattr(predict_module, "build_profile", lambda *a, **k: profile)
    r = replay_on_host(TINY, "sdm-nand", store=tiny_store, sla_us=20_000, arrivals=5_000)
    sim = HostSimulation(profile, arrivals=5_000)
    sla_ns = 20_000e3
    assert r.host == "this-machine" and r.qps_at_sla == sim.qps_at_sla(20_000).qps > 0
    assert sim.percentile_ns(r.qps_at_sla, 99) <= sla_ns
    assert sim.percentile_ns(1.1 * r.qps_at_sla, 99) > sla_ns
    assert r.to_json()["sla"]["bottleneck"] == r.extra["host_model"]["bottleneck"]
    assert replay(TINY, "sdm-nand", store=tiny_store).sla is None  # a replay alone models no host


def test_no_sla_skips_the_search(tiny_store):
    r = replay(TINY, "dram", store=tiny_store, sla_us=None)
    assert r.sla is None and r.to_json()["qps_at_sla"] is None


def test_errors(tmp_path, tiny_store):
    with pytest.raises(TraceNotFoundError, match="no trace"):
        replay(str(tmp_path / "missing.npz"), "dram")
    with pytest.raises(ConfigError, match="neither a preset"):
        replay(TINY, "no-such-preset")
    with pytest.raises(ConfigError, match="does not exist"):
        replay(TINY, str(tmp_path / "missing.toml"))
    # below any device / one Nand read: no rate meets it (the host model, after the replay), and
    # the replay still reports every result, with QPS 0 and the reason
    for sla_us in (0.01, 50):
        unmet = replay_on_host(TINY, "sdm-nand", store=tiny_store, sla_us=sla_us, arrivals=1_000)
        assert unmet.qps_at_sla == 0 and unmet.sla.bottleneck == "latency floor" and unmet.requests > 0
        assert "zero load" in unmet.sla.reason and unmet.to_json()["sla"]["reason"] == unmet.sla.reason
        assert "no rate meets the SLA" in replay_markdown(unmet)
    with pytest.raises(SlaError, match="> 0"):
        replay(TINY, "dram", sla_us=-1)
    with pytest.raises(sdm.errors.InvalidArgumentError, match="not a directory"):
        replay(TINY, "dram", workdir=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="model preset"):
        replay(TINY, "dram", model="no-such-model")
    other = tmp_path / "other"
    with sdm.Store.create(other, [sdm.TableSpec("a", 1000, 8)]) as s:
        s.write_table("a", np.zeros((1000, 8), np.float32))
    with pytest.raises(ConfigError, match="tables are matched in order"):
        replay(TINY, "dram", store=str(other))
    small = tmp_path / "small"
    with sdm.Store.create(small, [sdm.TableSpec("a", 10, 8), sdm.TableSpec("b", 1000, 8)]) as s:
        s.write_table("a", np.zeros((10, 8), np.float32))
        s.write_table("b", np.zeros((1000, 8), np.float32))
    with pytest.raises(ConfigError, match="has 10 rows"):
        replay(TINY, "dram", store=str(small))


@pytest.mark.parametrize("argv, match", [
    (["replay", "missing.npz"], "no trace"),
    (["replay", TINY, "--config", "nope"], "neither a preset"),
    (["replay", TINY, "--model", "rm1", "--dim", "8"], "conflict"),
])
def test_cli_errors_are_one_line(capsys, argv, match):
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sdm replay: error:") and match in err[0]
    assert "Traceback" not in captured.err


def test_cli_reports_an_unmeetable_sla_with_every_result(capsys):
    # issue 21: an SLA below the devices' own latency used to discard the replay with exit 2
    assert main(["replay", TINY, "--config", "sdm-nand", "--dim", "8", "--sla-us", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "**QPS at SLA: 0.00**" in out and "no rate meets the SLA: SLA 0.01 us is below" in out
    assert "| mmap | nand-p4500 |" in out


def test_cli_writes_json_summary_and_plots(tmp_path, capsys, tiny_store):
    out = tmp_path / "out"
    js = tmp_path / "r.json"
    assert main(["replay", TINY, "--config", "sdm-3dxp", "--store", tiny_store, "--json", str(js),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "QPS at SLA" in printed
    data = json.loads(js.read_text())
    assert data["config"] == "sdm-3dxp" and data["requests"] == 8
    assert json.loads((out / "result.json").read_text())["lookups"] == 4082
    assert "# sdm replay" in (out / "summary.md").read_text()
    assert (out / "latency_cdf.png").stat().st_size > 0 and (out / "hit_rate.png").stat().st_size > 0


def test_cli_json_to_stdout(capsys, tiny_store):
    assert main(["replay", TINY, "--store", tiny_store, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tiers"][0]["name"] == "dram" and data["tiers"][0]["hits"] == 4082


def test_generated_trace_with_empty_batch(tmp_path):
    rng = np.random.default_rng(0)
    batches = [Batch([rng.integers(0, 50, 12)], [np.arange(0, 13, 3)]),
               Batch([np.zeros(0, np.int64)], [np.zeros(1, np.int64)]),
               Batch([rng.integers(0, 50, 6)], [np.array([0, 6])])]
    path = save(tmp_path / "t.npz", batches, [50])
    r = replay(path, "sdm-nand", dim=4, workdir=str(tmp_path))
    assert r.requests == 2 and r.lookups == 18
    assert isinstance(SlaError("x"), SdmError)


def test_a_store_the_disk_cannot_hold_is_refused(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 1000))
    with pytest.raises(sdm.errors.InvalidArgumentError, match="GiB free"):
        replay(TINY, "sdm-nand", dim=8, workdir=str(tmp_path))


def test_dram_hit_rate_of_tier_shapes():
    from sdm.replay.live import dram_hit_rate

    assert dram_hit_rate([{"kind": "dram", "hits": 10, "misses": 0}]) == 1.0
    assert dram_hit_rate([{"kind": "lmdb", "hits": 10, "misses": 0}]) == 0.0
    cache = {"kind": "cache", "hits": 3, "misses": 1}
    backing = {"kind": "mmap", "hits": 1, "misses": 0}
    assert dram_hit_rate([cache, backing]) == 0.75
    assert dram_hit_rate([{"kind": "dram", "hits": 4, "misses": 0}, cache, backing]) == 7 / 8
    assert dram_hit_rate([]) == 0.0


def test_bad_request_size_fails_before_any_work(tmp_path):
    with pytest.raises(sdm.errors.InvalidArgumentError, match="request_size"):
        replay(TINY, "dram", request_size=0, workdir=str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_cli_hierarchy_options_reach_the_store(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["replay", TINY, "--config", "sdm-nand", "--cache-bytes", "64K", "--policy", "s3fifo",
                 "--admission", "tinylfu", "--pooled-cache-bytes", "1M", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    cache = data["tiers"][0]
    assert (cache["policy"], cache["admission"], cache["capacity_rows"]) == ("s3fifo", "tinylfu", 65536 // 256)
    capsys.readouterr()
    assert main(["replay", TINY, "--config", "dram", "--cache-bytes", "64K"]) == 2
    assert "no cache tier" in capsys.readouterr().err
    assert main(["replay", TINY, "--config", "sdm-nand", "--policy", "belady"]) == 2
    assert "belady" in capsys.readouterr().err

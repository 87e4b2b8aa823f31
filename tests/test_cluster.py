"""The sharded store on a real local Ray cluster (one for the whole session, 2 CPUs): bitwise
equality with one host for every sharding type and row format, updates, stats, failure of
an actor mid-stream, deadlines, bad input, pre-built shards and the benchmark's smoke run."""

from __future__ import annotations

import os
import runpy
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import peers  # noqa: E402

ray = peers.require("ray")  # an optional extra (sdm[cluster]); CI's peer phase installs it
pytestmark = pytest.mark.peers

import sdm  # noqa: E402
from sdm.cluster import PlanError, ShardedStore, ShardUnavailableError, build, plan  # noqa: E402

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
TYPES = {"fp32": ("table-wise", "row-wise", "table-row-wise", "column-wise"),
         "fp16": ("table-wise", "row-wise", "table-row-wise", "column-wise"),
         "int8": ("table-wise", "row-wise", "table-row-wise")}


@pytest.fixture(scope="session")
def cluster():
    """One local Ray cluster for every test here (starting one takes seconds)."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False)
    yield
    if started:
        ray.shutdown()


def make_store(path, seed=0):
    """A store with a table per (format, sharding type), plus a wide fp32 table (dim 130:
    the kernels' 64-column tiles and a tail) cut by columns. Returns the forced sharding."""
    rng = np.random.default_rng(seed)
    specs, sharding = [], {}
    for f, kinds in TYPES.items():
        for i, kind in enumerate(kinds):
            specs.append(sdm.TableSpec(f"{f}-{kind}", 103 + 17 * i, 5 + 4 * i, f))
            sharding[specs[-1].name] = kind
    specs.append(sdm.TableSpec("wide", 64, 130))
    sharding["wide"] = "column-wise"
    with sdm.Store.create(path, specs) as store:
        for s in specs:
            scale = rng.uniform(1e-3, 1e2, (s.num_rows, 1))
            store.write_table(s.name, (rng.standard_normal((s.num_rows, s.dim)) * scale).astype(np.float32))
    return sharding


@pytest.fixture(scope="module")
def stores(cluster, tmp_path_factory):
    """(sharded store over 4 workers, the single-host store it was cut from)."""
    root = tmp_path_factory.mktemp("cluster")
    sharding = make_store(root / "store")
    p = plan(root / "store", 4, workers_per_host=2, sharding=sharding)
    with ShardedStore.launch(root / "store", p, num_cpus=2) as sharded, sdm.Store.open(root / "store") as one:
        yield sharded, one


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].shape == b[k].shape and a[k].dtype == b[k].dtype and np.array_equal(a[k].view(np.uint32),
                                                                                 b[k].view(np.uint32))
        for k in a)


def boundary_ids(spec, shards, rng, n):
    """Ids drawn mostly from the first and last row of each shard's range."""
    edges = sorted({e for s in shards for e in (s.rows[0], s.rows[1] - 1)})
    pick = rng.choice(edges, n) if rng.random() < 0.5 else rng.integers(0, spec.num_rows, n)
    return pick.astype(rng.choice([np.int32, np.int64]))


@st.composite
def batches(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    bags = draw(st.integers(0, 12))
    weighted = draw(st.booleans())
    return seed, bags, weighted, draw(st.sampled_from(["sum", "mean"]))


@settings(max_examples=25, deadline=None)
@given(batches())
def test_embedding_bags_bitwise_equal_one_host(stores, case):
    sharded, one = stores
    seed, bags, weighted, mode = case
    rng = np.random.default_rng(seed)
    requests = {}
    for t in sharded.plan.tables:
        sizes = rng.integers(0, 6, bags) * (rng.random(bags) < 0.8)  # empty bags too
        offsets = np.concatenate(([0], np.cumsum(sizes)))
        ids = boundary_ids(t.spec, t.shards, rng, int(offsets[-1]))
        if rng.random() < 0.3 and len(ids):
            ids[:] = ids[0]  # all duplicates
        requests[t.spec.name] = ((ids, offsets, rng.random(len(ids)).astype(np.float32)) if weighted
                                 else (ids, offsets))
    assert same_bits(sharded.embedding_bags(requests, mode=mode), one.embedding_bags(requests, mode=mode))


def test_single_bag_calls_and_lookup_bitwise(stores):
    sharded, one = stores
    rng = np.random.default_rng(1)
    for t in sharded.plan.tables:
        name = t.spec.name
        ids = boundary_ids(t.spec, t.shards, rng, 40)
        offsets = np.array([0, 3, 3, 40])
        assert same_bits({0: sharded.embedding_bag(name, ids, offsets)}, {0: one.embedding_bag(name, ids, offsets)})
        assert same_bits({0: sharded.lookup(name, ids)}, {0: one.lookup(name, ids)})
        assert sharded.lookup(name, []).shape == (0, t.spec.dim)
        assert sharded.embedding_bag(name, [], [0]).shape == (0, t.spec.dim)
        assert np.array_equal(sharded.embedding_bag(name, [], [0, 0, 0]), np.zeros((2, t.spec.dim), np.float32))


def test_update_rows_goes_to_the_owners(stores):
    sharded, one = stores
    rng = np.random.default_rng(2)
    for t in sharded.plan.tables:
        before = sharded.stats()["versions"]
        ids = np.unique(np.r_[0, t.spec.num_rows - 1, t.shards[-1].rows[0], rng.integers(0, t.spec.num_rows, 3)])
        rows = rng.standard_normal((len(ids), t.spec.dim)).astype(np.float32)
        versions = sharded.update_rows(t.spec.name, ids, rows)
        one.update_rows(t.spec.name, ids, rows)
        owners = {s.worker for s in t.shards if ((ids >= s.rows[0]) & (ids < s.rows[1])).any()}
        assert set(versions) == owners
        after = sharded.stats()["versions"]
        assert all(after[w] == versions[w] > before[w] for w in owners)
        assert all(after[w] == before[w] for w in after if w not in owners)
        assert same_bits({0: sharded.lookup(t.spec.name, ids)}, {0: one.lookup(t.spec.name, ids)})
        bag = (ids, np.array([0, len(ids)]))
        assert same_bits(sharded.embedding_bags({t.spec.name: bag}), one.embedding_bags({t.spec.name: bag}))


def test_stats_aggregate_and_keep_every_shard(stores):
    sharded, _ = stores
    stats = sharded.stats()
    shards = stats["shards"]
    assert [s["worker"] for s in shards] == sharded.workers == sorted({s.worker for s in sharded.plan.shards})
    assert len(sharded.actors) == len(shards) == stats["workers"]
    assert stats["lookups"] == sum(s["lookups"] for s in shards)
    assert stats["versions"] == {s["worker"]: s["version"] for s in shards}
    assert stats["tiers"][0]["hits"] == sum(s["tiers"][0]["hits"] for s in shards)
    assert all(os.path.isdir(s["path"]) and s["restarted"] is False for s in shards)
    assert list(sharded.tables) == [t.spec.name for t in sharded.plan.tables]


def test_bad_input_gets_typed_errors_and_writes_nothing(stores):
    sharded, _ = stores
    name = "fp32-row-wise"
    before = sharded.stats()["versions"]
    cases = [
        (lambda: sharded.embedding_bags({"nope": ([0], [0, 1])}), sdm.errors.UnknownTableError),
        (lambda: sharded.embedding_bags({name: ([10_000], [0, 1])}), sdm.errors.IdOutOfRangeError),
        (lambda: sharded.embedding_bags({name: ([-1], [0, 1])}), sdm.errors.IdOutOfRangeError),
        (lambda: sharded.embedding_bags({name: ([0, 1], [0, 1])}), sdm.errors.InvalidOffsetsError),
        (lambda: sharded.embedding_bags({name: ([0, 1], [0, 2, 1, 2])}), sdm.errors.InvalidOffsetsError),
        (lambda: sharded.embedding_bags({name: ([0.5], [0, 1])}), sdm.errors.InvalidArgumentError),
        (lambda: sharded.embedding_bags({name: ([0], [0, 1], [1, 2])}), sdm.errors.InvalidArgumentError),
        (lambda: sharded.embedding_bags({name: ([0], [0, 1])}, mode="max"), sdm.errors.InvalidArgumentError),
        (lambda: sharded.embedding_bags([(name, [0], [0, 1])]), sdm.errors.InvalidArgumentError),
        (lambda: sharded.embedding_bags({name: ([0],)}), sdm.errors.InvalidArgumentError),
        (lambda: sharded.lookup(name, [[0]]), sdm.errors.InvalidArgumentError),
        (lambda: sharded.lookup(name, [0], timeout_s=0), sdm.errors.InvalidArgumentError),
        (lambda: sharded.update_rows(name, [0, 0], np.ones((2, 5))), sdm.errors.InvalidArgumentError),
        (lambda: sharded.update_rows(name, [0], np.ones((1, 4))), sdm.errors.InvalidArgumentError),
        (lambda: sharded.update_rows(name, [0, 100], np.full((2, 5), np.nan)), sdm.errors.InvalidArgumentError),
        (lambda: sharded.update_rows("fp16-row-wise", [0], np.full((1, 5), 1e6)), sdm.errors.InvalidArgumentError),
        (lambda: sharded.update_rows(name, [999], np.ones((1, 5))), sdm.errors.IdOutOfRangeError),
    ]
    for call, error in cases:
        with pytest.raises(error):
            call()
    assert sharded.stats()["versions"] == before


def test_a_missed_deadline_raises_naming_the_shards(stores):
    sharded, one = stores
    request = {"fp32-row-wise": (np.arange(50), np.array([0, 50]))}
    with pytest.raises(ShardUnavailableError) as err:
        sharded.embedding_bags(request, timeout_s=1e-6)
    assert err.value.workers and set(err.value.workers) <= set(sharded.workers)
    assert "no answer within" in str(err.value)
    assert same_bits(sharded.embedding_bags(request), one.embedding_bags(request))  # and it goes on


def test_launch_refuses_a_plan_for_other_tables(stores, tmp_path):
    sharded, one = stores
    other = plan([sdm.TableSpec("x", 10, 4)], 2)
    with pytest.raises(PlanError, match="not the store's"):
        ShardedStore.launch(one.path, other)


def test_kill_one_of_four_actors_mid_stream(cluster, tmp_path):
    """200 batches; an actor is killed (Ray restarts it) at batch 50: every batch is bitwise
    right or raises the typed error by its deadline, and service is back within 10 s."""
    rng = np.random.default_rng(5)
    specs = [sdm.TableSpec("rw", 4000, 16), sdm.TableSpec("tw", 500, 8, "int8"),
             sdm.TableSpec("cw", 300, 32, "fp16"), sdm.TableSpec("tw2", 800, 8)]
    with sdm.Store.create(tmp_path / "store", specs) as store:
        for s in specs:
            store.write_table(s.name, rng.standard_normal((s.num_rows, s.dim)).astype(np.float32))
    p = plan(tmp_path / "store", 4, sharding={"rw": "row-wise", "tw": "table-wise", "cw": "column-wise"})
    build(tmp_path / "store", p, tmp_path / "shards")  # launch takes pre-built shards too
    batches = []
    for _ in range(200):
        offsets = np.arange(0, 33 * 8, 8)
        batches.append({s.name: (rng.integers(0, s.num_rows, 32 * 8), offsets) for s in specs})
    timeout = 10.0
    with sdm.Store.open(tmp_path / "store") as one, \
            ShardedStore.launch(tmp_path / "store", p, shards=tmp_path / "shards", timeout_s=timeout) as sharded:
        assert len(sharded.actors) == 4
        victim = sharded.actors[1]
        expected = [one.embedding_bags(b) for b in batches]
        wrong = failed = 0
        killed_at = recovered_at = None
        for i, batch in enumerate(batches):
            if i == 50:
                # kill while a batch is in flight on it
                threading.Timer(0.002, lambda: ray.kill(victim, no_restart=False)).start()
                killed_at = time.monotonic()
            start = time.monotonic()
            try:
                got = sharded.embedding_bags(batch)
            except ShardUnavailableError as exc:
                assert time.monotonic() - start <= timeout + 2.0
                assert exc.workers
                failed += 1
                continue
            wrong += not same_bits(got, expected[i])
            if killed_at is not None and recovered_at is None:
                recovered_at = time.monotonic()
        assert wrong == 0
        assert recovered_at is not None and recovered_at - killed_at <= 10.0
        assert failed < 200 - 50
        stats = sharded.stats()
        assert stats["shards"][1]["restarted"] is True
        assert [s["restarted"] for i, s in enumerate(stats["shards"]) if i != 1] == [False] * 3
        # gone for good: the next call names the shard at once, never returns rows
        ray.kill(victim, no_restart=True)
        start = time.monotonic()
        with pytest.raises(ShardUnavailableError) as err:
            sharded.embedding_bags(batches[0])
        assert err.value.workers == (sharded.workers[1],) and time.monotonic() - start < timeout
    with pytest.raises(PlanError, match="another plan"):
        ShardedStore.launch(tmp_path / "store", plan(tmp_path / "store", 2), shards=tmp_path / "shards")


def test_bench_cluster_quick(cluster, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench_cluster.py", "--quick"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(os.path.join(BENCH, "bench_cluster.py"), run_name="__main__")
    assert done.value.code == 0
    out = capsys.readouterr().out
    for words in ("CPU:", "Ray call", "| 2 |", "| 4 |", "planner", "greedy"):
        assert words in out, out

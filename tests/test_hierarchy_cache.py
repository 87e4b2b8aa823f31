"""The store's DRAM cache end to end: its hits and misses equal the simulator's on the same key
stream; prefetched rows stay pinned until their batch; lookahead hides IO behind compute."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import sdm
from helpers import rows_in_turn
from sdm.store.config import CACHE_POLICIES, HierarchyConfig, TierConfig
from sdm.store.prefetch import Lookahead
from sdm.kernels.serve import TABLE_SHIFT

SPECS = [sdm.TableSpec("a", 2000, 16, "fp32"), sdm.TableSpec("b", 3000, 8, "fp16"),
         sdm.TableSpec("c", 1000, 32, "int8")]


def config(capacity_rows, policy="lru", admission=None, device="nand-p4500"):
    return HierarchyConfig(f"test-{policy}", (
        TierConfig("cache", capacity_rows=capacity_rows, policy=policy, admission=admission),
        TierConfig("mmap", device, queue_depth=4)))


@pytest.fixture(scope="module")
def store_path(make_store):
    return make_store(SPECS, rows_in_turn(0))


def batches(n, seed=0, bags=32, pooling=6):
    """Zipf-skewed request batches over every table."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        batch = {}
        for spec in SPECS:
            lengths = rng.integers(0, pooling + 1, bags)
            ids = (rng.zipf(1.15, int(lengths.sum())) - 1) % spec.num_rows
            batch[spec.name] = (ids, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        out.append(batch)
    return out


def key_stream(stream):
    """The cache's key stream: per batch, per table in request order, the distinct ids."""
    table_id = {s.name: i for i, s in enumerate(SPECS)}
    keys = [(np.int64(table_id[name]) << TABLE_SHIFT) | np.unique(ids)
            for batch in stream for name, (ids, _) in batch.items()]
    return np.concatenate(keys)


@pytest.mark.parametrize("policy, admission", [(p, None) for p in CACHE_POLICIES]
                         + [("lru", "tinylfu"), ("s3fifo", "threshold")])
def test_live_hits_and_misses_equal_the_simulator(store_path, policy, admission):
    stream = batches(12)
    with sdm.Store.open(store_path, config=config(500, policy, admission)) as store:
        for batch in stream:
            store.embedding_bags(batch)
        cache, scm = store.stats()["tiers"]
    sim = sdm.simulate(key_stream(stream), policy=policy, capacity=500, admission=admission)
    assert (cache["hits"], cache["misses"]) == (sim.hits, sim.misses)
    assert scm["hits"] == sim.misses  # every miss, and nothing else, read from the SCM tier
    assert 0 < sim.hits and 0 < sim.misses


def test_prefetched_rows_survive_an_evicting_batch_until_released(store_path):
    wanted = {"a": (np.arange(0, 50, 5), np.array([0, 10]))}
    flood = {"a": (np.arange(1000, 1100), np.array([0, 100]))}  # 100 distinct rows > 60 slots
    with sdm.Store.open(store_path, config=config(60)) as store:
        ticket = store.prefetch(wanted)
        assert ticket.num_rows == 10
        store.embedding_bags(flood)
        before = store.stats()["tiers"][0]
        store.embedding_bags(wanted)
        after = store.stats()["tiers"][0]
        assert after["hits"] - before["hits"] == 10 and after["misses"] == before["misses"]
        assert after["prefetch_used"] == 10 and after["prefetch_accuracy"] == 1.0
        store.release(ticket)
        assert not store._hierarchy._cache.inner.directory.pin_counts().any()
        with pytest.raises(sdm.errors.InvalidArgumentError, match="released already"):
            store.release(ticket)
        # released: the flood evicts them now
        store.embedding_bags(flood)
        before = store.stats()["tiers"][0]
        store.embedding_bags(wanted)
        assert store.stats()["tiers"][0]["misses"] - before["misses"] == 10


def test_without_pins_the_same_rows_would_have_been_evicted(store_path):
    # the control for the test above: the flood really does evict unpinned rows
    wanted = {"a": (np.arange(0, 50, 5), np.array([0, 10]))}
    flood = {"a": (np.arange(1000, 1100), np.array([0, 100]))}
    with sdm.Store.open(store_path, config=config(60)) as store:
        store.embedding_bags(wanted)
        store.embedding_bags(flood)
        before = store.stats()["tiers"][0]
        store.embedding_bags(wanted)
        assert store.stats()["tiers"][0]["misses"] - before["misses"] == 10


def test_prefetch_is_a_no_op_without_a_cache(store_path):
    for preset in ("dram", "ssd"):
        with sdm.Store.open(store_path, config=preset) as store:
            ticket = store.prefetch(batches(1)[0])
            assert ticket.num_rows == 0
            store.release(ticket)


def test_prefetch_validates_like_a_batch(store_path):
    with sdm.Store.open(store_path, config=config(60)) as store:
        with pytest.raises(sdm.errors.IdOutOfRangeError):
            store.prefetch({"a": (np.array([5000]), np.array([0, 1]))})
        with pytest.raises(sdm.errors.UnknownTableError):
            store.prefetch({"zz": (np.array([1]), np.array([0, 1]))})
        with pytest.raises(sdm.errors.InvalidArgumentError):
            store.release("ticket")
        assert not store._hierarchy._cache.inner.directory.pin_counts().any()


@pytest.mark.parametrize("depth", [1, 3])
def test_lookahead_returns_the_same_results_and_hides_io_behind_compute(store_path, depth):
    stream = batches(16, seed=3)
    with sdm.Store.open(store_path, config="dram") as store:
        want = [store.embedding_bags(b) for b in stream]
    runs = {}
    for d in (0, depth):
        with sdm.Store.open(store_path, config=config(3000)) as store:
            look = Lookahead(store, d, compute_ns=2_000_000)
            steps = list(look.serve(stream))
            for step, expected in zip(steps, want):
                for name in expected:
                    np.testing.assert_array_equal(step.outputs[name], expected[name])
            assert len(steps) == len(stream)
            assert not store._hierarchy._cache.inner.directory.pin_counts().any()
            runs[d] = (steps, look.stats())
    plain = sum(s.latency_ns for s in runs[0][0])
    ahead, stats = runs[depth]
    assert sum(s.latency_ns for s in ahead) < 0.5 * plain
    assert stats["prefetch_accuracy"] == 1.0 and stats["prefetch_coverage"] > 0.9
    assert stats["prefetched"] > 0


def test_lookahead_releases_pins_when_the_consumer_stops_early(store_path):
    with sdm.Store.open(store_path, config=config(3000)) as store:
        steps = Lookahead(store, 4).serve(batches(10))
        next(steps)
        steps.close()
        assert not store._hierarchy._cache.inner.directory.pin_counts().any()


def test_lookahead_rejects_bad_depth(store_path):
    with sdm.Store.open(store_path, config=config(60)) as store:
        for bad in (-1, 65, 1.5, True):
            with pytest.raises(sdm.errors.InvalidArgumentError, match="depth"):
                Lookahead(store, bad)


def test_pooled_cache_serves_repeated_bags_before_the_tiers(tmp_path):
    spec = SPECS[0]
    rows = np.random.default_rng(1).standard_normal((spec.num_rows, spec.dim)).astype(np.float32)
    with sdm.Store.create(tmp_path / "s", [spec]) as store:
        store.write_table("a", rows)
    store_path = tmp_path / "s"
    # a user's bag repeated for 8 candidate items, then the same request again
    user = np.array([3, 17, 17, 250, 9], dtype=np.int64)
    ids = np.tile(user, 8)
    offsets = np.arange(0, ids.size + 1, user.size, dtype=np.int64)
    cfg = dataclasses.replace(config(200), pooled_cache_bytes=1 << 20)
    with sdm.Store.open(store_path, config="dram") as store:
        want = store.embedding_bags({"a": (ids, offsets)})["a"]
    with sdm.Store.open(store_path, config=cfg) as store:
        for _ in range(2):
            np.testing.assert_array_equal(store.embedding_bags({"a": (ids, offsets)})["a"], want)
        stats = store.stats()
        assert stats["pooled_cache"]["hits"] == 15 and stats["pooled_cache"]["misses"] == 1
        # only the first bag's 4 distinct rows ever reached the row cache
        assert stats["tiers"][0]["hits"] + stats["tiers"][0]["misses"] == 4
        # a rewritten table drops its pooled vectors
        store.write_table("a", np.zeros_like(rows))
        assert not store.embedding_bags({"a": (ids, offsets)})["a"].any()


def test_an_update_drops_only_the_pooled_bags_holding_a_changed_row(tmp_path):
    spec = SPECS[0]
    rows = np.random.default_rng(2).standard_normal((spec.num_rows, spec.dim)).astype(np.float32)
    with sdm.Store.create(tmp_path / "s", [spec], config=dataclasses.replace(config(200), pooled_cache_bytes=1 << 20)) as store:
        store.write_table("a", rows)
        bags = {"a": (np.array([1, 2, 3, 4, 5, 6]), np.array([0, 2, 4, 6]))}  # [1 2] [3 4] [5 6]
        store.embedding_bags(bags)
        store.update_rows("a", [4], np.zeros((1, spec.dim), np.float32))
        before = store.stats()["pooled_cache"]
        got = store.embedding_bags(bags)["a"]
        after = store.stats()["pooled_cache"]
        assert after["cache_hits"] - before["cache_hits"] == 2 and after["misses"] - before["misses"] == 1
        rows[4] = 0
        np.testing.assert_array_equal(got[1], rows[3] + rows[4])


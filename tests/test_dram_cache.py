"""The DRAM cache tier against plain arrays and against the simulator."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sdm
from sdm.tiers.manifest import TableLayout, TableSpec
from sdm.tiers.base import Bags, Tier
from sdm.policies import Cache
from sdm.kernels.policies import M_LOG_HEAD, M_LOG_ORDERED, M_LOG_TAIL, lru_order
from sdm.kernels.serve import TABLE_SHIFT
from sdm.tiers import dram_cache
from sdm.tiers.dram_cache import DramCacheTier

LIVE_POLICIES = [p for p in sdm.POLICIES if p != "belady"]


class ArrayTier(Tier):
    """Every table as an in-memory array; counts the rows it was asked for."""

    name = "array"

    def __init__(self, tables: dict[int, np.ndarray]):
        self.tables = tables
        self.requests: list[np.ndarray] = []

    def read_rows(self, layout, ids, out):
        self.requests.append(ids.copy())
        np.take(self.tables[layout.table_id], ids, axis=0, out=out)

    def row_offsets(self, layout, ids):
        return ids * layout.spec.row_bytes


def make_tables(specs, seed=0):
    rng = np.random.default_rng(seed)
    layouts, raw, floats = [], {}, {}
    for i, spec in enumerate(specs):
        layout = TableLayout.for_spec(spec, i)
        rows = rng.standard_normal((spec.num_rows, spec.dim)).astype(np.float32)
        raw[i] = sdm.quantize_rows(rows, spec.fmt)
        floats[i] = sdm.dequantize_rows(raw[i], spec.fmt, spec.dim)
        layouts.append(layout)
    return layouts, raw, floats


SPECS = [TableSpec("a", 50, 8, "fp32"), TableSpec("b", 40, 4, "fp16"), TableSpec("c", 30, 24, "int8")]


@settings(max_examples=30)
@given(policy=st.sampled_from(LIVE_POLICIES), capacity=st.integers(1, 40),
       admission=st.sampled_from([None, "threshold", "tinylfu"]), table_by_table=st.booleans(),
       data=st.data())
def test_pooled_bags_and_hits_match_arrays_and_simulator(policy, capacity, admission, table_by_table, data):
    """``table_by_table``: requests served a table per batch, as large ones are."""
    with mock.patch.object(dram_cache, "_FUSE_MAX_LOOKUPS", -1 if table_by_table else dram_cache._FUSE_MAX_LOOKUPS):
        _pooled_bags_and_hits_match(policy, capacity, admission, data)


def _pooled_bags_and_hits_match(policy, capacity, admission, data):
    layouts, raw, floats = make_tables(SPECS)
    lower = ArrayTier(raw)
    widest = max(s.row_bytes for s in SPECS)
    cache = DramCacheTier(lower, capacity, widest, policy=policy, admission=admission)
    stream = []
    for _ in range(data.draw(st.integers(1, 6))):
        # a request of 1-3 tables, in any order: the cache serves them in one probe, table
        # by table in ascending id order, which is the key stream sdm.simulate replays
        tables = data.draw(st.lists(st.integers(0, len(SPECS) - 1), min_size=1, max_size=3, unique=True))
        request, wants = [], []
        for t in tables:
            spec, layout = SPECS[t], layouts[t]
            sizes = data.draw(st.lists(st.integers(0, 8), min_size=1, max_size=6))
            ids = np.array(data.draw(st.lists(st.integers(0, spec.num_rows - 1), min_size=sum(sizes),
                                              max_size=sum(sizes))), dtype=np.int64)
            offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            out = np.empty((len(sizes), spec.dim), dtype=np.float32)
            request.append(Bags(layout, ids, offsets, None, False, out))
            wants.append(np.stack([floats[t][ids[a:b]].sum(axis=0) for a, b in zip(offsets[:-1], offsets[1:])]))
        cache.pool_bags(request)
        for b, want in zip(request, wants):
            np.testing.assert_allclose(b.out, want, rtol=1e-5, atol=1e-4)
        for t in sorted(tables):
            stream.append((np.int64(t) << TABLE_SHIFT) | np.unique(request[tables.index(t)].indices))
        cache.check_invariants()
    keys = np.concatenate(stream)
    sim = sdm.simulate(keys, policy=policy, capacity=capacity, admission=admission)
    stats = cache.stats()
    assert (stats["hits"], stats["misses"]) == (sim.hits, sim.misses)
    # every miss, and nothing else, was read from the tier below
    assert sum(len(r) for r in lower.requests) == stats["misses"]


@settings(max_examples=40, deadline=None)
@given(policy=st.sampled_from(LIVE_POLICIES), admission=st.sampled_from([None, "threshold", "tinylfu"]),
       capacity=st.integers(20, 60), data=st.data())
def test_a_batch_of_hits_alone_leaves_the_state_the_general_path_does(policy, admission, capacity, data):
    """Where hits commute, a batch that only hits is served in one pass over its lookups
    (``_serve_hits``); a twin cache held to the general path (dedup, then probe) must end in
    the same state after every request, with the same outputs and counters. Only the use
    stamps' positions and the epochs may differ, and where LRU's log holds each slot, not
    the order it gives."""
    layouts, raw, _ = make_tables(SPECS[:2])
    widest = max(s.row_bytes for s in SPECS[:2])
    fast = DramCacheTier(ArrayTier(raw), capacity, widest, policy=policy, admission=admission)
    general = DramCacheTier(ArrayTier(raw), capacity, widest, policy=policy, admission=admission)
    general._hits_commute = general._try_hits_alone = False
    served_alone = 0
    for _ in range(data.draw(st.integers(1, 8))):
        tables = data.draw(st.lists(st.integers(0, 1), min_size=1, max_size=2, unique=True))
        # few distinct rows, many repeats: most requests after the first few only hit
        ids = {t: np.array(data.draw(st.lists(st.integers(0, 11), min_size=1, max_size=30)), dtype=np.int64)
               for t in tables}
        served = []
        for cache in (fast, general):
            request = [Bags(layouts[t], ids[t], np.array([0, len(ids[t])], dtype=np.int64), None, False,
                            np.empty((1, SPECS[t].dim), dtype=np.float32)) for t in tables]
            with mock.patch.object(dram_cache, "unique_ranked", wraps=dram_cache.unique_ranked) as dedup:
                hits = cache.pool_bags(request)
            served.append((hits, [b.out for b in request]))
            if cache is fast:
                served_alone += not dedup.called
        assert served[0][0] == served[1][0]
        for a, b in zip(served[0][1], served[1][1]):
            np.testing.assert_array_equal(a, b)
        states = fast.directory._state, general.directory._state
        for i, (a, b) in enumerate(zip(*states)):
            if i == 0:  # LRU's log may hold a batch's hits in another order, tied
                a, b = (np.delete(m, [M_LOG_HEAD, M_LOG_TAIL, M_LOG_ORDERED]) for m in (a, b))
            if i not in (19, 20, 21, 22):  # use stamps, epochs in flight, LRU's log
                np.testing.assert_array_equal(a, b, err_msg=f"policy state array {i}")
        if policy == "lru":  # ... but the same recency order
            np.testing.assert_array_equal(*(lru_order(s) for s in states))
        np.testing.assert_array_equal(fast._state, general._state)
        np.testing.assert_array_equal(fast._counters, general._counters)
        assert fast.stats() == general.stats()
        fast.check_invariants()
    assert fast._hits_commute or served_alone == 0


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(2, 12), data=st.data())
def test_lru_evicts_a_batch_of_hits_alone_in_key_order(capacity, data):
    """The all-hit path logs an LRU batch's hits tied, in order of first sight; evictions
    must take them least recent first by key, as the simulator's ascending replay of the
    batch does. Requests over a few resident rows (all hits) alternate with wide ones."""
    layouts, raw, floats = make_tables(SPECS[:1])
    cache = DramCacheTier(ArrayTier(raw), capacity, SPECS[0].row_bytes, policy="lru")
    twin = Cache(capacity, "lru")
    for _ in range(data.draw(st.integers(2, 14))):
        hi = data.draw(st.sampled_from([capacity, SPECS[0].num_rows]))
        ids = np.array(data.draw(st.lists(st.integers(0, hi - 1), min_size=1, max_size=20)), dtype=np.int64)
        out = np.empty((1, SPECS[0].dim), dtype=np.float32)
        cache.pool_bags([Bags(layouts[0], ids, np.array([0, len(ids)], dtype=np.int64), None, False, out)])
        twin.access(np.unique(ids))  # table 0's keys are its row ids
        np.testing.assert_array_equal(cache.directory.slot_keys(), twin.slot_keys())
        np.testing.assert_allclose(out[0], floats[0][ids].sum(axis=0), rtol=1e-5, atol=1e-5)
        cache.check_invariants()
    assert cache.directory.stats() == twin.stats()


def test_lru_evicts_the_smallest_key_of_a_batch_of_hits_first():
    layouts, raw, _ = make_tables(SPECS[:1])
    layout = layouts[0]
    cache = DramCacheTier(ArrayTier(raw), 4, SPECS[0].row_bytes, policy="lru")

    def request(*ids):
        out = np.empty((1, SPECS[0].dim), dtype=np.float32)
        ids = np.array(ids, dtype=np.int64)
        cache.pool_bags([Bags(layout, ids, np.array([0, len(ids)], dtype=np.int64), None, False, out)])

    request(5, 6, 7, 8)
    request(5)  # a batch of hits alone: the next is tried in one pass
    with mock.patch.object(dram_cache, "unique_ranked", side_effect=AssertionError("general path")):
        request(8, 6, 8, 7, 5)  # all hits, first seen 8, 6, 7, 5: tied, so by key 5, 6, 7, 8
    request(20)
    assert sorted(cache.directory.slot_keys().tolist()) == [6, 7, 8, 20]
    request(21, 22)
    assert sorted(cache.directory.slot_keys().tolist()) == [8, 20, 21, 22]
    cache.check_invariants()


def test_a_batch_of_hits_alone_pins_the_slots_another_batch_in_flight_holds():
    layouts, raw, floats = make_tables(SPECS[:1])
    layout, width = layouts[0], SPECS[0].row_bytes
    cache = DramCacheTier(ArrayTier(raw), 8, width, policy="sieve")
    first = cache._serve([layout], np.arange(4, dtype=np.int64))  # in flight until _end
    ids = np.array([3, 2, 3, 3, 2], dtype=np.int64)  # hits on two of its slots, repeated
    out = np.empty((1, SPECS[0].dim), dtype=np.float32)
    with mock.patch.object(dram_cache, "unique_ranked", side_effect=AssertionError("general path")), \
            mock.patch.object(dram_cache, "pin_batch", wraps=dram_cache.pin_batch) as unpin:
        hits = cache.pool_bags([Bags(layout, ids, np.array([0, 5], dtype=np.int64), None, False, out)])
    assert hits == 2
    (_, shared, delta), _ = unpin.call_args  # pinned once each, distinct, unpinned at its end
    assert sorted(shared.tolist()) == sorted(first.ptr[[2, 3]].tolist()) and delta == -1
    np.testing.assert_allclose(out[0], floats[0][ids].sum(axis=0), rtol=1e-6)
    assert not cache.directory.pin_counts().any()  # its pins on the shared slots ended with it
    assert cache._flying == {first.epoch}
    cache._end(first)
    cache.check_invariants()


@pytest.mark.parametrize("policy", ["lru", "fifo", "s3fifo"])
def test_read_rows_when_the_batch_overflows_the_cache(policy):
    layouts, raw, floats = make_tables(SPECS[:1])
    cache = DramCacheTier(ArrayTier(raw), 3, SPECS[0].row_bytes, policy=policy)
    ids = np.arange(0, 50, 2, dtype=np.int64)  # 25 distinct rows through 3 slots
    out = np.empty((len(ids), SPECS[0].row_bytes), dtype=np.uint8)
    for _ in range(3):
        cache.read_rows(layouts[0], ids, out)
        np.testing.assert_array_equal(out, raw[0][ids])


def test_invalidate_drops_only_that_table():
    layouts, raw, _ = make_tables(SPECS)
    cache = DramCacheTier(ArrayTier(raw), 100, max(s.row_bytes for s in SPECS))
    for layout in layouts:
        out = np.empty((5, layout.spec.row_bytes), dtype=np.uint8)
        cache.read_rows(layout, np.arange(5, dtype=np.int64), out)
    cache.invalidate(layouts[1])
    assert cache.stats()["cached_rows"] == 10
    raw[1][:5] = 0  # rows rewritten below: the cache must not serve the old ones
    out = np.empty((5, layouts[1].spec.row_bytes), dtype=np.uint8)
    cache.read_rows(layouts[1], np.arange(5, dtype=np.int64), out)
    assert not out.any()


def test_belady_is_refused_for_a_live_cache():
    with pytest.raises(sdm.errors.ConfigError, match="belady"):
        DramCacheTier(ArrayTier({}), 10, 8, policy="belady")


@pytest.mark.parametrize("policy", LIVE_POLICIES)
def test_a_batch_in_flight_keeps_its_slots_and_only_those(policy):
    layouts, raw, _ = make_tables(SPECS[:1])
    layout, width = layouts[0], SPECS[0].row_bytes
    cache = DramCacheTier(ArrayTier(raw), 8, width, policy=policy)
    first = cache._serve([layout], np.arange(4, dtype=np.int64))  # in flight until _end (table 0: keys = ids)
    held = first.ptr.copy()
    keys = cache.directory.slot_keys()[held]
    for start in range(10, 45, 5):  # other batches push misses through the other slots
        ids = np.arange(start, start + 5, dtype=np.int64)
        out = np.empty((5, width), dtype=np.uint8)
        cache.read_rows(layout, ids, out)
        np.testing.assert_array_equal(out, raw[0][ids])
        cache.check_invariants()
    assert np.array_equal(cache.directory.slot_keys()[held], keys)  # none evicted
    np.testing.assert_array_equal(first.slots[held, :width], raw[0][:4])  # nor overwritten
    # a batch sharing the held rows pins them for itself while the first is in flight
    second = cache._serve([layout], np.arange(2, 6, dtype=np.int64))
    cache._end(first)
    assert (cache.directory.pin_counts()[second.ptr[:2]] == 1).all()
    cache._end(second)
    assert not cache._flying and not cache.directory.pin_counts().any()
    # only batches in flight hold slots: a finished batch's slots are evicted as usual
    before = cache.stats()["not_admitted"]
    out = np.empty((8, width), dtype=np.uint8)
    cache.read_rows(layout, np.arange(42, 50, dtype=np.int64), out)
    assert cache.stats()["not_admitted"] == before

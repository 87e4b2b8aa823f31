"""sdm.store.pooled.PooledCache against a dict model of the same policy and against direct pooling.

The model (:class:`RefPooledCache`) is an OrderedDict CLOCK over byte-charged entries: the
cache must agree with it exactly (counters, resident keys in log order), and every batch it
serves must be bitwise equal to pooling every bag directly with ``sdm.kernels.pooling.pool``.
"""

from __future__ import annotations

import os
import runpy
import sys
import threading
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdm.errors import ConfigError, InvalidArgumentError, InvalidOffsetsError
from sdm.kernels.pooled import entry_bytes
from sdm.store.pooled import PooledCache
from sdm.kernels.pooling import pool

DIMS = (1, 3, 8)  # odd dims: the last vector word is half used
ROWS = 10
COUNTERS = ("bags", "empty", "cache_hits", "batch_repeats", "misses", "inserted", "evicted",
            "reinserted", "invalidated", "too_big")


def make_tables(seed=0):
    rng = np.random.default_rng(seed)
    # values spread over many binades, so a different summation order really rounds differently
    return [(rng.standard_normal((ROWS, d)) * 10.0 ** rng.integers(-4, 5, (ROWS, 1))).astype(np.float32)
            for d in DIMS]


TABLES = make_tables()


def csr(bags):
    indices = np.array([i for b in bags for i in b], dtype=np.int64)
    offsets = np.zeros(len(bags) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b) for b in bags])
    return indices, offsets


def direct(table, indices, offsets, mean):
    out = np.empty((offsets.shape[0] - 1, table.shape[1]), dtype=np.float32)
    return pool(table, indices, offsets, None, mean, "fp32", out)


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


class Recorder:
    """A ``pool_misses`` that pools from one table and records the bags it was asked for."""

    def __init__(self, table, mean):
        self.table, self.mean, self.calls = table, mean, []

    def __call__(self, sub_indices, sub_offsets, sub_out):
        assert sub_indices.dtype == np.int64 and sub_offsets.dtype == np.int64
        assert sub_out.shape == (sub_offsets.shape[0] - 1, self.table.shape[1])
        self.calls.append([tuple(sub_indices[a:b].tolist())
                           for a, b in zip(sub_offsets[:-1], sub_offsets[1:])])
        pool(self.table, sub_indices, sub_offsets, None, self.mean, "fp32", sub_out)


class RefPooledCache:
    """The obviously-correct model: OrderedDict key -> [charge, referenced], CLOCK eviction."""

    def __init__(self, capacity):
        self.cap = capacity
        self.od = OrderedDict()
        self.used = 0
        self.c = dict.fromkeys(COUNTERS, 0)

    def lookup(self, table_id, bags, mean, dim):
        """Count a batch; return the distinct missing keys in batch order."""
        seen, misses = set(), []
        for seq in bags:
            self.c["bags"] += 1
            if not seq:
                self.c["empty"] += 1
                continue
            key = (table_id, mean, dim, tuple(seq))
            if key in seen:
                self.c["batch_repeats"] += 1
            elif key in self.od:
                seen.add(key)
                self.od[key][1] = True
                self.c["cache_hits"] += 1
            else:
                seen.add(key)
                misses.append(key)
                self.c["misses"] += 1
        return misses

    def insert(self, misses):
        for key in misses:
            charge = entry_bytes(len(key[3]), key[2])
            if charge > self.cap:
                self.c["too_big"] += 1
                continue
            while self.used + charge > self.cap:
                old = next(iter(self.od))
                if self.od[old][1]:
                    self.od[old][1] = False
                    self.od.move_to_end(old)
                    self.c["reinserted"] += 1
                else:
                    self.used -= self.od.pop(old)[0]
                    self.c["evicted"] += 1
            self.od[key] = [charge, False]
            self.used += charge
            self.c["inserted"] += 1

    def invalidate(self, table_id):
        gone = [k for k in self.od if k[0] == table_id]
        for k in gone:
            self.used -= self.od.pop(k)[0]
        self.c["invalidated"] += len(gone)

    def clear(self):
        self.od.clear()
        self.used = 0


def agree(cache, ref):
    s = cache.stats()
    for name in COUNTERS:
        assert s[name] == ref.c[name], (name, s, ref.c)
    assert s["hits"] == s["cache_hits"] + s["batch_repeats"]
    assert s["bytes_used"] == ref.used <= cache.capacity_bytes
    assert s["entries"] == len(ref.od) == len(cache)
    resident = cache.entries()
    assert [(t, m, d, ids) for t, m, d, ids, _ in resident] == list(ref.od)
    for t, m, d, ids, vec in resident:  # every stored vector is the directly pooled one
        want = direct(TABLES[t], np.array(ids, np.int64), np.array([0, len(ids)], np.int64), m)[0]
        assert np.array_equal(bits(vec), bits(want))
    cache.check_invariants()


def serve(cache, ref, table_id, bags, mean):
    table = TABLES[table_id]
    indices, offsets = csr(bags)
    out = np.full((len(bags), table.shape[1]), np.nan, dtype=np.float32)
    rec = Recorder(table, mean)
    misses = ref.lookup(table_id, bags, mean, table.shape[1])
    got = cache.pool(table_id, indices, offsets, mean, rec, out)
    assert got is out
    assert np.array_equal(bits(out), bits(direct(table, indices, offsets, mean)))
    if cache.capacity_bytes == 0:
        assert rec.calls == ([[tuple(b) for b in bags]] if bags else [])
    else:
        assert rec.calls == ([[k[3] for k in misses]] if misses else [])
        ref.insert(misses)
    return rec


# -- hypothesis: random programs against the model ------------------------------------------------

seqs = st.lists(st.integers(0, ROWS - 1), max_size=5)
ops = st.one_of(
    st.tuples(st.just("pool"), st.integers(0, len(DIMS) - 1), st.booleans(),
              st.lists(st.integers(0, 11), max_size=12)),
    st.tuples(st.just("invalidate"), st.integers(0, len(DIMS) - 1)),
    st.tuples(st.just("clear")),
)


# cheap examples (~10 ms): explore three times the profile's default
@settings(max_examples=3 * settings.default.max_examples)
@given(capacity=st.one_of(st.sampled_from([1, 79, 80, 200, 1000]), st.integers(1, 3000)),
       hash_bits=st.sampled_from([63, 3, 0]),
       vocab=st.lists(seqs, min_size=1, max_size=12),
       program=st.lists(ops, max_size=14))
def test_matches_model_and_direct_pooling(capacity, hash_bits, vocab, program):
    cache = PooledCache(capacity, _hash_bits=hash_bits)
    ref = RefPooledCache(capacity)
    for op in program:
        if op[0] == "pool":
            _, t, mean, picks = op
            serve(cache, ref, t, [vocab[p % len(vocab)] for p in picks], mean)
        elif op[0] == "invalidate":
            assert cache.invalidate(op[1]) == sum(k[0] == op[1] for k in ref.od)
            ref.invalidate(op[1])
        else:
            cache.clear()
            ref.clear()
        agree(cache, ref)


@settings(max_examples=2 * settings.default.max_examples)
@given(capacity=st.integers(300, 1500), hash_bits=st.sampled_from([63, 0]),
       vocab=st.lists(st.lists(st.integers(0, ROWS - 1), min_size=1, max_size=8),
                      min_size=4, max_size=24),
       batches=st.lists(st.lists(st.integers(0, 23), max_size=6), min_size=1, max_size=30))
def test_log_wraps_and_evicts_like_the_model(capacity, hash_bits, vocab, batches):
    # many inserts of a working set larger than a small log: entries wrap past the end of the
    # ring, get hits, second chances (moves to the head) and evictions
    cache = PooledCache(capacity, _hash_bits=hash_bits)
    ref = RefPooledCache(capacity)
    for i, picks in enumerate(batches):
        bags = [vocab[p % len(vocab)] for p in picks]
        serve(cache, ref, i % 2, bags + bags[:2], False)
        agree(cache, ref)


# -- the properties the brief names, one by one -----------------------------------------------

def test_repeated_batch_is_served_from_the_cache():
    cache = PooledCache(1 << 20)
    bags = [[1, 2, 3], [4, 5], [1, 2, 3], [], [9]]
    indices, offsets = csr(bags)
    out = np.empty((5, 8), np.float32)
    first = Recorder(TABLES[2], False)
    cache.pool(2, indices, offsets, False, first, out)
    assert first.calls == [[(1, 2, 3), (4, 5), (9,)]]
    s = cache.stats()
    assert (s["misses"], s["batch_repeats"], s["cache_hits"], s["empty"]) == (3, 1, 0, 1)
    again = Recorder(TABLES[2], False)
    out2 = np.empty_like(out)
    cache.pool(2, indices, offsets, False, again, out2)
    assert again.calls == []  # never called: every bag came from the cache
    assert np.array_equal(bits(out2), bits(out))
    s = cache.stats()
    assert (s["cache_hits"], s["batch_repeats"], s["hits"], s["misses"]) == (3, 2, 5, 3)
    assert s["hit_rate"] == 5 / 8


def test_key_is_the_exact_sequence_not_the_multiset():
    table = np.array([[1e8], [1.0], [-1e8]], dtype=np.float32)
    cache = PooledCache(4096)
    bags = [[0, 1, 2], [0, 2, 1], [0, 1, 2]]  # same multiset; float32 sums 0.0 and 1.0
    indices, offsets = csr(bags)
    out = np.empty((3, 1), np.float32)
    for _ in range(2):
        cache.pool(0, indices, offsets, False, Recorder(table, False), out)
        assert out[:, 0].tolist() == [0.0, 1.0, 0.0]
    assert len(cache) == 2


def test_mode_and_table_are_part_of_the_key():
    cache = PooledCache(1 << 16)
    bags = [[1, 2], [3]]
    indices, offsets = csr(bags)
    for t in range(len(DIMS)):
        for mean in (False, True):
            out = np.empty((2, DIMS[t]), np.float32)
            rec = Recorder(TABLES[t], mean)
            cache.pool(t, indices, offsets, mean, rec, out)
            assert rec.calls == [[(1, 2), (3,)]]
            assert np.array_equal(bits(out), bits(direct(TABLES[t], indices, offsets, mean)))
    assert len(cache) == 2 * 2 * len(DIMS)
    assert cache.stats()["bytes_used"] == sum(2 * (entry_bytes(2, d) + entry_bytes(1, d)) for d in DIMS)
    cache.check_invariants()


def test_invalidate_drops_exactly_one_table():
    cache = PooledCache(1 << 16)
    ref = RefPooledCache(1 << 16)
    bags = [[i, (i + 1) % ROWS] for i in range(ROWS)]
    for t in range(len(DIMS)):
        serve(cache, ref, t, bags, False)
    before = cache.entries()
    assert cache.invalidate(1) == ROWS
    ref.invalidate(1)
    agree(cache, ref)
    assert [e[:4] for e in cache.entries()] == [e[:4] for e in before if e[0] != 1]
    rec = serve(cache, ref, 1, bags, False)  # table 1 is pooled afresh, the others still hit
    assert len(rec.calls[0]) == ROWS
    assert serve(cache, ref, 0, bags, False).calls == []
    assert cache.invalidate(1) == ROWS and cache.invalidate(7) == 0


def test_invalidating_rows_drops_exactly_the_bags_holding_them():
    cache = PooledCache(1 << 16)
    bags = [[i, (i + 1) % ROWS] for i in range(ROWS)]
    ref = RefPooledCache(1 << 16)
    for t in range(len(DIMS)):
        serve(cache, ref, t, bags, False)
    before = cache.entries()
    changed = [2, 5]
    doomed = {tuple(b) for b in bags if set(b) & set(changed)}
    assert cache.invalidate(1, changed) == len(doomed)
    kept = [e[:4] for e in before if not (e[0] == 1 and tuple(e[3]) in doomed)]
    assert [e[:4] for e in cache.entries()] == kept
    cache.check_invariants()
    assert cache.invalidate(1, []) == 0 and cache.invalidate(0, [10**9]) == 0


def test_oversized_bag_is_served_but_not_cached():
    cap = entry_bytes(3, 8)
    cache = PooledCache(cap)
    ref = RefPooledCache(cap)
    serve(cache, ref, 2, [[1, 2, 3, 4], [1, 2, 3], [1, 2, 3, 4]], True)
    agree(cache, ref)
    s = cache.stats()
    assert (s["too_big"], s["inserted"], s["bytes_used"]) == (1, 1, cap)


def test_collisions_never_return_a_wrong_vector():
    # every key hashes to 0: lookups must tell the bags apart by their ids alone
    cache = PooledCache(1 << 20, _hash_bits=0)
    rng = np.random.default_rng(3)
    bags = [rng.integers(0, ROWS, rng.integers(1, 6)).tolist() for _ in range(300)]
    indices, offsets = csr(bags)
    want = direct(TABLES[1], indices, offsets, False)
    distinct = len({tuple(b) for b in bags})
    for _ in range(2):
        out = np.empty_like(want)
        cache.pool(1, indices, offsets, False, Recorder(TABLES[1], False), out)
        assert np.array_equal(bits(out), bits(want))
    assert len(cache) == distinct
    assert cache.stats()["cache_hits"] == distinct
    cache.check_invariants()


def test_invalidate_while_pooling_does_not_insert_stale_vectors():
    cache = PooledCache(1 << 16)
    indices, offsets = csr([[1, 2], [3]])
    rec = Recorder(TABLES[0], False)

    def pool_and_invalidate(si, so, sub_out):
        rec(si, so, sub_out)
        cache.invalidate(0)  # the rows changed while this batch was pooling (lock not held)

    cache.pool(0, indices, offsets, False, pool_and_invalidate, np.empty((2, 1), np.float32))
    assert len(cache) == 0 and cache.stats()["inserted"] == 0
    cache.check_invariants()


def test_keys_inserted_while_pooling_are_not_inserted_twice():
    # another call inserts the same bags while this one pools (the lock is not held then)
    cache = PooledCache(1 << 16)
    indices, offsets = csr([[1, 2], [3], [4, 5, 6]])
    rec = Recorder(TABLES[0], False)

    def pool_and_race(si, so, sub_out):
        rec(si, so, sub_out)
        if len(rec.calls) == 1:
            cache.pool(0, indices[:3], offsets[:3], False, rec, np.empty((2, 1), np.float32))

    out = np.empty((3, 1), np.float32)
    cache.pool(0, indices, offsets, False, pool_and_race, out)
    assert np.array_equal(bits(out), bits(direct(TABLES[0], indices, offsets, False)))
    assert len(cache) == 3 and cache.stats()["inserted"] == 3
    cache.check_invariants()


def test_pool_misses_error_leaves_the_cache_sound():
    cache = PooledCache(1 << 16)
    indices, offsets = csr([[1, 2], [3]])

    def broken(si, so, sub_out):
        raise RuntimeError("device gone")

    with pytest.raises(RuntimeError):
        cache.pool(0, indices, offsets, False, broken, np.empty((2, 1), np.float32))
    assert len(cache) == 0
    cache.check_invariants()


def test_int32_indices_and_empty_batch():
    cache = PooledCache(4096)
    indices, offsets = csr([[1, 2], [2]])
    out = np.empty((2, 3), np.float32)
    cache.pool(1, indices.astype(np.int32), offsets, True, Recorder(TABLES[1], True), out)
    assert np.array_equal(bits(out), bits(direct(TABLES[1], indices, offsets, True)))
    rec = Recorder(TABLES[1], True)
    cache.pool(1, np.empty(0, np.int64), np.zeros(1, np.int64), True, rec, np.empty((0, 3), np.float32))
    assert rec.calls == []


def test_two_threads_hammering_one_cache():
    cache = PooledCache(6000)  # small: constant eviction and second chances under contention
    rng = np.random.default_rng(7)
    vocab = [rng.integers(0, ROWS, rng.integers(0, 7)).tolist() for _ in range(60)]
    errors = []

    def work(seed):
        r = np.random.default_rng(seed)
        try:
            for i in range(300):
                t = int(r.integers(len(DIMS)))
                mean = bool(r.integers(2))
                bags = [vocab[j] for j in r.integers(0, len(vocab), r.integers(1, 40))]
                indices, offsets = csr(bags)
                out = np.empty((len(bags), DIMS[t]), np.float32)
                cache.pool(t, indices, offsets, mean, Recorder(TABLES[t], mean), out)
                if not np.array_equal(bits(out), bits(direct(TABLES[t], indices, offsets, mean))):
                    errors.append((seed, i))
                if i % 50 == 49:
                    cache.invalidate(t)  # rows unchanged, so results stay checkable
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in (1, 2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    cache.check_invariants()
    s = cache.stats()
    assert s["hits"] + s["misses"] + s["empty"] == s["bags"]
    assert s["cache_hits"] > 0 and s["evicted"] > 0 and s["bytes_used"] <= 6000


# -- bad arguments -------------------------------------------------------------------------------

@pytest.mark.parametrize("cap", [0, -1, 1.5, True, "1024", None, 2**47])
def test_bad_capacity(cap):
    with pytest.raises(ConfigError, match="capacity_bytes"):
        PooledCache(cap)


def test_bad_batches():
    cache = PooledCache(4096)
    indices, offsets = csr([[1, 2], [3]])
    out = np.empty((2, 3), np.float32)
    rec = Recorder(TABLES[1], False)
    with pytest.raises(InvalidArgumentError, match="table_id"):
        cache.pool(-1, indices, offsets, False, rec, out)
    with pytest.raises(InvalidArgumentError, match="table_id"):
        cache.pool(True, indices, offsets, False, rec, out)
    with pytest.raises(InvalidArgumentError, match="mean"):
        cache.pool(1, indices, offsets, "sum", rec, out)
    with pytest.raises(InvalidArgumentError, match="callable"):
        cache.pool(1, indices, offsets, False, None, out)
    with pytest.raises(InvalidArgumentError, match="1-D"):
        cache.pool(1, indices.reshape(1, -1), offsets, False, rec, out)
    with pytest.raises(InvalidArgumentError, match="integer"):
        cache.pool(1, indices.astype(np.float64), offsets, False, rec, out)
    with pytest.raises(InvalidOffsetsError, match="offsets"):
        cache.pool(1, indices, np.array([0, 2], np.int64), False, rec, out)
    with pytest.raises(InvalidArgumentError, match=r"\(2, dim >= 1\) float32"):
        cache.pool(1, indices, offsets, False, rec, np.empty((3, 3), np.float32))
    with pytest.raises(InvalidArgumentError, match="float32"):
        cache.pool(1, indices, offsets, False, rec, np.empty((2, 3), np.float64))
    with pytest.raises(InvalidArgumentError, match="table_id"):
        cache.invalidate(2**31)
    assert rec.calls == [] and cache.stats()["bags"] == 0


# -- the benchmark runs at toy size --------------------------------------------------------------

def test_bench_pooled_quick(capsys, monkeypatch):
    bench = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "bench_pooled.py")
    monkeypatch.setattr(sys, "argv", ["bench_pooled.py", "--quick"])
    monkeypatch.syspath_prepend(os.path.dirname(bench))  # as running the script would (bench/machine.py)
    with pytest.raises(SystemExit) as done:
        runpy.run_path(bench, run_name="__main__")
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "| direct |" in out and "| pooled-cache" in out and "commit" in out

"""Cache policies: differential tests against the pure-Python references and cachetools,
golden miss counts on a committed trace, the store-facing Cache API, validation."""

from __future__ import annotations

import functools
import os

import cachetools
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sdm
from sdm.kernels.jit import jit
from sdm.errors import InvalidArgumentError
from sdm.kernels import policies as K
from sdm.kernels.policies import NEVER, access_one
from sdm.policies import Admission, Cache, simulate

from reference_policies import reference_hits

DATA = os.path.join(os.path.dirname(__file__), "data")

# Small alphabets force reuse and evictions; the multiplier makes ids sparse 64-bit values.
traces = st.lists(st.integers(0, 24), min_size=0, max_size=300).map(
    lambda xs: np.array(xs, dtype=np.int64) * 1_000_000_007 + 3)
capacities = st.integers(1, 12)


@pytest.mark.parametrize("policy", sdm.POLICIES)
@settings(max_examples=30)
@given(keys=traces, capacity=capacities)
def test_hit_mask_equals_reference(policy, keys, capacity):
    r = simulate(keys, policy=policy, capacity=capacity, return_mask=True)
    assert r.hit_mask.tolist() == reference_hits(keys, policy, capacity)
    assert r.hits + r.misses == len(keys) == r.requests


@pytest.mark.parametrize("admission", ["threshold", "tinylfu"])
@pytest.mark.parametrize("policy", ["lru", "fifo", "clock", "sieve", "s3fifo", "arc", "lfu"])
@settings(max_examples=15)
@given(keys=traces, capacity=capacities)
def test_admission_equals_reference(policy, admission, keys, capacity):
    r = simulate(keys, policy=policy, capacity=capacity, admission=admission, return_mask=True)
    assert r.hit_mask.tolist() == reference_hits(keys, policy, capacity, admission=admission)


@settings(max_examples=20)
@given(keys=traces, capacity=capacities, k=st.integers(1, 4), history=st.integers(1, 10))
def test_threshold_parameters_equal_reference(keys, capacity, k, history):
    adm = Admission("threshold", threshold=k, history=history)
    r = simulate(keys, policy="lru", capacity=capacity, admission=adm, return_mask=True)
    want = reference_hits(keys, "lru", capacity, admission="threshold", threshold=k, history=history)
    assert r.hit_mask.tolist() == want


def _cachetools_hits(cache, keys):
    out = []
    for k in keys.tolist():
        if k in cache:
            cache[k]  # a read: LRUCache promotes, FIFOCache does not
            out.append(True)
        else:
            out.append(False)
            cache[k] = True
    return out


@settings(max_examples=40)
@given(keys=traces, capacity=capacities)
def test_equals_cachetools(keys, capacity):
    for policy, cls in (("lru", cachetools.LRUCache), ("fifo", cachetools.FIFOCache)):
        r = simulate(keys, policy=policy, capacity=capacity, return_mask=True)
        assert r.hit_mask.tolist() == _cachetools_hits(cls(maxsize=capacity), keys)


@pytest.mark.parametrize("policy", sdm.POLICIES)
@settings(max_examples=20)
@given(keys=traces, capacity=capacities, cuts=st.lists(st.integers(0, 300), max_size=6))
def test_batched_access_equals_simulate(policy, keys, capacity, cuts):
    """The live cache (batches through Cache.access) counts the same hits as the simulator."""
    want = simulate(keys, policy=policy, capacity=capacity, return_mask=True).hit_mask
    nu = sdm.policies.next_use(keys)
    cache = Cache(capacity, policy)
    bounds = sorted({0, len(keys), *[min(c, len(keys)) for c in cuts]})
    got = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        res = cache.access(keys[a:b], next_use=nu[a:b] if policy == "belady" else None)
        got.extend(res.hit.tolist())
        # every key ends in the slot reported for it, until a later request evicts it
        assert np.all((res.slot >= 0) | ~res.hit)
    cache.check_invariants()
    assert got == want.tolist()
    # slots map back to keys
    sk = cache.slot_keys()
    resident = sk[sk >= 0]
    assert np.array_equal(sk[cache.lookup(resident)], resident)
    assert len(cache) == resident.size <= capacity


# Golden miss counts on the committed trace (3000 requests, Zipf 1.1 over 400 keys, seed
# 20261130), computed once from tests/reference_policies.py.
GOLDEN = {
    "lru": (2344, 1583, 815), "fifo": (2429, 1752, 962), "clock": (2307, 1523, 776),
    "lfu": (1833, 1278, 695), "sieve": (2022, 1217, 695), "s3fifo": (1858, 1254, 704),
    "arc": (2046, 1323, 720), "random": (2394, 1743, 923), "belady": (1707, 982, 476),
}


@pytest.mark.parametrize("policy", sdm.POLICIES)
def test_golden_miss_counts(policy):
    keys = np.load(os.path.join(DATA, "policies_golden_trace.npy"), allow_pickle=False)
    assert keys.shape == (3000,)
    got = tuple(simulate(keys, policy=policy, capacity=c).misses for c in (5, 20, 80))
    assert got == GOLDEN[policy]


def test_belady_is_a_lower_bound_on_golden_trace():
    for i in range(3):
        assert GOLDEN["belady"][i] == min(v[i] for v in GOLDEN.values())


def test_policies_public():
    assert set(("lru", "fifo", "clock", "lfu", "sieve", "s3fifo", "belady")) <= set(sdm.POLICIES)
    assert "arc" in sdm.POLICIES and "random" in sdm.POLICIES


def test_random_is_seeded():
    keys = np.random.default_rng(0).integers(0, 50, 2000)
    a = simulate(keys, policy="random", capacity=10, seed=1, return_mask=True).hit_mask
    b = simulate(keys, policy="random", capacity=10, seed=1, return_mask=True).hit_mask
    c = simulate(keys, policy="random", capacity=10, seed=2, return_mask=True).hit_mask
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_large_64bit_keys():
    keys = np.array([2**62, 2**63 - 1, 5, 2**62, 2**63 - 1, 5], dtype=np.int64)
    r = simulate(keys, policy="lru", capacity=3, return_mask=True)
    assert r.hit_mask.tolist() == [False] * 3 + [True] * 3
    r = simulate(keys.astype(np.uint64), policy="lru", capacity=3)
    assert r.hits == 3


# ------------------------------------------------------------------ store-facing Cache


def test_access_reports_slots_and_evictions():
    cache = Cache(2, "lru")
    r = cache.access([10, 20, 10, 30])
    assert r.hit.tolist() == [False, False, True, False]
    assert r.slot.tolist() == [0, 1, 0, 1]
    assert r.evicted.tolist() == [-1, -1, -1, 20]
    assert cache.lookup([10, 20, 30]).tolist() == [0, -1, 1]
    assert 10 in cache and 20 not in cache
    assert cache.stats() == {"requests": 4, "hits": 1, "misses": 3, "evictions": 1, "rejects": 0}


@pytest.mark.parametrize("policy", [p for p in sdm.POLICIES if p != "belady"])
def test_pinned_slots_are_never_evicted(policy):
    rng = np.random.default_rng(1)
    cache = Cache(8, policy)
    first = cache.access(np.arange(8))
    pinned = first.slot[:3]
    cache.pin(pinned)
    keys = rng.integers(100, 200, 500)
    r = cache.access(keys)
    assert not np.isin(r.slot[~r.hit], pinned).any()
    assert cache.lookup([0, 1, 2]).tolist() == pinned.tolist()
    cache.check_invariants()
    cache.unpin(pinned)
    cache.access(rng.integers(300, 400, 500))
    assert (cache.lookup([0, 1, 2]) == -1).all()


@pytest.mark.parametrize("policy", ["lru", "fifo", "clock", "sieve", "s3fifo", "arc", "lfu", "random"])
def test_all_pinned_means_not_admitted(policy):
    cache = Cache(3, policy)
    r = cache.access([1, 2, 3])
    cache.pin(r.slot)
    cache.pin(r.slot)  # counts: two pins need two unpins
    r2 = cache.access([4, 5])
    assert r2.slot.tolist() == [-1, -1] and r2.evicted.tolist() == [-1, -1]
    cache.unpin(r.slot)
    assert cache.access([6]).slot.tolist() == [-1]
    cache.unpin(r.slot)
    assert cache.access([7]).slot[0] >= 0
    assert cache.pin_counts().tolist() == [0, 0, 0]


@pytest.mark.parametrize("policy", [p for p in sdm.POLICIES if p != "belady"])
def test_remove_frees_slots(policy):
    cache = Cache(4, policy)
    r = cache.access([1, 2, 3, 4])
    freed = cache.remove([2, 99])
    assert freed.tolist() == [r.slot[1], -1]
    assert len(cache) == 3 and 2 not in cache
    r2 = cache.access([5])
    assert r2.slot.tolist() == [r.slot[1]] and r2.evicted.tolist() == [-1]
    cache.check_invariants()
    cache.access(np.arange(10, 60))
    cache.check_invariants()
    # removing a pinned key also drops its pins: the freed slot is evictable again
    s = int(cache.lookup([59])[0])
    cache.pin([s])
    cache.remove([59])
    assert cache.pin_counts()[s] == 0


def test_tinylfu_keeps_hot_keys_against_a_scan():
    rng = np.random.default_rng(0)
    hot = rng.integers(0, 50, 20000)
    scan = np.arange(1000, 21000)
    keys = np.empty(40000, dtype=np.int64)
    keys[0::2], keys[1::2] = hot, scan
    plain = simulate(keys, policy="lru", capacity=60).hits
    tiny = simulate(keys, policy="lru", capacity=60, admission="tinylfu").hits
    assert tiny > plain


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize("kwargs, match", [
    (dict(policy="lru2", capacity=4), "policy 'lru2' is not one of"),
    (dict(policy="lru", capacity=0), r"capacity must be an integer in \[1, 2147483647\], got 0"),
    (dict(policy="lru", capacity=-3), "capacity .*got -3"),
    (dict(policy="lru", capacity=2.5), "capacity must be an integer"),
    (dict(policy="lru", capacity=4, admission="bloom"), "admission 'bloom'"),
])
def test_simulate_rejects_bad_arguments(kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        simulate([1, 2, 3], **kwargs)


@pytest.mark.parametrize("keys, match", [
    (np.array([1.0, 2.0]), "integer dtype"),
    (np.array([True, False]), "integer dtype"),
    (np.array([1, -5]), r"keys -5 is negative \(valid: >= 0\)"),
    (np.zeros((2, 2), dtype=np.int64), "1-D"),
    (np.array([2**64 - 1], dtype=np.uint64), "above the largest id 9223372036854775807"),
])
def test_simulate_rejects_bad_keys(keys, match):
    with pytest.raises(InvalidArgumentError, match=match):
        simulate(keys, policy="lru", capacity=2)


@pytest.mark.parametrize("policy", ["fifo", "lru", "belady"])
def test_a_negative_key_deep_in_a_stream_is_refused_whatever_the_policy(policy):
    # simulate checks the sign as it replays (one pass over the keys, not two): a negative
    # key is named however far in (the first one met; belady's next-use pass names the
    # smallest), and no result comes back
    keys = np.arange(10_000, dtype=np.int64) % 97
    keys[7_000] = -3
    keys[9_000] = -8
    with pytest.raises(InvalidArgumentError, match=r"keys -[38] is negative \(valid: >= 0\)"):
        simulate(keys, policy=policy, capacity=16)


def test_a_live_cache_refuses_a_negative_key_before_serving_any():
    cache = Cache(4, "lru")
    cache.access([1, 2])
    before = [a.copy() for a in cache._state]
    with pytest.raises(InvalidArgumentError, match="keys -1 is negative"):
        cache.access([3, 4, -1])
    assert all(np.array_equal(a, b) for a, b in zip(before, cache._state))
    assert cache.access([3]).hit.tolist() == [False]


def test_errors_are_value_errors():
    with pytest.raises(ValueError):
        simulate([1], policy="nope", capacity=1)


def test_cache_validation():
    with pytest.raises(InvalidArgumentError, match="needs next_use"):
        Cache(2, "belady").access([1, 2])
    with pytest.raises(InvalidArgumentError, match="slot 5 is out of range"):
        Cache(2).pin([5])
    with pytest.raises(InvalidArgumentError, match="next_use must be"):
        Cache(2, "belady").access([1, 2], next_use=[1])
    with pytest.raises(InvalidArgumentError, match="threshold must be"):
        Admission("threshold", threshold=0)


def test_empty_trace():
    r = simulate(np.empty(0, dtype=np.int64), policy="arc", capacity=3, return_mask=True)
    assert (r.hits, r.misses, r.miss_ratio, r.hit_mask.shape) == (0, 0, 0.0, (0,))
    assert simulate([], policy="lru", capacity=1).requests == 0


@pytest.mark.parametrize("policy", sdm.POLICIES)
@pytest.mark.parametrize("admission", [None, "threshold", "tinylfu"])
def test_random_operations_keep_invariants(policy, admission):
    """access / remove / pin / unpin in any order: the state stays consistent, pinned keys
    stay, and every reported slot really holds its key right after the call."""
    rng = np.random.default_rng(abs(hash((policy, admission))) % 2**32)
    cache = Cache(16, policy, admission=admission)
    pinned = {}
    for step in range(300):
        op = rng.integers(0, 10)
        if op < 6:
            keys = rng.integers(0, 60, int(rng.integers(1, 20)))
            nu = (np.full(keys.shape, sdm.kernels.policies.NEVER) - rng.integers(0, 1000, keys.shape)
                  if policy == "belady" else None)
            before = {k: int(cache.lookup([k])[0]) for k in pinned}
            r = cache.access(keys, next_use=nu)
            for k, s in before.items():
                assert cache.lookup([k])[0] == s  # pinned keys never move or leave
            last = {}
            for k, s in zip(keys.tolist(), r.slot.tolist()):
                if s >= 0:
                    last[s] = k
            sk = cache.slot_keys()
            for s, k in last.items():
                assert sk[s] == k
        elif op < 8:
            drop = [k for k in rng.integers(0, 60, 3).tolist() if k not in pinned]
            cache.remove(np.array(drop, dtype=np.int64))
        elif op == 8 and len(pinned) < 10:
            sk = cache.slot_keys()
            occupied = np.flatnonzero(sk >= 0)
            if occupied.size:
                s = int(rng.choice(occupied))
                if int(sk[s]) not in pinned:
                    cache.pin([s])
                    pinned[int(sk[s])] = s
        elif pinned:
            k = next(iter(pinned))
            cache.unpin([pinned.pop(k)])
        cache.check_invariants()


@pytest.mark.parametrize("admission", [None, "threshold", "tinylfu"])
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), capacity=capacities)
def test_the_live_caches_lru_log_decides_as_the_list(admission, seed, capacity):
    """A guarded (live) cache runs LRU on a recency log (LRU_LOG); under accesses, removals
    and pins in any order it must give the list's every hit, slot and eviction. Small caches
    and long requests compact the log often."""
    rng = np.random.default_rng(seed)
    logged = Cache(capacity, "lru", admission=admission, guarded=True)
    listed = Cache(capacity, "lru", admission=admission)
    assert (logged._code, listed._code) == (K.LRU_LOG, K.LRU) and logged.policy == "lru"
    for _ in range(60):
        op = rng.integers(0, 10)
        if op < 7:
            keys = rng.integers(0, 3 * capacity, int(rng.integers(1, 30)))
            for a, b in zip(logged.access(keys), listed.access(keys)):
                np.testing.assert_array_equal(a, b)
        elif op < 8:
            keys = rng.integers(0, 3 * capacity, 3)
            np.testing.assert_array_equal(logged.remove(keys), listed.remove(keys))
        else:
            occupied = np.flatnonzero(listed.slot_keys() >= 0)
            if occupied.size:
                s = [int(rng.choice(occupied))]
                for cache in (logged, listed):
                    cache.pin(s) if op == 8 else cache.unpin(s)
        np.testing.assert_array_equal(logged.slot_keys(), listed.slot_keys())
        logged.check_invariants()
    assert logged.stats() == listed.stats()


@jit(_nrt=False)
def _hit_tied(st, slots):
    K.hit_tied(st, slots, slots.shape[0])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), capacity=capacities)
def test_a_batch_of_tied_hits_decides_as_its_keys_in_order(seed, capacity):
    """Batches of distinct keys: one that only hits is logged tied, its slots in any order
    (hit_tied, as the live cache's one pass does); any other is served in ascending order.
    The list, served every batch in ascending order, must make the same choices, pins and
    compactions of the log included."""
    rng = np.random.default_rng(seed)
    logged = Cache(capacity, "lru", guarded=True)
    listed = Cache(capacity, "lru")
    for _ in range(80):
        keys = np.unique(rng.integers(0, (1 if rng.random() < 0.6 else 3) * capacity + 1,
                                      int(rng.integers(1, capacity + 2))))
        slots = logged.lookup(keys)
        if (slots >= 0).all():
            _hit_tied(logged._state, rng.permutation(slots).astype(np.int64))
            assert listed.access(keys).hit.all()
        else:
            for a, b in zip(logged.access(keys), listed.access(keys)):
                np.testing.assert_array_equal(a, b)
        if rng.random() < 0.2:
            occupied = np.flatnonzero(listed.slot_keys() >= 0)
            s = [int(rng.choice(occupied))]
            pin = rng.random() < 0.5 or not listed.pin_counts()[s[0]]
            for cache in (logged, listed):
                cache.pin(s) if pin else cache.unpin(s)
        np.testing.assert_array_equal(logged.slot_keys(), listed.slot_keys())
        logged.check_invariants()
    assert logged.stats() == listed.stats()


@functools.lru_cache(maxsize=None)
def _access_one_loop(policy):
    @jit
    def loop(st, adm, keys, out):  # the policy a constant, as the store's batch probe has it
        for i in range(keys.shape[0]):
            h, s, e = access_one(st, adm, keys[i], NEVER, policy)
            out[i] = h
        return out
    return loop


def test_access_one_from_another_kernel():
    """The per-request kernel the store's batch path inlines agrees with the simulator."""
    keys = np.load(os.path.join(DATA, "policies_golden_trace.npy"), allow_pickle=False)
    for policy in ("lru", "s3fifo"):
        cache = Cache(20, policy)
        loop = _access_one_loop(cache._code)
        got = loop(cache._state, cache._adm, keys, np.zeros(keys.shape[0], dtype=np.bool_))
        assert int((~got).sum()) == GOLDEN[policy][1]
        assert cache.stats()["misses"] == GOLDEN[policy][1]

"""sdm.kernels.dedup.unique_inverse against np.unique(return_inverse=True)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdm.errors import InvalidArgumentError
from sdm.kernels.dedup import compose, unique_inverse, unique_ranked

I64 = np.iinfo(np.int64)


def check(ids):
    u, inv = unique_inverse(ids)
    want_u, want_inv = np.unique(np.asarray(ids, dtype=np.int64), return_inverse=True)
    assert u.dtype == np.int64 and inv.dtype == np.int64
    assert np.array_equal(u, want_u)
    assert np.array_equal(inv, want_inv.reshape(-1))
    assert np.array_equal(u[inv], np.asarray(ids, dtype=np.int64))


@given(st.lists(st.integers(0, 50), max_size=300))
def test_small_alphabet(ids):
    check(np.asarray(ids, dtype=np.int64))


@given(st.lists(st.integers(I64.min, I64.max), max_size=200))
def test_full_int64_range(ids):
    # the radix sort works on key - min, which must wrap correctly over the whole range
    check(np.asarray(ids, dtype=np.int64))


@given(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=200), st.sampled_from(
    [np.int32, np.int64, np.uint32, np.int16]))
def test_dtypes(ids, dtype):
    info = np.iinfo(dtype)
    arr = np.clip(np.asarray(ids, dtype=np.int64), info.min, info.max).astype(dtype)
    check(arr)


@pytest.mark.parametrize("n", [0, 1, 2, 1000, 100_000])
def test_sizes_and_scratch_reuse(n):
    rng = np.random.default_rng(n)
    for _ in range(3):  # the per-thread hash scratch must come back clean every call
        check(rng.integers(0, max(1, n // 3), n))
        check(rng.integers(0, 10**9, n))
    check(np.arange(n)[::-1].copy())


def test_threads_do_not_share_scratch():
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, 5000, 20_000) for _ in range(8)]
    errors = []

    def work(b):
        try:
            for _ in range(20):
                check(b)
        except AssertionError as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(b,)) for b in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_bad_input():
    with pytest.raises(InvalidArgumentError, match="1-D"):
        unique_inverse(np.zeros((2, 2), np.int64))
    with pytest.raises(InvalidArgumentError, match="integer dtype"):
        unique_inverse(np.array([1.5]))
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        unique_inverse(np.array([2**64 - 1], dtype=np.uint64))
    u, inv = unique_inverse([])
    assert u.shape == (0,) and inv.shape == (0,)


@given(st.lists(st.integers(0, 60), max_size=300), st.integers(0, 2**40))
def test_unique_ranked_and_compose(ids, salt):
    ids = np.asarray(ids, dtype=np.int64)
    unique, inverse, rank = unique_ranked(ids)
    want_u = np.unique(ids)
    assert np.array_equal(unique, want_u)
    assert np.array_equal(unique[rank[inverse]], ids)
    # first-sight order: the distinct ids in inverse's positions appear as they first occur
    firsts = [int(v) for i, v in enumerate(ids.tolist()) if v not in ids[:i].tolist()]
    assert unique[rank].tolist() == firsts
    values = unique * 7 + salt  # any per-distinct-id value, mapped to each lookup
    assert np.array_equal(compose(values, rank, inverse), ids * 7 + salt)

"""Miss-ratio curves: exact LRU stack distances, SHARDS sampling, other policies."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sdm
from sdm.errors import InvalidArgumentError
from sdm.policies import lru_stack_distances_of

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
from bench_policies import zipf_trace  # noqa: E402


def _naive_stack_distances(keys):
    stack, out = [], []
    for k in keys.tolist():
        if k in stack:
            i = stack.index(k)
            out.append(len(stack) - i)
            del stack[i]
        else:
            out.append(0)
        stack.append(k)
    return out


@settings(max_examples=40)
@given(keys=st.lists(st.integers(0, 30), max_size=200).map(lambda x: np.array(x, dtype=np.int64)))
def test_stack_distances_equal_naive(keys):
    assert lru_stack_distances_of(keys).tolist() == _naive_stack_distances(keys)


@settings(max_examples=25)
@given(keys=st.lists(st.integers(0, 40), min_size=1, max_size=300).map(lambda x: np.array(x, dtype=np.int64)),
       caps=st.lists(st.integers(1, 50), min_size=1, max_size=6))
def test_lru_curve_equals_simulate(keys, caps):
    got = sdm.miss_ratio_curve(keys, caps)
    want = [sdm.simulate(keys, policy="lru", capacity=c).miss_ratio for c in caps]
    assert np.allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("policy", ["fifo", "clock", "sieve", "s3fifo", "arc", "lfu", "belady"])
def test_other_policies_curve_equals_simulate(policy):
    keys = zipf_trace(20_000, 2_000, 0.9, seed=1)
    caps = [10, 100, 500]
    got = sdm.miss_ratio_curve(keys, caps, policy=policy)
    want = [sdm.simulate(keys, policy=policy, capacity=c).miss_ratio for c in caps]
    assert got.tolist() == want


def test_curve_is_monotone_for_lru():
    keys = zipf_trace(50_000, 10_000, 0.9, seed=2)
    mr = sdm.miss_ratio_curve(keys, np.arange(1, 12_000, 500))
    assert np.all(np.diff(mr) <= 1e-12)


def test_shards_close_to_exact_small():
    keys = zipf_trace(1_000_000, 1_000_000, 0.8, seed=5)
    caps = np.array([10_000, 50_000, 200_000])
    exact = sdm.miss_ratio_curve(keys, caps)
    approx = sdm.miss_ratio_curve(keys, caps, sample_rate=0.1)
    assert np.abs(exact - approx).max() < 0.01
    # a 100% sample is the exact curve
    assert np.allclose(sdm.miss_ratio_curve(keys[:50_000], caps, sample_rate=1.0),
                       sdm.miss_ratio_curve(keys[:50_000], caps), rtol=0, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("alpha", [0.8, 1.05])
def test_shards_one_percent_on_10m_keys(alpha):
    """SHARDS at a 1% sample on 10M requests over 10M Zipf keys: within 0.01 of exact for
    caches of at least 10,000 keys (100 sampled slots; smaller caches see the variance of
    which hot keys land in the sample)."""
    keys = zipf_trace(10_000_000, 10_000_000, alpha, seed=1)
    caps = np.array([10_000, 100_000, 1_000_000, 3_000_000])
    exact = sdm.miss_ratio_curve(keys, caps)
    approx = sdm.miss_ratio_curve(keys, caps, sample_rate=0.01)
    assert np.abs(exact - approx).max() < 0.01


def test_curve_validation():
    with pytest.raises(InvalidArgumentError, match=r"capacity must be an integer in \[1, 2147483647\], got 0"):
        sdm.miss_ratio_curve([1, 2], [0, 3])
    with pytest.raises(InvalidArgumentError, match="sample_rate"):
        sdm.miss_ratio_curve([1, 2], [1], sample_rate=0.0)
    with pytest.raises(InvalidArgumentError, match="only defined for policy 'lru'"):
        sdm.miss_ratio_curve([1, 2], [1], policy="fifo", sample_rate=0.5)
    with pytest.raises(InvalidArgumentError, match="policy 'x'"):
        sdm.miss_ratio_curve([1, 2], [1], policy="x")
    assert sdm.miss_ratio_curve([], [1, 2]).tolist() == [0.0, 0.0]

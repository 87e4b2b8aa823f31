"""Batch dedup: the distinct ids of a batch and, for each lookup, which distinct id it is.

The store's miss path fetches each distinct row once and scatters it back through the
inverse. ``np.unique(ids, return_inverse=True)`` sorts all ``n`` ids (``O(n log n)``); a batch
has far fewer distinct ids than lookups (Zipf skew), so this kernel hashes every id once
(``O(n)``, open addressing in a power-of-two table at most half full) and sorts only the
``u`` distinct ones, with a radix sort (``O(u)`` per 11 bits of id span).
"""

from __future__ import annotations

import threading

import numpy as np

from sdm.kernels.bag import prefetch_row
from sdm.kernels.hashmap import GOLDEN
from sdm.kernels.jit import jit
from sdm.validate import as_int_array

__all__ = ["unique_inverse", "unique_ranked", "compose"]

_AHEAD = 16  # ids ahead whose table entry is prefetched


@jit
def _first_seen(ids, inverse, slot_uid, first):
    """Distinct ids in order of first sight ``(u,) int64``; ``inverse[i]`` = position of ``ids[i]`` there.

    ``slot_uid`` is int32 scratch of a power-of-two length >= 2n with every entry -1 on entry,
    and is left that way (only the touched entries are reset, so a call costs O(n), not
    O(scratch)); an entry holds a position in ``first`` (``(>= n,)`` int64 scratch), whose key
    the probe compares. 4 bytes an entry keep the table of a 30K-id batch in L2 (256 KB).
    """
    n = ids.shape[0]
    bits = 1
    while (1 << bits) < 2 * n:
        bits += 1
    mask = (1 << bits) - 1
    shift = np.uint64(64 - bits)
    u = 0
    for i in range(n):
        if i + _AHEAD < n:
            prefetch_row(slot_uid, np.int64((np.uint64(ids[i + _AHEAD]) * GOLDEN) >> shift), 1)
        key = np.int64(ids[i])
        # high bits of the product mix every input bit (low bits of sequential ids collide)
        h = np.int64((np.uint64(key) * GOLDEN) >> shift)  # Fibonacci hashing
        while True:
            s = slot_uid[h]
            if s < 0:
                slot_uid[h] = u
                first[u] = key
                inverse[i] = u
                u += 1
                break
            if first[s] == key:
                inverse[i] = s
                break
            h = (h + 1) & mask
    for r in range(u):  # reset the touched entries: find each distinct key's entry again
        h = np.int64((np.uint64(first[r]) * GOLDEN) >> shift)
        while slot_uid[h] != r:
            h = (h + 1) & mask
        slot_uid[h] = -1
    return first[:u].copy()


_RADIX_BITS = 11  # 2048 buckets: the counts stay in L1


@jit
def _sorted_with_rank(distinct):
    """Sort ``distinct`` ``(u,) int64`` ascending with an LSD radix sort over ``key - min`` (only
    as many 11-bit passes as the key span needs, two for ids below 4M). Returns the sorted ids
    and ``rank``: ``rank[r]`` = sorted position of ``distinct[r]``."""
    u = distinct.shape[0]
    if u == 0:
        return distinct.copy(), np.empty(0, dtype=np.int64)
    lo = distinct.min()
    span = np.uint64(distinct.max() - lo)
    keys = np.empty(u, dtype=np.uint64)
    vals = np.empty(u, dtype=np.int64)
    for i in range(u):
        keys[i] = np.uint64(distinct[i] - lo)
        vals[i] = i
    keys2 = np.empty(u, dtype=np.uint64)
    vals2 = np.empty(u, dtype=np.int64)
    nb = 1 << _RADIX_BITS
    digit_mask = np.uint64(nb - 1)
    count = np.empty(nb + 1, dtype=np.int64)
    shift = 0
    while shift < 64 and (span >> np.uint64(shift)) > 0:
        sh = np.uint64(shift)
        count[:] = 0
        for i in range(u):
            count[np.int64((keys[i] >> sh) & digit_mask) + 1] += 1
        for d in range(nb):
            count[d + 1] += count[d]
        for i in range(u):
            d = np.int64((keys[i] >> sh) & digit_mask)
            p = count[d]
            count[d] = p + 1
            keys2[p] = keys[i]
            vals2[p] = vals[i]
        keys, keys2 = keys2, keys
        vals, vals2 = vals2, vals
        shift += _RADIX_BITS
    rank = np.empty(u, dtype=np.int64)
    uniq = np.empty(u, dtype=np.int64)
    for r in range(u):
        rank[vals[r]] = r
        uniq[r] = np.int64(keys[r]) + lo
    return uniq, rank


@jit
def compose(values, rank, inverse):
    """``(n,) int64`` ``values[rank[inverse]]`` in one pass over ``inverse`` (``values`` and
    ``rank`` ``(u,)``): per lookup, the value of its distinct id, from the first-sight
    positions :func:`unique_ranked` returns."""
    u = rank.shape[0]
    by_first = np.empty(u, dtype=np.int64)
    for r in range(u):
        by_first[r] = values[rank[r]]
    out = np.empty(inverse.shape[0], dtype=np.int64)
    for i in range(inverse.shape[0]):
        out[i] = by_first[inverse[i]]
    return out


_local = threading.local()


def _scratch(n: int):
    """Per-thread scratch reused across calls: fresh multi-MB arrays per call cost more in page
    faults than the hashing itself. Kernels stay pure; the state lives here, one per thread."""
    size = 2
    while size < 2 * n:
        size *= 2
    have = getattr(_local, "arrays", None)
    if have is None or have[0].shape[0] < size or have[1].shape[0] < n:
        size = max(size, have[0].shape[0] if have else 0)
        cap = max(n, have[1].shape[0] if have else 0)
        have = (np.full(size, -1, np.int32), np.empty(cap, np.int64))
        _local.arrays = have
    return have


def unique_ranked(ids) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct ids in ascending order, with the inverse left in order of first sight.

    Args:
        ids: ``(n,)`` integer ids (any integer dtype; converted to int64).

    Returns:
        ``(unique, inverse, rank)``: ``unique`` ``(u,) int64`` ascending and distinct;
        ``inverse`` ``(n,) int64``: position of ``ids[i]`` among the distinct ids in order of
        first sight; ``rank`` ``(u,) int64``: the ascending position of each of those, so
        ``unique[rank[inverse]] == ids``. A caller that maps the distinct ids to values
        (slots) takes one pass over the lookups with :func:`compose`, where
        :func:`unique_inverse` spends two.

    Raises:
        InvalidArgumentError: ``ids`` is not 1-D or not integer.
    """
    ids = as_int_array(ids, "ids", keep_int32=True)
    n = ids.shape[0]
    inverse = np.empty(n, dtype=np.int64)
    distinct = _first_seen(ids, inverse, *_scratch(n))
    unique, rank = _sorted_with_rank(distinct)
    return unique, inverse, rank


def unique_inverse(ids) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ids in ascending order and the inverse map, like ``np.unique(ids, return_inverse=True)``.

    Args:
        ids: ``(n,)`` integer ids (any integer dtype; converted to int64).

    Returns:
        ``(unique, inverse)``: ``unique`` ``(u,) int64`` ascending and distinct; ``inverse``
        ``(n,) int64`` with ``unique[inverse] == ids``.

    Raises:
        InvalidArgumentError: ``ids`` is not 1-D or not integer.
    """
    unique, inverse, rank = unique_ranked(ids)
    return unique, _rerank(inverse, rank)


@jit
def _rerank(inverse, rank):
    """``inverse`` rewritten in place from first-sight positions to ascending ones."""
    for i in range(inverse.shape[0]):
        inverse[i] = rank[inverse[i]]
    return inverse

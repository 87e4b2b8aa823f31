"""Miss-ratio-curve kernels: LRU stack distances with a Fenwick tree, SHARDS sampling.

An LRU cache of ``c`` slots hits a request exactly when its stack distance (distinct keys
touched since the previous request for the same key, itself included) is at most ``c``
(Mattson et al. 1970), so one O(n log n) pass gives the exact LRU miss ratio at every size.
The Fenwick tree holds a 1 at the position of each key's latest request; the distance of a
re-reference is the number of ones after its previous position.
"""

from __future__ import annotations

import numpy as np

from sdm.kernels.jit import jit
from sdm.kernels.hashmap import hm_find, hm_insert, mix64

SAMPLE_BITS = 24
SAMPLE_MOD = 1 << SAMPLE_BITS


@jit
def lru_stack_distances(keys, table):
    """``(n,)`` int64 stack distance per request (1 = same key as the previous distinct
    access), 0 for a first reference. ``table``: empty hash map sized for the distinct
    keys."""
    n = keys.shape[0]
    tree = np.zeros(n + 1, dtype=np.int32)
    out = np.empty(n, dtype=np.int64)
    distinct = 0
    for i in range(n):
        k = keys[i]
        p = hm_find(table, k)
        if p >= 0:
            # ones in [0, p]: prefix sum; the rest of the `distinct` ones lie after p
            j = p + 1
            pre = 0
            while j > 0:
                pre += tree[j]
                j -= j & (-j)
            out[i] = distinct - pre + 1
            j = p + 1
            while j <= n:
                tree[j] -= 1
                j += j & (-j)
        else:
            out[i] = 0
            distinct += 1
        j = i + 1
        while j <= n:
            tree[j] += 1
            j += j & (-j)
        hm_insert(table, k, i)
    return out


@jit
def shards_sample(keys, threshold):
    """Boolean mask of requests whose key hashes below ``threshold`` out of 2**24
    (spatial sampling: a key is either always or never sampled)."""
    n = keys.shape[0]
    out = np.empty(n, dtype=np.bool_)
    mask = np.uint64(SAMPLE_MOD - 1)
    for i in range(n):
        out[i] = np.int64(mix64(keys[i]) & mask) < threshold
    return out

"""Open-addressing int64 key -> int64 value map as a Numba kernel.

State is one preallocated ``(2 * size,)`` int64 array ``table`` (``size`` a power of two):
entry ``i`` holds its key at ``table[2 * i]`` and its value at ``table[2 * i + 1]``, so one
probe touches one cache line. A free entry holds ``EMPTY`` (-1) as its key, which is why
keys must be non-negative. Linear probing from a Fibonacci hash of the key; deletion shifts
later entries of the cluster back (no tombstones), so lookups stay short after any number
of inserts and deletes. The caller sizes the table so it is never more than half full
(:func:`table_size_for`); the kernels trust that and never resize.
"""

from __future__ import annotations

import numpy as np

from numba.cpython.unsafe.numbers import leading_zeros
from numba.extending import overload

from sdm.kernels.jit import jit
from sdm.kernels.memory import huge_full

__all__ = ["EMPTY", "GOLDEN", "table_size_for", "make_hashmap_state", "hm_find", "hm_entry",
           "hm_value", "hm_put", "hm_insert",
           "hm_delete", "hm_clear", "hm_find_many", "hm_insert_many", "hm_delete_many",
           "mix64", "finalize64", "finalize64_many", "home_slot", "shift_back"]

EMPTY = -1
#: 2**64 / golden ratio: the multiplier of Fibonacci hashing (and splitmix64's increment).
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def table_size_for(max_entries: int, spread: int = 2) -> int:
    """Entries of a table that holds ``max_entries`` keys at load factor <= 1/spread."""
    size = 4
    while size < spread * max(int(max_entries), 1):
        size *= 2
    return size


def make_hashmap_state(max_entries: int, spread: int = 2) -> np.ndarray:
    """A new empty map for up to ``max_entries`` keys: ``(2 * size,)`` int64, all EMPTY.

    ``spread`` >= 2 is the inverse of the largest load factor; caches use 8 or 4 by their
    size (shorter probes and deletion shifts: ``sdm.kernels.policies._map_spread``),
    whole-trace maps 2."""
    return huge_full(2 * table_size_for(max_entries, spread), EMPTY, np.int64)  # probed at random


@jit
def finalize64(z):
    """splitmix64's finalizer: every bit of uint64 ``z`` mixed into every bit of the result."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@jit
def finalize64_many(z):
    """:func:`finalize64` of each element of a ``uint64`` array, a new array."""
    out = np.empty_like(z)
    for i in range(z.shape[0]):
        out[i] = finalize64(z[i])
    return out


@jit
def mix64(key):
    """splitmix64 of an int64 key: a well-mixed uint64 (sampling, sketches)."""
    return finalize64(np.uint64(key) + GOLDEN)


def top_shift(mask):
    """The right shift that keeps the top log2(mask + 1) bits of a uint64 (``mask`` a power of
    two minus 1, >= 1): 64 minus its bit length. Plain Python here, so ``NUMBA_DISABLE_JIT=1``
    still runs; compiled, the mask's leading-zero count (one instruction)."""
    return 64 - int(mask).bit_length()


@overload(top_shift)
def _ol_top_shift(mask):
    return lambda mask: leading_zeros(np.uint64(mask))


@jit
def home_slot(key, mask):
    """The entry a key hashes to in a table of ``mask + 1`` entries (a power of two, >= 2).

    Fibonacci hashing: the top log2(size) bits of key * golden, the well-mixed ones; the shift
    (:func:`top_shift`) is the mask's leading zeros, one instruction hoisted out of a kernel's
    loop. Bits 32.. under the mask, as before, clustered the DRAM cache's directory on an
    RM2-shaped batch stream (ids an affine map of Zipf ranks, 406K keys at load 0.19): 44% of
    keys sat past their home entry, against 12% with the top bits and 10% for random homes
    (bench/RESULTS.md)."""
    return np.int64((np.uint64(key) * GOLDEN) >> np.uint64(top_shift(mask)))


@jit
def _home(table, key):
    return home_slot(key, (table.shape[0] >> 1) - 1)


@jit
def shift_back(table, hole):
    """Empty entry ``hole`` of a linear-probing ``table`` (this module's layout, keys hashed
    by :func:`home_slot`) without tombstones: backward-shift deletion walks the rest of the
    cluster and moves back every entry whose home lies cyclically at or before the hole, so
    no probe sequence is broken."""
    mask = (table.shape[0] >> 1) - 1
    j = hole
    while True:
        j = (j + 1) & mask
        k = table[2 * j]
        if k == EMPTY:
            break
        home = home_slot(k, mask)
        if ((j - home) & mask) >= ((j - hole) & mask):
            table[2 * hole] = k
            table[2 * hole + 1] = table[2 * j + 1]
            hole = j
    table[2 * hole] = EMPTY
    table[2 * hole + 1] = EMPTY


@jit
def hm_find(table, key):
    """Value stored for ``key``, or -1 when absent."""
    mask = (table.shape[0] >> 1) - 1
    i = _home(table, key)
    while True:
        k = table[2 * i]
        if k == key:
            return table[2 * i + 1]
        if k == EMPTY:
            return -1
        i = (i + 1) & mask


@jit
def hm_entry(table, key):
    """The entry of ``key``: the one holding it, or the free entry that ends its probe, where
    an insert puts it. :func:`hm_value` reads it and :func:`hm_put` fills it, with no insert
    or delete in between (either may move entries), so a find followed by an insert probes
    once."""
    mask = (table.shape[0] >> 1) - 1
    i = _home(table, key)
    while True:
        k = table[2 * i]
        if k == key or k == EMPTY:
            return i
        i = (i + 1) & mask


@jit
def hm_value(table, entry):
    """Value at ``entry`` (:func:`hm_entry`): the key's value, or -1 when the entry is free."""
    return table[2 * entry + 1]


@jit
def hm_put(table, entry, key, value):
    """Store ``key -> value`` in the free ``entry`` that :func:`hm_entry` gave for ``key``."""
    table[2 * entry] = key
    table[2 * entry + 1] = value


@jit
def hm_insert(table, key, value):
    """Set ``key -> value`` (overwrites an existing value); returns True if ``key`` was new."""
    mask = (table.shape[0] >> 1) - 1
    i = _home(table, key)
    while True:
        k = table[2 * i]
        if k == key:
            table[2 * i + 1] = value
            return False
        if k == EMPTY:
            table[2 * i] = key
            table[2 * i + 1] = value
            return True
        i = (i + 1) & mask


@jit
def hm_delete(table, key):
    """Remove ``key``; returns its value, or -1 when absent."""
    mask = (table.shape[0] >> 1) - 1
    i = _home(table, key)
    while True:
        k = table[2 * i]
        if k == EMPTY:
            return -1
        if k == key:
            break
        i = (i + 1) & mask
    value = table[2 * i + 1]
    shift_back(table, i)
    return value


@jit
def hm_clear(table):
    """Empty the map in place."""
    table[:] = EMPTY


@jit
def hm_find_many(table, keys, out):
    """``out[i] = hm_find(table, keys[i])`` for a batch."""
    for i in range(keys.shape[0]):
        out[i] = hm_find(table, keys[i])
    return out


@jit
def hm_insert_many(table, keys, values):
    """Insert ``keys[i] -> values[i]`` in order; returns how many keys were new."""
    added = 0
    for i in range(keys.shape[0]):
        if hm_insert(table, keys[i], values[i]):
            added += 1
    return added


@jit
def hm_delete_many(table, keys, out):
    """``out[i] = hm_delete(table, keys[i])`` in order."""
    for i in range(keys.shape[0]):
        out[i] = hm_delete(table, keys[i])
    return out

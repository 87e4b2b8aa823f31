"""The pooled-embedding cache (the SDM paper's): pooled bag vectors reused across requests.

A ranking request scores one user against N candidate items, so the user-side bags of the
request (watch history, followed pages, ...) arrive N times, identical, within one batch and
again in the user's next request. Pooling such a bag once and reusing the vector saves every
row read and add behind it. :class:`PooledCache` holds those vectors for every table of a
store, bounded in bytes.

**The key is (table id, pooling mode, dim, the bag's exact id sequence)**, not the unordered
multiset of ids the paper describes: results must be bitwise identical with and without the
cache, and float32 addition is not associative, so the same ids summed in another order can
round to a different vector. Repeating bags (one user's features across the candidates of
one request) are identical sequences anyway, so nothing is lost in practice. The mode is in
the key because a mean and a sum of one bag are different vectors; the dim because an entry
carries its own width (tables of different dims share the cache). Weighted bags
(``per_sample_weights``) are never cached: the caller does not route them here.

**Exact verification**: a bag is looked up by a 63-bit hash of its key, but a hash match is
never trusted; the entry stores the whole id sequence and every id is compared.

**Bytes**: every entry is charged ``8 * (4 + n + ceil(dim / 2)) + 32`` bytes for a bag of
``n`` ids: a 4-word header (hash, table/mode/CLOCK bit, n, dim), the ids as int64, the
float32 vector rounded up to whole 8-byte words, and 32 bytes for its share of the hash
index. ``bytes_used`` (the sum of charges) never exceeds ``capacity_bytes``; a bag whose
entry alone would exceed it is not cached. Memory is allocated once, up front: the entry log
(``capacity_bytes``) and the index (at most ``0.8 * capacity_bytes``); it never grows.

**Eviction is CLOCK** over a circular log of variable-size entries (details in
:mod:`sdm.kernels.pooled`): entries are appended at the head; to make room the hand takes
the oldest entry, and gives a referenced one (hit since it last passed) a second chance by
clearing its bit and moving it to the head, else evicts it. The log stays contiguous, so a
byte freed at the tail is a byte usable at the head: no fragmentation, no compaction pass.

**Invalidation**: when a table's rows change, :meth:`PooledCache.invalidate` drops its
entries; a batch that was pooling that table's misses while the invalidation ran does not
insert them (its vectors may predate the change).
"""

from __future__ import annotations

import threading

import numpy as np

from sdm.errors import ConfigError, InvalidArgumentError
from sdm.kernels import pooled as K
from sdm.kernels.pooling import check_offsets
from sdm.validate import as_int_array, check_fits_memory, check_int

__all__ = ["PooledCache", "CHECK_MESSAGES", "MAX_CAPACITY_BYTES"]

MAX_TABLE_ID = 2**31 - 1
#: The largest pooled cache (its log and index are allocated up front).
MAX_CAPACITY_BYTES = 2**46

CHECK_MESSAGES = {
    1: "bytes_used exceeds capacity_bytes",
    2: "log bookkeeping (tail, used words, entry count) out of range",
    3: "an entry header is malformed or runs past the used part of the log",
    4: "an entry's stored hash does not match its key",
    5: "an entry cannot be found through the index at its position",
    6: "entry sizes do not add up to the used words of the log",
    7: "entry charges do not add up to bytes_used",
    8: "an index slot is not reachable from its home slot",
    9: "index slot count differs from the entry count",
}


_NO_IDS = np.empty(0, dtype=np.int64)


class PooledCache:
    """A byte-bounded cache of pooled bag vectors, shared by every table of a store.

    Args:
        capacity_bytes: the bound on the bytes charged to entries (see the module doc), in
            ``[1, MAX_CAPACITY_BYTES]`` (a store without a pooled cache builds none).

    Thread-safe: two threads may call :meth:`pool` (and the others) at once. The lock is
    released while the caller pools the misses, so the threads' pooling overlaps.
    """

    def __init__(self, capacity_bytes: int, *, _hash_bits: int = 63):
        self.capacity_bytes = check_int(capacity_bytes, "pooled cache capacity_bytes", lo=1,
                                        hi=MAX_CAPACITY_BYTES, error=ConfigError)
        # the ring holds the entries, the index at most 0.8 x as much again (module doc)
        check_fits_memory(int(1.8 * self.capacity_bytes), "pooled cache capacity_bytes (--pooled-cache-bytes)",
                          self.capacity_bytes, "a log and an index", error=ConfigError)
        _hash_bits = check_int(_hash_bits, "_hash_bits", lo=0, hi=63)
        # fewer hash bits = more collisions: the tests use it to prove exact verification
        self._hash_mask = (1 << _hash_bits) - 1
        (self._ring, self._ringf, self._index, self._meta,
         self._counters) = K.make_pooled_state(self.capacity_bytes, self._hash_mask)
        self._lock = threading.Lock()
        self._epoch = 0  # bumped by invalidate/clear: batches pooling across it do not insert
        self._version = 0  # bumped by every insert: unchanged means no key can have appeared

    # -- the batch path ------------------------------------------------------------------

    def pool(self, table_id: int, indices, offsets, mean: bool, pool_misses, out) -> np.ndarray:
        """Pool a batch of bags of one table, reusing cached vectors.

        Args:
            table_id: the table, an integer in ``[0, 2**31)``.
            indices: ``(nnz,)`` int64 (or int32) row ids, already validated by the caller.
            offsets: ``(B + 1,)`` int64 CSR bag boundaries (``offsets[0] == 0``,
                non-decreasing, ``offsets[B] == nnz``).
            mean: True for mean pooling, False for sum (part of the key).
            pool_misses: ``pool_misses(sub_indices, sub_offsets, sub_out)`` pools the distinct
                bags that are not cached, as a CSR batch (``(nnz_k,) int64``, ``(k + 1,)
                int64``), into ``sub_out`` ``(k, dim) float32``, in the same mode. Called at
                most once, never with ``k == 0``, without the cache's lock held.
            out: ``(B, dim)`` float32 C-contiguous; every row is overwritten (empty bags with
                zeros, which are never cached).

        Returns:
            ``out``.

        Raises:
            InvalidArgumentError, InvalidOffsetsError: mis-shaped or mis-typed arguments.
        """
        indices, offsets, out = self._check_batch(table_id, indices, offsets, mean, pool_misses, out)
        nbags, dim = out.shape
        tag = (int(table_id) << 1) | int(bool(mean))
        hashes = np.empty(nbags, dtype=np.int64)
        rep = np.empty(nbags, dtype=np.int64)
        K.pc_hash_dedup(tag, dim, self._hash_mask, indices, offsets, hashes, rep, out)
        with self._lock:
            epoch = self._epoch
            version = self._version
            miss_bags, sub_indices, sub_offsets = K.pc_probe(
                self._ring, self._ringf, self._index, self._meta, self._counters, tag, dim,
                indices, offsets, hashes, rep, out)
        k = miss_bags.shape[0]
        sub_out = np.empty((k, dim), dtype=np.float32)
        if k:
            pool_misses(sub_indices, sub_offsets, sub_out)
            with self._lock:
                if self._epoch == epoch:
                    K.pc_insert(self._ring, self._ringf, self._index, self._meta, self._counters,
                                tag, dim, indices, offsets, hashes, miss_bags, sub_out,
                                self._version != version)
                    self._version += 1
        K.pc_scatter(rep, miss_bags, sub_out, out)
        return out

    @staticmethod
    def _check_batch(table_id, indices, offsets, mean, pool_misses, out):
        check_int(table_id, "table_id", lo=0, hi=MAX_TABLE_ID)
        if not isinstance(mean, (bool, np.bool_)):
            raise InvalidArgumentError(f"mean must be a bool, got {mean!r}")
        if not callable(pool_misses):
            raise InvalidArgumentError(f"pool_misses must be callable, got {type(pool_misses).__name__}")
        indices = as_int_array(indices, "indices")
        offsets = check_offsets(offsets, indices.shape[0])
        nbags = offsets.shape[0] - 1
        if (not isinstance(out, np.ndarray) or out.ndim != 2 or out.shape[0] != nbags
                or out.shape[1] < 1 or out.dtype != np.float32 or not out.flags.c_contiguous):
            got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
            raise InvalidArgumentError(
                f"out must be a C-contiguous ({nbags}, dim >= 1) float32 array "
                f"(one row per bag of offsets), got {got}")
        return indices, offsets, out

    # -- maintenance -----------------------------------------------------------------------

    def invalidate(self, table_id: int, ids=None) -> int:
        """Drop the entries of ``table_id`` whose bags hold a row of ``ids`` (rows updated),
        or every entry of the table when ``ids`` is None (a new snapshot of it).

        Returns the number of entries dropped.
        """
        table_id = check_int(table_id, "table_id", lo=0, hi=MAX_TABLE_ID)
        changed = _NO_IDS if ids is None else np.unique(np.asarray(ids, dtype=np.int64))
        with self._lock:
            self._epoch += 1
            return int(K.pc_invalidate(self._ring, self._index, self._meta, self._counters,
                                       table_id, changed, ids is None))

    def clear(self) -> None:
        """Drop every entry (statistics are kept)."""
        with self._lock:
            self._epoch += 1
            K.pc_clear(self._index, self._meta)

    def stats(self) -> dict:
        """Counters and occupancy.

        ``bags`` every bag passed to :meth:`pool`; ``empty`` the empty ones (zeros, neither
        hits nor misses); ``hits`` bags served without pooling: ``cache_hits`` (found in the
        cache) plus ``batch_repeats`` (the same sequence earlier in the same batch);
        ``misses`` distinct bags handed to ``pool_misses``; ``inserted``, ``evicted``,
        ``reinserted`` (CLOCK second chances), ``invalidated`` (entries dropped by
        :meth:`invalidate`), ``too_big`` (misses whose entry alone exceeds the capacity);
        ``served_lookups`` the lookups of the bags served without pooling (they never reach
        a tier); ``bytes_used``, ``capacity_bytes``, ``entries``; ``hit_rate`` = hits /
        non-empty bags.
        """
        with self._lock:
            c = {name: int(v) for name, v in zip(K.C_NAMES, self._counters)}
            c["hits"] = c["cache_hits"] + c["batch_repeats"]
            c["bytes_used"] = int(self._meta[K.M_USED_BYTES])
            c["entries"] = int(self._meta[K.M_ENTRIES])
        c["capacity_bytes"] = self.capacity_bytes
        nonempty = c["bags"] - c["empty"]
        c["hit_rate"] = c["hits"] / nonempty if nonempty else 0.0
        return c

    def __len__(self) -> int:
        return int(self._meta[K.M_ENTRIES])

    def check_invariants(self) -> None:
        """Raise AssertionError if the state is inconsistent (tests and debugging)."""
        with self._lock:
            code, detail = K.pc_check(self._ring, self._index, self._meta)
        if code:
            raise AssertionError(f"pooled cache: {CHECK_MESSAGES[int(code)]} ({int(detail)})")

    def entries(self) -> list:
        """Resident entries, oldest first, as ``(table_id, mean, dim, ids tuple, vector)``
        (debugging and tests; walks the log in Python)."""
        with self._lock:
            ring = self._ring
            W = ring.shape[0]
            pos = int(self._meta[K.M_TAIL])
            got = []
            for _ in range(int(self._meta[K.M_ENTRIES])):
                words = [int(ring[(pos + i) % W]) for i in range(K.HDR)]
                n, dim = words[2], words[3]
                total = K.HDR + n + (dim + 1) // 2
                span = ring[(pos + np.arange(total)) % W]
                ids = tuple(int(x) for x in span[K.HDR: K.HDR + n])
                vec = span[K.HDR + n:].copy().view(np.float32)[:dim].copy()
                got.append((words[1] >> 2, bool((words[1] >> 1) & 1), dim, ids, vec))
                pos = (pos + total) % W
            return got

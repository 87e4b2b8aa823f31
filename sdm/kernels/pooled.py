"""Pooled-embedding cache kernels: a byte-bounded CLOCK cache of pooled bag vectors.

The Python class :class:`sdm.store.pooled.PooledCache` validates and holds the lock; everything
per bag or per entry happens here. State (made by :func:`make_pooled_state`) is a tuple of
preallocated arrays:

* ``ring``: ``(W,) int64``, a circular log of entries, ``W = capacity_bytes // 8`` words.
  ``ringf`` is the same memory viewed as ``(2W,) float32`` (vectors are read and written
  through it). Entries sit back to back in insertion order from ``meta[M_TAIL]`` (oldest)
  for ``meta[M_USED_WORDS]`` words; an entry may wrap past the end of the ring, so free
  space is always one contiguous run and never fragments. An entry at word ``p`` is
  ``HDR`` header words, then its ids, then its vector (two float32 per word)::

      p + 0   hash of the key (63-bit, masked by meta[M_HASH_MASK])
      p + 1   tag << 1 | ref       tag = table_id << 1 | mean; ref = the CLOCK bit
      p + 2   n, the bag length (>= 1)
      p + 3   dim
      p + 4 .. p + 4 + n - 1                     the bag's ids, in order
      p + 4 + n .. p + 4 + n + ceil(dim / 2) - 1 the pooled float32 vector

* ``index``: ``(2S,) int64`` open-addressing table (``S`` a power of two, at most half
  full): slot ``s`` holds an entry's hash at ``2s`` and its ring position at ``2s + 1``
  (``-1``: free). Linear probing from a Fibonacci hash; deletion shifts the cluster back
  (no tombstones). Hashes may repeat (distinct keys can collide); a slot is identified by
  its position, and a lookup verifies the stored key (tag, n, dim, every id) before it
  trusts a hash match.
* ``meta``: ``(M_SIZE,) int64`` scalars (tail, used words and bytes, entries, capacity, mask).
* ``counters``: ``(C_SIZE,) int64`` statistics.

Byte accounting: an entry is charged ``8 * (HDR + n + ceil(dim / 2)) + INDEX_BYTES`` bytes,
its ring words plus its share of the index (two 16-byte slots at load <= 1/2). The sum of
charges never exceeds ``capacity_bytes``; that also guarantees the ring never overflows
and the index, sized for ``capacity_bytes // MIN_ENTRY_BYTES`` entries, never fills.

Eviction is CLOCK (FIFO with one reference bit, as ``sdm.policies``' ``clock``): a hit sets
the entry's bit; to make room the hand looks at the oldest entry, and a referenced one has
its bit cleared and is moved to the head of the log (a second chance, the log form of the
hand passing it), an unreferenced one is evicted. New entries start unreferenced. Moving an
entry copies its words to the head; that is what keeps the log contiguous for entries of
any size, and costs one copy per second chance (each paid for by an earlier hit).
"""

from __future__ import annotations

import numpy as np

from sdm.kernels.jit import jit
from sdm.kernels.hashmap import finalize64, home_slot, shift_back, table_size_for

__all__ = ["HDR", "INDEX_BYTES", "MIN_ENTRY_BYTES", "entry_bytes", "make_pooled_state",
           "bag_hash", "pc_hash_dedup", "pc_probe", "pc_insert", "pc_scatter",
           "pc_invalidate", "pc_clear", "pc_check", "M_TAIL", "M_USED_WORDS", "M_USED_BYTES",
           "M_ENTRIES", "M_CAPACITY", "M_HASH_MASK", "C_NAMES"]

HDR = 4  # header words per entry
INDEX_BYTES = 32  # charged per entry for its index slots (2 x 16 B at load factor <= 1/2)
MIN_ENTRY_BYTES = 8 * (HDR + 1 + 1) + INDEX_BYTES  # one id, dim 1

M_TAIL, M_USED_WORDS, M_USED_BYTES, M_ENTRIES, M_CAPACITY, M_HASH_MASK, M_SINK = range(7)
M_SIZE = 7  # M_SINK receives the sums of the touch loops, so the compiler keeps them

C_NAMES = ("bags", "empty", "cache_hits", "batch_repeats", "misses", "inserted", "evicted",
           "reinserted", "invalidated", "too_big", "served_lookups")
(C_BAGS, C_EMPTY, C_CACHE_HITS, C_REPEATS, C_MISSES, C_INSERTED, C_EVICTED, C_REINSERTED,
 C_INVALIDATED, C_TOO_BIG, C_SERVED) = range(len(C_NAMES))

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)


def entry_bytes(n: int, dim: int) -> int:
    """Bytes charged for an entry of a bag of ``n`` ids pooled to ``dim`` floats."""
    return 8 * (HDR + n + (dim + 1) // 2) + INDEX_BYTES


def make_pooled_state(capacity_bytes: int, hash_mask: int = -1):
    """Empty state for a cache of ``capacity_bytes``: ``(ring, ringf, index, meta, counters)``.

    Memory: the ring (``capacity_bytes``, rounded down to 8) plus the index (16 bytes per
    slot, ``table_size_for(capacity_bytes // MIN_ENTRY_BYTES)`` slots, at most
    ``0.8 * capacity_bytes``) plus a few hundred bytes; nothing grows later. The ring is
    ``np.zeros``, whose pages are committed only when first written; the index is filled
    with -1 here, so it is resident from the start. ``hash_mask`` keeps only some hash bits
    (tests inject collisions with it; ``-1`` keeps all 63).
    """
    ring = np.zeros(max(capacity_bytes // 8, 1), dtype=np.int64)
    ringf = ring.view(np.float32)
    index = np.full(2 * table_size_for(capacity_bytes // MIN_ENTRY_BYTES, 2), -1, dtype=np.int64)
    meta = np.zeros(M_SIZE, dtype=np.int64)
    meta[M_CAPACITY] = capacity_bytes
    meta[M_HASH_MASK] = hash_mask
    counters = np.zeros(len(C_NAMES), dtype=np.int64)
    return ring, ringf, index, meta, counters


# -- hashing ---------------------------------------------------------------------------------

@jit
def _rotl(x, r):
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@jit
def _hash_start(tag, dim, n):
    return np.uint64(tag) * _P1 + np.uint64(dim) * _P2 + np.uint64(n) * _P3


@jit
def _hash_step(h, x):
    # an xxhash64-style round per id: multiply-rotate-multiply mixes every id bit into h,
    # and the chaining makes the hash depend on the order of the ids (the key is a sequence)
    h ^= _rotl(np.uint64(x) * _P2, 31) * _P1
    return _rotl(h, 27) * _P1 + _P3


@jit
def _hash_end(h, mask):
    h = finalize64(h)
    # 63 bits so the hash is a non-negative int64 in compiled and interpreted runs alike
    return np.int64(h >> np.uint64(1)) & mask


@jit
def bag_hash(tag, dim, indices, o0, o1, mask):
    """Hash of the key ``(tag, dim, indices[o0:o1])``, a non-negative int64 ``& mask``."""
    h = _hash_start(tag, dim, o1 - o0)
    for i in range(o0, o1):
        h = _hash_step(h, indices[i])
    return _hash_end(h, mask)


_home = home_slot  # Fibonacci hashing: good spread even for weak, masked hashes


# -- ring access -------------------------------------------------------------------------------

@jit
def _wrap(p, W):
    # positions are < W and offsets within an entry < W, so one subtraction wraps any sum
    return p - W if p >= W else p


@jit
def _entry_words(ring, pos):
    W = ring.shape[0]
    return HDR + ring[_wrap(pos + 2, W)] + (ring[_wrap(pos + 3, W)] + 1) // 2


@jit
def _entry_is(ring, pos, tag, dim, indices, o0, o1):
    W = ring.shape[0]
    if (ring[_wrap(pos + 1, W)] >> 1) != tag:
        return False
    n = o1 - o0
    if ring[_wrap(pos + 2, W)] != n or ring[_wrap(pos + 3, W)] != dim:
        return False
    p = _wrap(pos + HDR, W)
    for i in range(o0, o1):
        if ring[p] != indices[i]:
            return False
        p += 1
        if p == W:
            p = 0
    return True


@jit
def _read_vector(ringf, ring_words, pos, n, dim, out, b):
    F = 2 * ring_words
    f = 2 * _wrap(pos + HDR + n, ring_words)
    first = min(dim, F - f)
    for j in range(first):
        out[b, j] = ringf[f + j]
    for j in range(first, dim):
        out[b, j] = ringf[j - first]


@jit
def _write_entry(ring, ringf, pos, h, tag, dim, indices, o0, o1, vec):
    W = ring.shape[0]
    n = o1 - o0
    ring[pos] = h
    ring[_wrap(pos + 1, W)] = tag << 1  # new entries start unreferenced
    ring[_wrap(pos + 2, W)] = n
    ring[_wrap(pos + 3, W)] = dim
    p = _wrap(pos + HDR, W)
    for i in range(o0, o1):
        ring[p] = indices[i]
        p += 1
        if p == W:
            p = 0
    F = 2 * W
    f = 2 * p
    first = min(dim, F - f)
    for j in range(first):
        ringf[f + j] = vec[j]
    for j in range(first, dim):
        ringf[j - first] = vec[j]


@jit
def _move_words(ring, src, dst, words):
    # forward copy: safe when dst is at or behind src in the ring, the only way entries move
    W = ring.shape[0]
    for k in range(words):
        ring[dst] = ring[src]
        src += 1
        if src == W:
            src = 0
        dst += 1
        if dst == W:
            dst = 0


# -- index -------------------------------------------------------------------------------------

@jit
def _find(ring, index, h, tag, dim, indices, o0, o1):
    """Ring position of the entry whose key is ``(tag, dim, indices[o0:o1])``, or -1."""
    smask = (index.shape[0] >> 1) - 1
    s = _home(h, smask)
    while True:
        pos = index[2 * s + 1]
        if pos < 0:
            return -1
        # a hash match alone is never trusted: verify the stored key id by id
        if index[2 * s] == h and _entry_is(ring, pos, tag, dim, indices, o0, o1):
            return pos
        s = (s + 1) & smask


@jit
def _index_insert(index, h, pos):
    smask = (index.shape[0] >> 1) - 1
    s = _home(h, smask)
    while index[2 * s + 1] >= 0:
        s = (s + 1) & smask
    index[2 * s] = h
    index[2 * s + 1] = pos


@jit
def _index_slot(index, h, pos):
    smask = (index.shape[0] >> 1) - 1
    s = _home(h, smask)
    while index[2 * s + 1] != pos:
        s = (s + 1) & smask
    return s


@jit
def _index_delete(index, h, pos):
    shift_back(index, _index_slot(index, h, pos))  # the index is a hashmap-layout table


@jit
def _same_ids(indices, a, b, n):
    """``indices[a:a + n] == indices[b:b + n]``; branch-free so it vectorizes (the common
    answer is yes, which reads every id anyway)."""
    diff = np.int64(0)
    for i in range(n):  # unsigned positions: no negative-index wrap check to block vectorizing
        diff |= indices[np.uint64(a + i)] ^ indices[np.uint64(b + i)]
    return diff == 0


# -- the batch path ------------------------------------------------------------------------------

@jit
def pc_hash_dedup(tag, dim, mask, indices, offsets, hashes, rep, out):
    """Hash every bag and find identical bags within the batch (no cache state touched).

    Args:
        tag: ``table_id << 1 | mean``.
        dim: the pooled width.
        mask: ``meta[M_HASH_MASK]``.
        indices: ``(nnz,) int64``; offsets: ``(B + 1,) int64`` validated CSR.
        hashes: ``(B,) int64`` out: each non-empty bag's hash.
        rep: ``(B,) int64`` out: -1 for an empty bag, else the first bag of the batch with
            the same id sequence (``rep[b] == b`` for the first of each distinct bag).
        out: ``(B, dim) float32``: rows of empty bags are zeroed here.

    Returns:
        The number of distinct non-empty bags.
    """
    B = offsets.shape[0] - 1
    size = 4
    while size < 2 * B:
        size *= 2
    slots = np.full(size, -1, dtype=np.int64)
    smask = size - 1
    distinct = 0
    for b in range(B):
        o0 = offsets[b]
        o1 = offsets[b + 1]
        if o1 == o0:
            rep[b] = -1
            hashes[b] = 0
            out[b, :] = 0.0
            continue
        if b > 0 and rep[b - 1] >= 0 and offsets[b - 1] + (o1 - o0) == o0:
            # the request-shaped case: one user's bag repeated over consecutive candidates.
            # Comparing with the previous bag is cheaper than hashing (no dependent chain).
            if _same_ids(indices, offsets[b - 1], o0, o1 - o0):
                rep[b] = rep[b - 1]
                hashes[b] = hashes[b - 1]
                continue
        h = bag_hash(tag, dim, indices, o0, o1, mask)
        hashes[b] = h
        s = _home(h, smask)
        while True:
            c = slots[s]
            if c < 0:
                slots[s] = b
                rep[b] = b
                distinct += 1
                break
            if (hashes[c] == h and offsets[c + 1] - offsets[c] == o1 - o0
                    and _same_ids(indices, offsets[c], o0, o1 - o0)):
                rep[b] = c
                break
            s = (s + 1) & smask
    return distinct


@jit
def pc_probe(ring, ringf, index, meta, counters, tag, dim, indices, offsets, hashes, rep, out):
    """Look every distinct bag up; copy hits into ``out``, collect misses as a CSR sub-batch.

    Sets the CLOCK bit of every hit entry and counts bags, empties, hits, batch repeats,
    misses and the lookups of the bags served whole (hits and repeats). Arrays as in :func:`pc_hash_dedup` (after it ran). The caller holds the lock.

    Returns:
        ``(miss_bags, sub_indices, sub_offsets)``: ``(k,) int64`` bag numbers of the distinct
        missing bags in batch order, and their ids as ``(nnz_k,) int64`` / ``(k + 1,) int64``
        CSR.
    """
    W = ring.shape[0]
    B = rep.shape[0]
    # Touch every distinct bag's home slot first: these loads are independent, so the CPU
    # keeps many index cache misses in flight, where the probe loop below would take them one
    # after another (measured: 110 -> 37 ns per missing bag with a 32 MB index).
    smask = (index.shape[0] >> 1) - 1
    touched = np.int64(0)
    for b in range(B):
        if rep[b] == b:
            touched += index[2 * _home(hashes[b], smask) + 1]
    miss_bags = np.empty(B, dtype=np.int64)
    k = 0
    sub_nnz = 0
    hits = 0
    repeats = 0
    empty = 0
    served = 0  # lookups of the bags served whole: they never reach a tier
    for b in range(B):
        r = rep[b]
        if r < 0:
            empty += 1
            continue
        o0 = offsets[b]
        o1 = offsets[b + 1]
        if r != b:
            repeats += 1
            served += o1 - o0
            continue
        pos = _find(ring, index, hashes[b], tag, dim, indices, o0, o1)
        if pos >= 0:
            hits += 1
            served += o1 - o0
            p1 = _wrap(pos + 1, W)
            ring[p1] = ring[p1] | 1
            _read_vector(ringf, W, pos, o1 - o0, dim, out, b)
        else:
            miss_bags[k] = b
            k += 1
            sub_nnz += o1 - o0
    sub_offsets = np.empty(k + 1, dtype=np.int64)
    sub_indices = np.empty(sub_nnz, dtype=np.int64)
    at = 0
    sub_offsets[0] = 0
    for j in range(k):
        b = miss_bags[j]
        for i in range(offsets[b], offsets[b + 1]):
            sub_indices[at] = indices[i]
            at += 1
        sub_offsets[j + 1] = at
    counters[C_BAGS] += B
    counters[C_EMPTY] += empty
    counters[C_CACHE_HITS] += hits
    counters[C_REPEATS] += repeats
    counters[C_MISSES] += k
    counters[C_SERVED] += served
    meta[M_SINK] = touched
    return miss_bags[:k].copy(), sub_indices, sub_offsets


@jit
def _evict_one(ring, index, meta, counters):
    """Advance the CLOCK hand until one entry is evicted."""
    W = ring.shape[0]
    while True:
        pos = meta[M_TAIL]
        words = _entry_words(ring, pos)
        h = ring[pos]
        p1 = _wrap(pos + 1, W)
        if ring[p1] & 1:
            ring[p1] = ring[p1] ^ 1
            head = _wrap(pos + meta[M_USED_WORDS], W)
            if head != pos:  # a full ring (head == tail) already has it at the head
                _move_words(ring, pos, head, words)
                index[2 * _index_slot(index, h, pos) + 1] = head
            meta[M_TAIL] = _wrap(pos + words, W)
            counters[C_REINSERTED] += 1
        else:
            _index_delete(index, h, pos)
            meta[M_TAIL] = _wrap(pos + words, W)
            meta[M_USED_WORDS] -= words
            meta[M_USED_BYTES] -= 8 * words + INDEX_BYTES
            meta[M_ENTRIES] -= 1
            counters[C_EVICTED] += 1
            return


@jit
def pc_insert(ring, ringf, index, meta, counters, tag, dim, indices, offsets, hashes, miss_bags,
              sub_out, check_present):
    """Insert the pooled misses ``sub_out`` ``(k, dim) float32`` for bags ``miss_bags`` ``(k,)``.

    Entries larger than the capacity are skipped (counted ``too_big``). With
    ``check_present`` (the cache changed since :func:`pc_probe`: another thread may have
    inserted some of these keys while this one pooled) keys already present are skipped too.
    The caller holds the lock.
    """
    W = ring.shape[0]
    cap = meta[M_CAPACITY]
    vec_words = (dim + 1) // 2
    smask = (index.shape[0] >> 1) - 1
    touched = np.int64(0)
    for j in range(miss_bags.shape[0]):  # overlap the index misses, as in pc_probe
        touched += index[2 * _home(hashes[miss_bags[j]], smask) + 1]
    meta[M_SINK] = touched
    for j in range(miss_bags.shape[0]):
        b = miss_bags[j]
        o0 = offsets[b]
        o1 = offsets[b + 1]
        words = HDR + (o1 - o0) + vec_words
        charge = 8 * words + INDEX_BYTES
        if charge > cap:
            counters[C_TOO_BIG] += 1
            continue
        h = hashes[b]
        if check_present and _find(ring, index, h, tag, dim, indices, o0, o1) >= 0:
            continue
        while meta[M_USED_BYTES] + charge > cap:
            _evict_one(ring, index, meta, counters)
        if meta[M_ENTRIES] == 0:
            meta[M_TAIL] = 0
        pos = _wrap(meta[M_TAIL] + meta[M_USED_WORDS], W)
        _write_entry(ring, ringf, pos, h, tag, dim, indices, o0, o1, sub_out[j])
        _index_insert(index, h, pos)
        meta[M_USED_WORDS] += words
        meta[M_USED_BYTES] += charge
        meta[M_ENTRIES] += 1
        counters[C_INSERTED] += 1


@jit
def pc_scatter(rep, miss_bags, sub_out, out):
    """Write the pooled misses into ``out`` and copy every in-batch repeat from its first bag.

    ``rep`` ``(B,)`` and ``miss_bags`` ``(k,)`` as from :func:`pc_hash_dedup` / :func:`pc_probe`,
    ``sub_out`` ``(k, dim) float32``, ``out`` ``(B, dim) float32`` (hits already written).
    """
    dim = out.shape[1]
    for j in range(miss_bags.shape[0]):
        b = miss_bags[j]
        for c in range(dim):
            out[b, c] = sub_out[j, c]
    for b in range(rep.shape[0]):
        r = rep[b]
        if r >= 0 and r != b:  # r < b: the first occurrence is final by now
            for c in range(dim):
                out[b, c] = out[r, c]


@jit
def _holds_any(ring, pos, changed):
    """Whether the entry at ``pos`` holds an id of ``changed`` (sorted int64)."""
    W = ring.shape[0]
    n = ring[_wrap(pos + 2, W)]
    p = _wrap(pos + HDR, W)
    for _ in range(n):
        i = np.searchsorted(changed, ring[p])
        if i < changed.shape[0] and changed[i] == ring[p]:
            return True
        p += 1
        if p == W:
            p = 0
    return False


@jit
def pc_invalidate(ring, index, meta, counters, table_id, changed, every):
    """Drop the entries of ``table_id``: all of them when ``every``, else those holding an
    id of ``changed`` (sorted int64); survivors are compacted toward the tail (order kept).

    Returns the number of entries dropped.
    """
    W = ring.shape[0]
    rd = meta[M_TAIL]
    wr = rd
    n_entries = meta[M_ENTRIES]
    dropped = 0
    for _ in range(n_entries):
        words = _entry_words(ring, rd)
        h = ring[rd]
        if (ring[_wrap(rd + 1, W)] >> 2) == table_id and (every or _holds_any(ring, rd, changed)):
            _index_delete(index, h, rd)
            dropped += 1
            meta[M_USED_WORDS] -= words
            meta[M_USED_BYTES] -= 8 * words + INDEX_BYTES
        else:
            if wr != rd:  # wr trails rd, so the forward copy is safe
                _move_words(ring, rd, wr, words)
                index[2 * _index_slot(index, h, rd) + 1] = wr
            wr = _wrap(wr + words, W)
        rd = _wrap(rd + words, W)
    meta[M_ENTRIES] -= dropped
    counters[C_INVALIDATED] += dropped
    return dropped


@jit
def pc_clear(index, meta):
    """Drop every entry (counters are kept)."""
    index[:] = -1
    meta[M_TAIL] = 0
    meta[M_USED_WORDS] = 0
    meta[M_USED_BYTES] = 0
    meta[M_ENTRIES] = 0


@jit
def pc_check(ring, index, meta):
    """Consistency of the state: ``(0, 0)`` when sound, else ``(code, detail)`` (see
    :data:`sdm.store.pooled.CHECK_MESSAGES`). Walks every entry and every index slot."""
    W = ring.shape[0]
    cap = meta[M_CAPACITY]
    mask = meta[M_HASH_MASK]
    if meta[M_USED_BYTES] > cap:
        return 1, meta[M_USED_BYTES]
    if meta[M_USED_WORDS] > W or meta[M_ENTRIES] < 0 or meta[M_TAIL] < 0 or meta[M_TAIL] >= W:
        return 2, meta[M_USED_WORDS]
    pos = meta[M_TAIL]
    words_seen = 0
    bytes_seen = 0
    for e in range(meta[M_ENTRIES]):
        n = ring[_wrap(pos + 2, W)]
        dim = ring[_wrap(pos + 3, W)]
        if n < 1 or dim < 1:
            return 3, e
        words = HDR + n + (dim + 1) // 2
        if words_seen + words > meta[M_USED_WORDS]:
            return 3, e
        ids = np.empty(n, dtype=np.int64)
        p = _wrap(pos + HDR, W)
        for i in range(n):
            ids[i] = ring[p]
            p = _wrap(p + 1, W)
        tag = ring[_wrap(pos + 1, W)] >> 1
        h = bag_hash(tag, dim, ids, 0, n, mask)
        if h != ring[pos]:
            return 4, e
        if _find(ring, index, h, tag, dim, ids, 0, n) != pos:
            return 5, e
        words_seen += words
        bytes_seen += 8 * words + INDEX_BYTES
        pos = _wrap(pos + words, W)
    if words_seen != meta[M_USED_WORDS]:
        return 6, words_seen
    if bytes_seen != meta[M_USED_BYTES]:
        return 7, bytes_seen
    smask = (index.shape[0] >> 1) - 1
    occupied = 0
    for s in range(smask + 1):
        if index[2 * s + 1] < 0:
            continue
        occupied += 1
        t = _home(index[2 * s], smask)
        while t != s:  # every slot between an entry's home and its slot must be taken
            if index[2 * t + 1] < 0:
                return 8, s
            t = (t + 1) & smask
    if occupied != meta[M_ENTRIES]:
        return 9, occupied
    return 0, 0

"""Cache-policy kernels: one state layout, every policy decomposed like libCacheSim.

A cache of ``capacity`` slots is a tuple of preallocated contiguous arrays made by
:func:`make_cache_state`; the same tuple serves the trace simulator and the live DRAM cache
of the store. The policy owns metadata only (which key sits in which slot, recency,
frequency, ghosts); the rows live in a buffer the caller indexes by slot.

Every request goes through ``_access`` (looped by :func:`serve`, one request from another
kernel: :func:`access_one`):

``find`` (id -> slot map) -> hit: ``on_hit`` (promote / count)
miss: ``admit?`` -> ``pre_miss`` (ghost look-ups, ARC adaptation) -> free slot, or
``choose_victim`` (may reorganise queues, skips pinned slots) -> ``evict`` (the one eviction
funnel: unlink, ghost, map delete, counters) -> ``insert``.

Policy codes index :data:`POLICY_NAMES`. Queues are intrusive doubly linked lists over slot
ids: ``prev`` points toward the head (newest), ``next`` toward the tail (oldest), as in
libCacheSim. FIFO and CLOCK use the slot ring itself (a hand over slots ``0..c-1``), which
is the same order as a linked FIFO with reinsertion as long as no key is removed by hand.

All kernels trust their inputs (keys >= 0, slots in range); :mod:`sdm.policies` validates.
"""

from __future__ import annotations

import numpy as np

from sdm.kernels.jit import jit
from sdm.kernels.bag import prefetch_row
from sdm.kernels.hashmap import _home, hm_delete, hm_find, hm_insert, make_hashmap_state, mix64

POLICY_NAMES = ("lru", "fifo", "clock", "lfu", "sieve", "s3fifo", "arc", "random", "belady")
LRU, FIFO, CLOCK, LFU, SIEVE, S3FIFO, ARC, RANDOM, BELADY = range(9)
ADMISSION_NAMES = ("none", "threshold", "tinylfu")
ADM_NONE, ADM_THRESHOLD, ADM_TINYLFU = range(3)

# Keys ahead whose id -> slot map entry serve() prefetches: the map of a 10K-slot cache
# (1 MB at load 1/4) does not stay in L2 beside the rest of the state.
_SERVE_AHEAD = 12

# Next use of a key never requested again (belady); larger than any trace position.
NEVER = np.int64(1 << 62)

# meta (int64) fields
M_POL, M_CAP, M_SIZE, M_NFREE, M_HAND, M_TIME, M_RNG, M_HAS_EVICTED = range(8)
M_SMALL_CAP, M_MAIN_CAP, M_GHOST_CAP, M_NGFREE, M_HEAPN, M_FLAG, M_THRESH = range(8, 15)
# Held slots (the live cache): a slot whose use stamp (state array 19, ``epoch << 32 | j``)
# names one of the meta[M_FLYING] epochs in state array 20 is held like a pinned one.
M_FLYING = 15
M_HITS, M_MISSES, M_EVICTIONS, M_REJECTS = 32, 33, 34, 35
Q_BASE = 16  # resident queue q: head, tail, length at 16 + 3q
G_BASE = 24  # ghost queue q: head, tail, length at 24 + 3q
META_LEN = 40
# M_FLAG bits set by pre_miss for the insert and victim choice of the same request.
F_TO_MAIN, F_IN_B2, F_NO_GHOST = 1, 2, 4

# admission meta
A_KIND, A_THRESH, A_WMASK, A_DMASK, A_ADDS, A_PERIOD, A_HLIMIT, A_HCOUNT = range(8)
SKETCH_ROWS = 4
COUNTER_MAX = 15


def _needs(policy: int):
    lists = policy in (LRU, SIEVE, S3FIFO, ARC)
    heap = policy in (LFU, BELADY)
    ghosts = policy in (S3FIFO, ARC)
    return lists, heap, ghosts


def make_cache_state(capacity: int, policy: int, *, seed: int = 0, small_ratio: float = 0.1,
                     ghost_ratio: float = 0.9, move_to_main: int = 2, guarded: bool = False):
    """Preallocate the state tuple of a ``capacity``-slot cache running ``policy`` (a code).

    Arrays a policy does not use are length 1 so every policy shares one compiled signature.
    ``guarded``: the cache holds slots by use stamps as well as pin counts (the live cache:
    :data:`M_FLYING`); the simulator's caches leave those arrays at length 1 and never read them.
    S3-FIFO queue sizes follow libCacheSim: small ``floor(small_ratio * c)`` (at least 1),
    main the rest, ghost ``floor(ghost_ratio * c)`` keys.
    """
    c = int(capacity)
    lists, heap, ghosts = _needs(policy)
    meta = np.zeros(META_LEN, dtype=np.int64)
    meta[M_POL] = policy
    meta[M_CAP] = c
    meta[M_NFREE] = c
    meta[M_HAND] = -1 if policy == SIEVE else 0
    meta[M_RNG] = (int(seed) & ((1 << 32) - 1)) << 24
    for q in range(2):
        meta[Q_BASE + 3 * q] = meta[Q_BASE + 3 * q + 1] = -1
        meta[G_BASE + 3 * q] = meta[G_BASE + 3 * q + 1] = -1
    # Integer arithmetic avoids 0.1 * c float round-off; equals libCacheSim's int(c * 0.1).
    small = max(1, (c * round(small_ratio * 1000)) // 1000)
    meta[M_SMALL_CAP] = small
    meta[M_MAIN_CAP] = c - small
    if policy == S3FIFO:
        gcap = (c * round(ghost_ratio * 1000)) // 1000
    elif policy == ARC:
        gcap = c + 1
    else:
        gcap = 0
    meta[M_GHOST_CAP] = gcap
    meta[M_NGFREE] = max(gcap, 0)
    meta[M_THRESH] = move_to_main
    fmeta = np.zeros(4, dtype=np.float64)
    n_l = c if lists else 1
    n_h = c if heap else 1
    g = max(gcap, 1) if ghosts else 1
    return (
        meta,
        fmeta,
        make_hashmap_state(c, 4),
        np.full(c, -1, dtype=np.int64),             # 3 key of slot (-1: free)
        np.full(n_l, -1, dtype=np.int32),           # 4 prev (toward head)
        np.full(n_l, -1, dtype=np.int32),           # 5 next (toward tail)
        np.zeros(c, dtype=np.int32),                # 6 freq / reference bits
        np.zeros(c, dtype=np.int8),                 # 7 queue of slot
        np.zeros(n_h, dtype=np.int64),              # 8 heap priority of slot
        np.zeros(n_h, dtype=np.int32),              # 9 heap: position -> slot
        np.full(n_h, -1, dtype=np.int32),           # 10 slot -> heap position
        np.zeros(c, dtype=np.int32),                # 11 pin count of slot
        np.arange(c - 1, -1, -1, dtype=np.int32),   # 12 free-slot stack (pops 0 first)
        make_hashmap_state(g, 4) if ghosts else np.full(8, -1, dtype=np.int64),  # 13 ghost map
        np.full(g, -1, dtype=np.int64),             # 14 ghost key
        np.full(g, -1, dtype=np.int32),             # 15 ghost prev
        np.full(g, -1, dtype=np.int32),             # 16 ghost next
        np.zeros(g, dtype=np.int8),                 # 17 ghost queue
        np.arange(g - 1, -1, -1, dtype=np.int32),   # 18 ghost free stack
        np.full(c if guarded else 1, -1, dtype=np.int64),  # 19 use stamp of slot (guarded only)
        np.zeros(64 if guarded else 1, dtype=np.int64),     # 20 epochs in flight (guarded only)
    )


def make_admission_state(kind: int, capacity: int, *, threshold: int = 2,
                         history: int | None = None, sample_factor: int = 10):
    """Preallocate admission-filter state.

    ``threshold``: a key is admitted on its ``threshold``-th miss; miss counts live in an
    exact key -> count map of at most ``history`` keys (default ``4 * capacity``) that is
    cleared when full (aging by reset).
    ``tinylfu``: a 4-row count-min sketch of 4-bit counters, ``next_pow2(capacity)`` wide,
    with a doorkeeper bit array; every access is recorded, and after
    ``sample_factor * capacity`` recorded accesses all counters are halved and the
    doorkeeper cleared. A miss that needs an eviction is admitted only if its estimate
    exceeds the victim's.
    """
    c = int(capacity)
    meta = np.zeros(8, dtype=np.int64)
    meta[A_KIND] = kind
    meta[A_THRESH] = threshold
    if kind == ADM_THRESHOLD:
        h = int(history) if history is not None else 4 * c
        meta[A_HLIMIT] = max(h, 1)
        counts = make_hashmap_state(meta[A_HLIMIT])
    else:
        counts = np.full(8, -1, dtype=np.int64)
    if kind == ADM_TINYLFU:
        w = 16
        while w < c:
            w *= 2
        sketch = np.zeros(SKETCH_ROWS * w, dtype=np.uint8)
        door = np.zeros(4 * w, dtype=np.uint8)
        meta[A_WMASK] = w - 1
        meta[A_DMASK] = 4 * w - 1
        meta[A_PERIOD] = max(sample_factor * c, 1)
    else:
        sketch = np.zeros(1, dtype=np.uint8)
        door = np.zeros(1, dtype=np.uint8)
    return (meta, counts, sketch, door)


# --------------------------------------------------------------------------- lists


@jit(_nrt=False, inline='always')
def _push_head(meta, base, prev, nxt, s):
    head = meta[base]
    prev[s] = -1
    nxt[s] = head
    if head >= 0:
        prev[head] = s
    else:
        meta[base + 1] = s
    meta[base] = s
    meta[base + 2] += 1


@jit(_nrt=False, inline='always')
def _unlink(meta, base, prev, nxt, s):
    p = prev[s]
    n = nxt[s]
    if p >= 0:
        nxt[p] = n
    else:
        meta[base] = n
    if n >= 0:
        prev[n] = p
    else:
        meta[base + 1] = p
    prev[s] = -1
    nxt[s] = -1
    meta[base + 2] -= 1


# --------------------------------------------------------------------------- heap (min)


@jit(_nrt=False, inline='always')
def _heap_up(prio, heap, hpos, i):
    s = heap[i]
    ps = prio[s]
    while i > 0:
        parent = (i - 1) >> 1
        t = heap[parent]
        if prio[t] <= ps:
            break
        heap[i] = t
        hpos[t] = i
        i = parent
    heap[i] = s
    hpos[s] = i


@jit(_nrt=False, inline='always')
def _heap_down(prio, heap, hpos, i, n):
    s = heap[i]
    ps = prio[s]
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and prio[heap[child + 1]] < prio[heap[child]]:
            child += 1
        t = heap[child]
        if prio[t] >= ps:
            break
        heap[i] = t
        hpos[t] = i
        i = child
    heap[i] = s
    hpos[s] = i


@jit(_nrt=False, inline='always')
def _heap_push(st, s):
    meta, prio, heap, hpos = st[0], st[8], st[9], st[10]
    n = meta[M_HEAPN]
    heap[n] = s
    hpos[s] = n
    meta[M_HEAPN] = n + 1
    _heap_up(prio, heap, hpos, n)


@jit(_nrt=False, inline='always')
def _heap_remove(st, s):
    meta, prio, heap, hpos = st[0], st[8], st[9], st[10]
    n = meta[M_HEAPN] - 1
    i = hpos[s]
    hpos[s] = -1
    meta[M_HEAPN] = n
    if i == n:
        return
    last = heap[n]
    heap[i] = last
    hpos[last] = i
    _heap_up(prio, heap, hpos, i)
    _heap_down(prio, heap, hpos, hpos[last], n)


@jit(_nrt=False, inline='always')
def _heap_fix(st, s):
    meta, prio, heap, hpos = st[0], st[8], st[9], st[10]
    _heap_up(prio, heap, hpos, hpos[s])
    _heap_down(prio, heap, hpos, hpos[s], meta[M_HEAPN])


# --------------------------------------------------------------------------- ghosts


@jit(_nrt=False, inline='always')
def _ghost_add(st, q, key):
    """Remember an evicted key in ghost queue ``q`` (FIFO: the oldest ghost is dropped)."""
    meta, gtable, gkey, gprev, gnext, gq, gfree = st[0], st[13], st[14], st[15], st[16], st[17], st[18]
    if meta[M_GHOST_CAP] <= 0:
        return
    if meta[M_NGFREE] == 0:
        # Only S3-FIFO fills its ghost; ARC trims B1/B2 itself before they overflow.
        old = meta[G_BASE + 1]
        _ghost_drop(st, old)
    meta[M_NGFREE] -= 1
    g = gfree[meta[M_NGFREE]]
    gkey[g] = key
    gq[g] = q
    hm_insert(gtable, key, g)
    _push_head(meta, G_BASE + 3 * q, gprev, gnext, g)


@jit(_nrt=False, inline='always')
def _ghost_drop(st, g):
    meta, gtable, gkey, gprev, gnext, gq, gfree = st[0], st[13], st[14], st[15], st[16], st[17], st[18]
    _unlink(meta, G_BASE + 3 * gq[g], gprev, gnext, g)
    hm_delete(gtable, gkey[g])
    gkey[g] = -1
    gfree[meta[M_NGFREE]] = g
    meta[M_NGFREE] += 1


# --------------------------------------------------------------------------- policy steps


@jit(_nrt=False, inline='always')
def _belady_prio(nu, t):
    # Min-heap priority: the farthest next use on top. Keys never requested again tie on
    # NEVER; breaking the tie by recency (most recent first) keeps victims deterministic,
    # which admission filters that compare against the victim need.
    if nu >= NEVER:
        return -(NEVER + t)
    return -nu


@jit(_nrt=False, inline='always')
def _on_hit(st, pol, s, t, nu):
    meta = st[0]
    freq = st[6]
    if pol == LRU:
        if meta[Q_BASE] != s:  # hot keys are often already most recent
            _unlink(meta, Q_BASE, st[4], st[5], s)
            _push_head(meta, Q_BASE, st[4], st[5], s)
    elif pol == CLOCK or pol == SIEVE:
        freq[s] = 1
    elif pol == LFU:
        freq[s] += 1
        st[8][s] = (np.int64(freq[s]) << 40) | t
        _heap_down(st[8], st[9], st[10], st[10][s], meta[M_HEAPN])
    elif pol == S3FIFO:
        freq[s] += 1
    elif pol == ARC:
        q = st[7][s]
        _unlink(meta, Q_BASE + 3 * q, st[4], st[5], s)
        st[7][s] = 1
        _push_head(meta, Q_BASE + 3, st[4], st[5], s)
    elif pol == BELADY:
        st[8][s] = _belady_prio(nu, t)
        _heap_fix(st, s)


@jit(_nrt=False, inline='always')
def _pre_miss(st, pol, key):
    """Ghost bookkeeping of a miss before any eviction (S3-FIFO, ARC)."""
    meta = st[0]
    meta[M_FLAG] = 0
    if pol == S3FIFO:
        if meta[M_GHOST_CAP] > 0:
            g = hm_find(st[13], key)
            if g >= 0:
                _ghost_drop(st, g)
                meta[M_FLAG] = F_TO_MAIN
    elif pol == ARC:
        c = meta[M_CAP]
        fmeta = st[1]
        t1 = meta[Q_BASE + 2]
        t2 = meta[Q_BASE + 5]
        b1 = meta[G_BASE + 2]
        b2 = meta[G_BASE + 5]
        g = hm_find(st[13], key)
        if g >= 0:
            if st[17][g] == 0:
                delta = 1.0 if b1 >= b2 else b2 / b1
                fmeta[0] = min(fmeta[0] + delta, float(c))
                meta[M_FLAG] = F_TO_MAIN
            else:
                delta = 1.0 if b2 >= b1 else b1 / b2
                fmeta[0] = max(fmeta[0] - delta, 0.0)
                meta[M_FLAG] = F_TO_MAIN | F_IN_B2
            _ghost_drop(st, g)
        elif t1 + b1 >= c:
            if t1 < c:
                _ghost_drop(st, meta[G_BASE + 1])
            else:
                meta[M_FLAG] = F_NO_GHOST
        elif t1 + t2 + b1 + b2 >= c:
            if t1 + t2 + b1 + b2 >= 2 * c:
                _ghost_drop(st, meta[G_BASE + 4])


@jit(_nrt=False, inline='always')
def flying(st, stamp):
    """The use stamp ``stamp`` names an epoch in flight (:data:`M_FLYING`)."""
    epoch = stamp >> 32
    fly = st[20]
    for i in range(st[0][M_FLYING]):
        if fly[i] == epoch:
            return True
    return False


@jit(_nrt=False, inline='always')
def _held(st, pins, s):
    """Slot ``s`` may not be evicted: pinned, or stamped by a batch in flight."""
    return pins[s] > 0 or (st[0][M_FLYING] > 0 and flying(st, st[19][s]))


@jit(_nrt=False, inline='always')
def _scan_unpinned(st):
    """Fallback victim when the policy's own choice is held: the best unheld heap slot."""
    meta, prio, heap, pins = st[0], st[8], st[9], st[11]
    best = -1
    for i in range(meta[M_HEAPN]):
        s = heap[i]
        if not _held(st, pins, s) and (best < 0 or prio[s] < prio[best]):
            best = s
    return best


@jit(_nrt=False, inline='always')
def _tail_unpinned(st, meta, base, prev, pins):
    s = meta[base + 1]
    while s >= 0 and _held(st, pins, s):
        s = prev[s]
    return s


@jit(_nrt=False, inline='always')
def _choose_victim(st, pol):
    """Slot to evict (all slots are occupied), or -1 if every candidate is pinned.

    May reorganise the policy state the way its eviction does (clock hands clear bits,
    S3-FIFO promotes small-queue keys to main); the victim itself stays in place.
    """
    meta, prev, nxt, freq, sq, pins = st[0], st[4], st[5], st[6], st[7], st[11]
    c = meta[M_CAP]
    if pol == LRU:
        return _tail_unpinned(st, meta, Q_BASE, prev, pins)
    if pol == FIFO or pol == CLOCK:
        h = meta[M_HAND]
        for _ in range(2 * c + 1):
            if not _held(st, pins, h):
                if pol == FIFO or freq[h] == 0:
                    return h
                freq[h] = 0
            h += 1
            if h == c:
                h = 0
            meta[M_HAND] = h
        return -1
    if pol == SIEVE:
        s = meta[M_HAND]
        if s < 0:
            s = meta[Q_BASE + 1]
        for _ in range(2 * c + 1):
            if not _held(st, pins, s):
                if freq[s] == 0:
                    # the hand rests on the victim; evict moves it one step toward the head
                    meta[M_HAND] = s
                    return s
                freq[s] -= 1
            s = prev[s]
            if s < 0:
                s = meta[Q_BASE + 1]
        return -1
    if pol == LFU or pol == BELADY:
        top = st[9][0]
        if not _held(st, pins, top):
            return top
        return _scan_unpinned(st)
    if pol == RANDOM:
        for _ in range(64):
            # Counter-based generator (splitmix64 of a seeded counter): reproducible and
            # easy to mirror in the pure-Python reference.
            meta[M_RNG] += 1
            s = np.int64(mix64(meta[M_RNG]) % np.uint64(c))
            if not _held(st, pins, s):
                return s
        for s in range(c):
            if not _held(st, pins, s):
                return s
        return -1
    if pol == S3FIFO:
        meta[M_HAS_EVICTED] = 1
        for _ in range(4 * c + 4):
            if meta[Q_BASE + 5] > meta[M_MAIN_CAP] or meta[Q_BASE + 2] == 0:
                if meta[Q_BASE + 5] == 0:
                    return -1
                s = meta[Q_BASE + 4]
                if freq[s] >= 1 or _held(st, pins, s):
                    # main is a clock with a 2-bit counter: reinsert with one less.
                    f = freq[s]
                    freq[s] = (3 if f > 3 else f) - 1 if f >= 1 else 0
                    _unlink(meta, Q_BASE + 3, prev, nxt, s)
                    _push_head(meta, Q_BASE + 3, prev, nxt, s)
                else:
                    return s
            else:
                s = meta[Q_BASE + 1]
                if freq[s] >= meta[M_THRESH] or _held(st, pins, s):
                    _unlink(meta, Q_BASE, prev, nxt, s)
                    sq[s] = 1
                    freq[s] = 0
                    _push_head(meta, Q_BASE + 3, prev, nxt, s)
                else:
                    return s
        return -1
    if pol == ARC:
        if meta[M_FLAG] & F_NO_GHOST:
            return _tail_unpinned(st, meta, Q_BASE, prev, pins)
        t1 = meta[Q_BASE + 2]
        p = st[1][0]
        if t1 >= 1 and (t1 > p or ((meta[M_FLAG] & F_IN_B2) and t1 == p)):
            s = _tail_unpinned(st, meta, Q_BASE, prev, pins)
            if s >= 0:
                return s
            return _tail_unpinned(st, meta, Q_BASE + 3, prev, pins)
        s = _tail_unpinned(st, meta, Q_BASE + 3, prev, pins)
        if s >= 0:
            return s
        return _tail_unpinned(st, meta, Q_BASE, prev, pins)
    return -1


@jit(_nrt=False, inline='always')
def _evict(st, pol, s, ghost):
    """The one eviction funnel: unlink slot ``s`` from the policy, remember it in a ghost
    queue when ``ghost`` (S3-FIFO small queue, ARC), drop it from the map, free the slot.
    Returns the key that left."""
    meta, prev, nxt, skey, sq = st[0], st[4], st[5], st[3], st[7]
    key = skey[s]
    if pol == LRU or pol == SIEVE:
        if pol == SIEVE and meta[M_HAND] == s:
            meta[M_HAND] = prev[s]
        _unlink(meta, Q_BASE, prev, nxt, s)
    elif pol == S3FIFO or pol == ARC:
        q = sq[s]
        _unlink(meta, Q_BASE + 3 * q, prev, nxt, s)
        if ghost:
            if pol == S3FIFO:
                if q == 0:
                    _ghost_add(st, 0, key)
            elif not (meta[M_FLAG] & F_NO_GHOST):
                _ghost_add(st, q, key)
    elif pol == LFU or pol == BELADY:
        _heap_remove(st, s)
    hm_delete(st[2], key)
    skey[s] = -1
    st[6][s] = 0
    meta[M_SIZE] -= 1
    return key


@jit(_nrt=False, inline='always')
def _insert(st, pol, s, key, t, nu):
    meta, prev, nxt, freq, sq = st[0], st[4], st[5], st[6], st[7]
    st[3][s] = key
    hm_insert(st[2], key, s)
    meta[M_SIZE] += 1
    freq[s] = 0
    if pol == LRU or pol == SIEVE:
        _push_head(meta, Q_BASE, prev, nxt, s)
    elif pol == FIFO or pol == CLOCK:
        # The new key takes the hand's slot and becomes the newest: advance past it.
        if meta[M_NFREE] == 0 and meta[M_HAND] == s:
            h = s + 1
            meta[M_HAND] = 0 if h == meta[M_CAP] else h
    elif pol == LFU:
        freq[s] = 1
        st[8][s] = (np.int64(1) << 40) | t
        _heap_push(st, s)
    elif pol == BELADY:
        st[8][s] = _belady_prio(nu, t)
        _heap_push(st, s)
    elif pol == S3FIFO:
        flag = meta[M_FLAG]
        if (flag & F_TO_MAIN) or (meta[M_HAS_EVICTED] == 0
                                  and meta[Q_BASE + 2] >= meta[M_SMALL_CAP]):
            sq[s] = 1
            _push_head(meta, Q_BASE + 3, prev, nxt, s)
        else:
            sq[s] = 0
            _push_head(meta, Q_BASE, prev, nxt, s)
    elif pol == ARC:
        q = 1 if meta[M_FLAG] & F_TO_MAIN else 0
        sq[s] = q
        _push_head(meta, Q_BASE + 3 * q, prev, nxt, s)


# --------------------------------------------------------------------------- admission


@jit(_nrt=False, inline='always')
def _sketch_index(h, row, wmask):
    h1 = h & np.uint64(0xFFFFFFFF)
    h2 = (h >> np.uint64(32)) | np.uint64(1)
    return np.int64((h1 + np.uint64(row) * h2) & np.uint64(wmask))


@jit(_nrt=False, inline='always')
def _tinylfu_record(adm, key):
    ameta, sketch, door = adm[0], adm[2], adm[3]
    wmask = ameta[A_WMASK]
    h = mix64(key)
    d = np.int64((h >> np.uint64(40)) & np.uint64(ameta[A_DMASK]))
    if door[d] == 0:
        door[d] = 1
    else:
        for r in range(SKETCH_ROWS):
            i = r * (wmask + 1) + _sketch_index(h, r, wmask)
            if sketch[i] < COUNTER_MAX:
                sketch[i] += 1
    ameta[A_ADDS] += 1
    if ameta[A_ADDS] >= ameta[A_PERIOD]:
        # Aging: halve every counter and forget the doorkeeper, so old popularity fades.
        for i in range(sketch.shape[0]):
            sketch[i] >>= 1
        door[:] = 0
        ameta[A_ADDS] = 0


@jit(_nrt=False, inline='always')
def _tinylfu_estimate(adm, key):
    ameta, sketch, door = adm[0], adm[2], adm[3]
    wmask = ameta[A_WMASK]
    h = mix64(key)
    est = 255
    for r in range(SKETCH_ROWS):
        v = sketch[r * (wmask + 1) + _sketch_index(h, r, wmask)]
        if v < est:
            est = v
    d = np.int64((h >> np.uint64(40)) & np.uint64(ameta[A_DMASK]))
    return est + door[d]


@jit(_nrt=False, inline='always')
def _threshold_admit(adm, key):
    ameta, counts = adm[0], adm[1]
    n = hm_find(counts, key)
    if n < 0:
        if ameta[A_HCOUNT] >= ameta[A_HLIMIT]:
            counts[:] = -1
            ameta[A_HCOUNT] = 0
        ameta[A_HCOUNT] += 1
        n = 1
    else:
        n += 1
    hm_insert(counts, key, n)
    return n >= ameta[A_THRESH]


# --------------------------------------------------------------------------- request


@jit(_nrt=False, inline='always')
def _access(st, adm, key, nu, pol):
    """Serve one request for ``key`` (next use ``nu``, read by belady only).

    Returns ``(hit, slot, evicted)``: on a hit the key's slot; on a miss the slot now
    holding the key, or -1 when it was not admitted (admission filter, or every candidate
    victim pinned), and the key evicted to make room (-1 when none).
    """
    meta = st[0]
    t = meta[M_TIME]
    meta[M_TIME] = t + 1
    kind = adm[0][A_KIND]
    if kind == ADM_TINYLFU:
        _tinylfu_record(adm, key)
    s = hm_find(st[2], key)
    if s >= 0:
        meta[M_HITS] += 1
        _on_hit(st, pol, s, t, nu)
        return True, s, np.int64(-1)
    meta[M_MISSES] += 1
    if kind == ADM_THRESHOLD and not _threshold_admit(adm, key):
        meta[M_REJECTS] += 1
        return False, np.int64(-1), np.int64(-1)
    _pre_miss(st, pol, key)
    evicted = np.int64(-1)
    if meta[M_NFREE] > 0:
        meta[M_NFREE] -= 1
        s = np.int64(st[12][meta[M_NFREE]])
    else:
        s = _choose_victim(st, pol)
        if s < 0:
            meta[M_REJECTS] += 1
            return False, np.int64(-1), np.int64(-1)
        if kind == ADM_TINYLFU and _tinylfu_estimate(adm, key) <= _tinylfu_estimate(adm, st[3][s]):
            meta[M_REJECTS] += 1
            return False, np.int64(-1), np.int64(-1)
        evicted = _evict(st, pol, s, True)
        meta[M_EVICTIONS] += 1
    _insert(st, pol, s, key, t, nu)
    return False, s, evicted


@jit(_nrt=False, inline='always')
def access_one(st, adm, key, nu):
    """Serve one request for ``key`` from inside another kernel (the store's batch path).

    ``st`` from :func:`make_cache_state`, ``adm`` from :func:`make_admission_state`; ``nu``
    is the request's next use for belady, else :data:`NEVER`. Returns ``(hit, slot,
    evicted)`` like :func:`serve` per request, and updates the cache's counters. Inlined
    into the caller at compile time (no per-call cost; the caller's compile takes ~20 s
    once, then loads from Numba's cache).
    """
    return _access(st, adm, key, nu, st[0][M_POL])


@jit(_nrt=False)
def serve(st, adm, keys, next_use, hit, slot, evicted):
    """Serve ``keys`` (``(n,)`` int64) in order; the one per-request loop of the simulator
    and the live cache. Returns the number of hits.

    ``next_use``: ``(n,)`` int64 next-request positions for belady, else length 0.
    ``hit`` (bool), ``slot``, ``evicted`` (int64): ``(n,)`` outputs, each filled only when
    it has n entries (the simulator passes empty arrays it does not need).
    """
    n = keys.shape[0]
    have_nu = next_use.shape[0] == n
    want_hit = hit.shape[0] == n
    want_slot = slot.shape[0] == n
    want_evicted = evicted.shape[0] == n
    pol = st[0][M_POL]
    index = st[2]
    hits = 0
    for i in range(n):
        if i + _SERVE_AHEAD < n:  # the map entry of a later key, fetched while this one is served
            prefetch_row(index, 2 * _home(index, keys[i + _SERVE_AHEAD]), 16)
        nu = next_use[i] if have_nu else NEVER
        h, s, e = _access(st, adm, keys[i], nu, pol)
        if h:
            hits += 1
        if want_hit:
            hit[i] = h
        if want_slot:
            slot[i] = s
        if want_evicted:
            evicted[i] = e
    return hits


@jit(_nrt=False)
def peek_batch(st, keys, out):
    """``out[i]`` = slot of ``keys[i]`` or -1, without touching policy state."""
    for i in range(keys.shape[0]):
        out[i] = hm_find(st[2], keys[i])
    return out


@jit(_nrt=False)
def remove_batch(st, keys, out):
    """Drop ``keys`` from the cache (no ghost) and clear their slots' pins; ``out[i]`` =
    freed slot or -1."""
    meta = st[0]
    pol = meta[M_POL]
    for i in range(keys.shape[0]):
        s = hm_find(st[2], keys[i])
        out[i] = s
        if s >= 0:
            _evict(st, pol, s, False)
            st[11][s] = 0
            st[12][meta[M_NFREE]] = s
            meta[M_NFREE] += 1
    return out


@jit(_nrt=False)
def pin_batch(st, slots, delta):
    """Add ``delta`` to the pin count of each slot (counts never drop below 0)."""
    pins = st[11]
    for i in range(slots.shape[0]):
        v = pins[slots[i]] + delta
        pins[slots[i]] = v if v > 0 else 0


@jit
def next_use_of(keys, table):
    """``(n,)`` int64: index of the next request for the same key, NEVER if none.
    ``table`` is an empty hash map sized for the distinct keys of ``keys``."""
    n = keys.shape[0]
    out = np.empty(n, dtype=np.int64)
    for i in range(n - 1, -1, -1):
        k = keys[i]
        j = hm_find(table, k)
        out[i] = NEVER if j < 0 else j
        hm_insert(table, k, i)
    return out

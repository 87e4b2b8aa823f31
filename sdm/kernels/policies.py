"""Cache-policy kernels: one state layout, every policy decomposed like libCacheSim.

A cache of ``capacity`` slots is a tuple of preallocated contiguous arrays made by
:func:`make_cache_state`; the same tuple serves the trace simulator and the live DRAM cache
of the store. The policy owns metadata only (which key sits in which slot, recency,
frequency, ghosts); the rows live in a buffer the caller indexes by slot.

Every request goes through ``_access`` (looped by the loop :func:`serve_for` compiles per
policy, one request from another kernel: :func:`access_one`):

``find`` (id -> slot map) -> hit: ``on_hit`` (promote / count)
miss: ``admit?`` -> ``pre_miss`` (ghost look-ups, ARC adaptation) -> free slot, or
``choose_victim`` (may reorganise queues, skips pinned slots) -> ``evict`` (the one eviction
funnel: unlink, ghost, map delete, counters) -> ``insert``.

Policy codes index :data:`POLICY_NAMES` (but for the internal :data:`LRU_LOG`). Queues are
intrusive doubly linked lists over slot ids: ``prev`` points toward the head (newest),
``next`` toward the tail (oldest), as in libCacheSim. FIFO and CLOCK use the slot ring
itself (a hand over slots ``0..c-1``), which is the same order as a linked FIFO with
reinsertion as long as no key is removed by hand.

The live cache runs LRU as :data:`LRU_LOG`, a recency log in place of the list (state
arrays 21 and 22): every access appends its slot, and the slot's position records its one
live entry; older entries of the slot go stale and are dropped when the victim scan passes
them or the log is compacted. A hit so writes one slot's position and appends to the log,
where moving a slot to the list's head rewrote both its neighbours' links: lines at random in
a cache of millions of slots. And a batch's hits may tie (:func:`hit_tied`), which the
victim scan orders by key, the order in which the simulator replays a batch's distinct keys;
so the live cache may serve a batch of hits in any order. Its decisions are the list's.
The simulator keeps the list: its caches' state sits in L2, where the log's extra entries
cost more than the list's moves (bench/RESULTS.md).

All kernels trust their inputs (keys >= 0, slots in range); :mod:`sdm.policies` validates.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import types
from numba.extending import overload

from sdm.kernels.jit import jit
from sdm.kernels.bag import prefetch_row
from sdm.kernels.memory import huge_full, huge_zeros
from sdm.kernels.hashmap import (_home, hm_delete, hm_entry, hm_find, hm_insert, hm_put, hm_value,
                                 make_hashmap_state, mix64)

POLICY_NAMES = ("lru", "fifo", "clock", "lfu", "sieve", "s3fifo", "arc", "random", "belady")
LRU, FIFO, CLOCK, LFU, SIEVE, S3FIFO, ARC, RANDOM, BELADY = range(9)
# LRU on a recency log (module docstring): the code :class:`sdm.policies.Cache` gives a
# guarded (live) cache for "lru". Not a name of its own: it decides exactly as LRU does.
LRU_LOG = 9
ADMISSION_NAMES = ("none", "threshold", "tinylfu")
ADM_NONE, ADM_THRESHOLD, ADM_TINYLFU = range(3)

# Keys ahead whose id -> slot map entry the serve loop prefetches: the map of a 10K-slot cache
# (2 MB at load 1/8: _map_spread) does not stay in L2 beside the rest of the state.
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
# LRU_LOG's recency log: its first entry not yet dropped, the next free entry, and where the ties
# are not yet ordered by key (every entry before it is in recency order).
M_LOG_HEAD, M_LOG_TAIL, M_LOG_ORDERED = 36, 37, 38
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


# Caches up to this many slots get a map at load <= 1/8 (at most 4 MB), larger ones <= 1/4.
_SMALL_MAP_SLOTS = 1 << 15


def _map_spread(capacity: int) -> int:
    """Entries per slot of a ``capacity``-slot cache's id -> slot map (the ``spread`` of
    :func:`sdm.kernels.hashmap.make_hashmap_state`).

    A hit probes the map once, a miss three times (find, the victim's delete, the shift
    back of its cluster), and each probe's branch on whether to go on mispredicts more at a
    higher load. A small map can afford the room: on bench_policies' trace (Zen 4, sdm.simulate,
    spread 8 over 4, alternated, medians of 5), at 1K, 10K and 32K slots (maps up to 4 MB,
    loads 0.12 against 0.24) fifo ran 1.14-1.34x as fast, clock 1.10-1.27x, lru 1.09-1.28x,
    sieve 1.07-1.20x and s3fifo 1.00-1.10x; at 60K and 120K slots (maps of 8 and 16 MB) fifo,
    lru and sieve ran 0.77-0.89x as fast, their maps no longer in the caches beside the rest
    of the state."""
    return 8 if capacity <= _SMALL_MAP_SLOTS else 4


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
    # Per-slot arrays are read at random by every probe: huge pages spare their page walks
    # (sdm.kernels.memory; below 2 MiB they are plain arrays).
    return (
        meta,
        fmeta,
        make_hashmap_state(c, _map_spread(c)),
        huge_full(c, -1, np.int64),                 # 3 key of slot (-1: free)
        huge_full(n_l, -1, np.int32),               # 4 prev (toward head)
        huge_full(n_l, -1, np.int32),               # 5 next (toward tail)
        huge_zeros(c, np.int32),                    # 6 freq / reference bits
        huge_zeros(c, np.int8),                     # 7 queue of slot
        huge_zeros(n_h, np.int64),                  # 8 heap priority of slot
        huge_zeros(n_h, np.int32),                  # 9 heap: position -> slot
        huge_full(n_h, -1, np.int32),               # 10 slot -> heap position
        huge_zeros(c, np.int32),                    # 11 pin count of slot
        np.arange(c - 1, -1, -1, dtype=np.int32),   # 12 free-slot stack (pops 0 first)
        make_hashmap_state(g, 4) if ghosts else np.full(8, -1, dtype=np.int64),  # 13 ghost map
        huge_full(g, -1, np.int64),                 # 14 ghost key
        huge_full(g, -1, np.int32),                 # 15 ghost prev
        huge_full(g, -1, np.int32),                 # 16 ghost next
        np.zeros(g, dtype=np.int8),                 # 17 ghost queue
        np.arange(g - 1, -1, -1, dtype=np.int32),   # 18 ghost free stack
        huge_full(c if guarded else 1, -1, np.int64),  # 19 use stamp of slot (guarded only)
        np.zeros(64 if guarded else 1, dtype=np.int64),     # 20 epochs in flight (guarded only)
        # 21 LRU_LOG: 1 + the log position of slot (0: none); uint32, as the log has < 2**32
        # entries (int64: the all-hit path 0.2-0.5 ns a lookup slower, 407K slots; Zen 4)
        huge_zeros(c if policy == LRU_LOG else 1, np.uint32),
        # 22 LRU_LOG's recency log, oldest first: entry = slot << 1 | tied with the entry before
        # it. Four times the slots: a compaction (at most c live entries) frees 3/4 of it, and
        # checks each entry's slot, so 4/3 checks an append; at twice the slots 2 checks, and
        # hit_tied cost 12-13 ns a hit against 8.6 (407K slots, all live; Zen 4). A cache of
        # over 2**30 slots gets 2**32 - 2 entries, still room for 2**31 appends.
        huge_zeros(min(4 * c, (1 << 32) - 2) if policy == LRU_LOG else 1, np.uint32),
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


# --------------------------------------------------------------------------- LRU_LOG's recency log


@jit(_nrt=False, inline='always')
def _log_slot(log, i):
    return np.int64(log[i]) >> 1


@jit(_nrt=False, inline='always')
def _log_live(pos, log, i):
    """Entry ``i`` is its slot's live entry (the slot's position names it)."""
    return pos[_log_slot(log, i)] == i + 1


@jit(_nrt=False)
def _log_compact(meta, pos, log):
    """Move the log's live entries, in order, to its start, dropping the stale ones; returns
    the new tail. A live entry stays tied to the live one before it when every entry between
    them was tied to its own predecessor (one batch's hits)."""
    head = meta[M_LOG_HEAD]
    tail = meta[M_LOG_TAIL]
    ordered = meta[M_LOG_ORDERED]
    k = 0
    kept_ordered = 0
    chain = False  # every entry since the last one kept is tied to its predecessor
    for i in range(head, tail):
        if i + 64 < tail:  # 4.9 ns an entry against 5.4 at 16 ahead (407K slots; Zen 4)
            prefetch_row(pos, _log_slot(log, i + 64), 8)
        e = np.int64(log[i])
        chain = chain and (e & 1) == 1
        if _log_live(pos, log, i):
            s = e >> 1
            log[k] = np.uint32((s << 1) | (1 if chain else 0))
            pos[s] = k + 1
            k += 1
            if i < ordered:
                kept_ordered = k
            chain = True
    meta[M_LOG_HEAD] = 0
    meta[M_LOG_TAIL] = k
    meta[M_LOG_ORDERED] = kept_ordered
    return k


@jit(_nrt=False, inline='always')
def _log_append(meta, pos, log, s):
    """Slot ``s`` becomes the most recent."""
    tail = meta[M_LOG_TAIL]
    if tail == log.shape[0]:
        # at most c entries are live (s's old one included), so 3/4 of the log frees
        tail = _log_compact(meta, pos, log)
    log[tail] = np.uint32(s << 1)
    pos[s] = tail + 1
    meta[M_LOG_TAIL] = tail + 1


@jit(_nrt=False, inline='always')
def _key_after(skey, log, a, b):
    return skey[_log_slot(log, a)] > skey[_log_slot(log, b)]


@jit(_nrt=False, inline='always')
def _sift_down(skey, log, base, root, end):
    while True:
        child = 2 * (root - base) + 1 + base
        if child >= end:
            return
        if child + 1 < end and _key_after(skey, log, child + 1, child):
            child += 1
        if not _key_after(skey, log, child, root):
            return
        e = log[root]
        log[root] = log[child]
        log[child] = e
        root = child


@jit(_nrt=False)
def _log_order_ties(meta, pos, log, skey, i):
    """Order the entries tied with entry ``i`` (one batch's hits) by key, the least recent
    first, as the simulator replays a batch's distinct keys; the stale ones among them are
    dropped. Every entry before the group's end is then in recency order (M_LOG_ORDERED)."""
    tail = meta[M_LOG_TAIL]
    j = i + 1
    while j < tail and (log[j] & 1) == 1:
        j += 1
    meta[M_LOG_ORDERED] = j
    k = i
    for m in range(i, j):  # the live entries to the front; the rest of [k, j) is stale
        if _log_live(pos, log, m):
            pos[_log_slot(log, m)] = k + 1
            log[k] = log[m]
            k += 1
    for r in range(i + (k - i) // 2 - 1, i - 1, -1):  # heapsort by key, in place
        _sift_down(skey, log, i, r, k)
    for end in range(k - 1, i, -1):
        e = log[i]
        log[i] = log[end]
        log[end] = e
        _sift_down(skey, log, i, i, end)
    for m in range(i, k):
        s = _log_slot(log, m)
        log[m] = np.uint32((s << 1) | (1 if m > i else 0))
        pos[s] = m + 1


def lru_order(st) -> np.ndarray:
    """``(size,)`` int64: the resident slots of an :data:`LRU_LOG` cache state, least recent
    first, the order its victim scan walks (a batch's tied hits by key). For tests and
    debugging."""
    meta, skey, pos, log = st[0], st[3], st[21], st[22]
    head, tail = int(meta[M_LOG_HEAD]), int(meta[M_LOG_TAIL])
    entries = log[head:tail].astype(np.int64)
    slots = entries >> 1
    live = pos[slots] == np.arange(head + 1, tail + 1)
    group = np.cumsum((entries & 1) == 0)  # an untied entry starts a group
    slots, group = slots[live], group[live]
    return slots[np.lexsort((skey[slots], group))]


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
    meta = st[0]
    prio = st[8]
    heap = st[9]
    hpos = st[10]
    n = meta[M_HEAPN]
    heap[n] = s
    hpos[s] = n
    meta[M_HEAPN] = n + 1
    _heap_up(prio, heap, hpos, n)


@jit(_nrt=False, inline='always')
def _heap_remove(st, s):
    meta = st[0]
    prio = st[8]
    heap = st[9]
    hpos = st[10]
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
    meta = st[0]
    prio = st[8]
    heap = st[9]
    hpos = st[10]
    _heap_up(prio, heap, hpos, hpos[s])
    _heap_down(prio, heap, hpos, hpos[s], meta[M_HEAPN])


# --------------------------------------------------------------------------- ghosts


@jit(_nrt=False, inline='always')
def _ghost_add(st, q, key):
    """Remember an evicted key in ghost queue ``q`` (FIFO: the oldest ghost is dropped)."""
    meta = st[0]
    gtable = st[13]
    gkey = st[14]
    gprev = st[15]
    gnext = st[16]
    gq = st[17]
    gfree = st[18]
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
    meta = st[0]
    gtable = st[13]
    gkey = st[14]
    gprev = st[15]
    gnext = st[16]
    gq = st[17]
    gfree = st[18]
    _unlink(meta, G_BASE + 3 * gq[g], gprev, gnext, g)
    hm_delete(gtable, gkey[g])
    gkey[g] = -1
    gfree[meta[M_NGFREE]] = g
    meta[M_NGFREE] += 1


# --------------------------------------------------------------------------- policy steps
#
# Each step has one function per policy (or per group of policies that share it) and a
# dispatcher, ``_on_hit(st, pol, ...)`` and so on, that branches on the policy code ``pol``.
# Where ``pol`` is a compile-time constant (the loops :func:`serve_for` compiles per policy)
# the dispatcher's overload inlines that policy's function alone, so the loop neither carries
# nor compiles the other policies' steps; for a code read at run time (the live cache's
# ``access_one``) the dispatcher itself is inlined, with every policy's steps. A policy's
# function takes the dispatcher's arguments, ``pol`` included, so it can stand in its place.
#
# The kernels that these steps inline bind the state's arrays one per statement
# (``heap = st[9]``), never by unpacking (``prio, heap = st[8], st[9]``): under an overload's
# inlining Numba 0.68 bound the unpacked names to the wrong arrays (belady's heap and
# position arrays as one), which belady's reference test and S3-FIFO's miss ratio against
# libCacheSim caught.


@jit(_nrt=False, inline='always')
def _belady_prio(nu, t):
    # Min-heap priority: the farthest next use on top. Keys never requested again tie on
    # NEVER; breaking the tie by recency (most recent first) keeps victims deterministic,
    # which admission filters that compare against the victim need.
    if nu >= NEVER:
        return -(NEVER + t)
    return -nu


def _step_for(pol, steps, dispatch):
    """What a step's overload inlines for the policy code type ``pol``: the function of
    ``steps`` (a tuple indexed by policy code) when the code is a literal, else the
    dispatcher ``dispatch``."""
    if isinstance(pol, types.IntegerLiteral):
        return steps[pol.literal_value].py_func
    return dispatch


@jit(_nrt=False, inline='always')
def _hit_lru(st, pol, s, t, nu):
    meta = st[0]
    if meta[Q_BASE] != s:  # hot keys are often already most recent
        _unlink(meta, Q_BASE, st[4], st[5], s)
        _push_head(meta, Q_BASE, st[4], st[5], s)


@jit(_nrt=False, inline='always')
def _hit_lru_log(st, pol, s, t, nu):
    meta = st[0]
    pos = st[21]
    log = st[22]
    tail = meta[M_LOG_TAIL]
    if pos[s] != tail or (log[tail - 1] & 1) == 1:  # else already the most recent, alone
        _log_append(meta, pos, log, s)


@jit(_nrt=False, inline='always')
def _hit_none(st, pol, s, t, nu):
    pass


@jit(_nrt=False, inline='always')
def _hit_bit(st, pol, s, t, nu):  # CLOCK, SIEVE: the reference bit
    st[6][s] = 1


@jit(_nrt=False, inline='always')
def _hit_lfu(st, pol, s, t, nu):
    freq = st[6]
    freq[s] += 1
    st[8][s] = (np.int64(freq[s]) << 40) | t
    _heap_down(st[8], st[9], st[10], st[10][s], st[0][M_HEAPN])


@jit(_nrt=False, inline='always')
def _hit_count(st, pol, s, t, nu):  # S3-FIFO
    st[6][s] += 1


@jit(_nrt=False, inline='always')
def _hit_arc(st, pol, s, t, nu):
    meta = st[0]
    q = st[7][s]
    _unlink(meta, Q_BASE + 3 * q, st[4], st[5], s)
    st[7][s] = 1
    _push_head(meta, Q_BASE + 3, st[4], st[5], s)


@jit(_nrt=False, inline='always')
def _hit_belady(st, pol, s, t, nu):
    st[8][s] = _belady_prio(nu, t)
    _heap_fix(st, s)


_ON_HIT = (_hit_lru, _hit_none, _hit_bit, _hit_lfu, _hit_bit, _hit_count, _hit_arc, _hit_none,
           _hit_belady, _hit_lru_log)  # indexed by policy code


def _on_hit(st, pol, s, t, nu):
    """Promote / count slot ``s`` on a hit at time ``t`` (next use ``nu``: belady)."""
    if pol == LRU:
        _hit_lru(st, pol, s, t, nu)
    elif pol == LRU_LOG:
        _hit_lru_log(st, pol, s, t, nu)
    elif pol == CLOCK or pol == SIEVE:
        _hit_bit(st, pol, s, t, nu)
    elif pol == LFU:
        _hit_lfu(st, pol, s, t, nu)
    elif pol == S3FIFO:
        _hit_count(st, pol, s, t, nu)
    elif pol == ARC:
        _hit_arc(st, pol, s, t, nu)
    elif pol == BELADY:
        _hit_belady(st, pol, s, t, nu)


@overload(_on_hit, prefer_literal=True, inline='always')
def _ol_on_hit(st, pol, s, t, nu):
    return _step_for(pol, _ON_HIT, _on_hit)


@jit(_nrt=False, inline='always')
def _pre_miss_none(st, pol, key):
    st[0][M_FLAG] = 0


@jit(_nrt=False, inline='always')
def _pre_miss_s3fifo(st, pol, key):
    meta = st[0]
    meta[M_FLAG] = 0
    if meta[M_GHOST_CAP] > 0:
        g = hm_find(st[13], key)
        if g >= 0:
            _ghost_drop(st, g)
            meta[M_FLAG] = F_TO_MAIN


@jit(_nrt=False, inline='always')
def _pre_miss_arc(st, pol, key):
    meta = st[0]
    meta[M_FLAG] = 0
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


_PRE_MISS = (_pre_miss_none, _pre_miss_none, _pre_miss_none, _pre_miss_none, _pre_miss_none,
             _pre_miss_s3fifo, _pre_miss_arc, _pre_miss_none, _pre_miss_none, _pre_miss_none)


def _pre_miss(st, pol, key):
    """Ghost bookkeeping of a miss before any eviction (S3-FIFO, ARC)."""
    if pol == S3FIFO:
        _pre_miss_s3fifo(st, pol, key)
    elif pol == ARC:
        _pre_miss_arc(st, pol, key)
    else:
        _pre_miss_none(st, pol, key)


@overload(_pre_miss, prefer_literal=True, inline='always')
def _ol_pre_miss(st, pol, key):
    return _step_for(pol, _PRE_MISS, _pre_miss)


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
    meta = st[0]
    prio = st[8]
    heap = st[9]
    pins = st[11]
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


# Victim choices (all slots are occupied): the slot to evict, or -1 if every candidate is
# held. Each may reorganise the policy state the way its eviction does (clock hands clear
# bits, S3-FIFO promotes small-queue keys to main); the victim itself stays in place.


@jit(_nrt=False, inline='always')
def _victim_lru(st, pol):
    return _tail_unpinned(st, st[0], Q_BASE, st[4], st[11])


@jit(_nrt=False, inline='always')
def _victim_lru_log(st, pol):
    meta = st[0]
    pins = st[11]
    pos = st[21]
    log = st[22]
    tail = meta[M_LOG_TAIL]
    i = meta[M_LOG_HEAD]
    while i < tail and not _log_live(pos, log, i):  # stale entries at the front go
        i += 1
    meta[M_LOG_HEAD] = i
    while i < tail:
        if i >= meta[M_LOG_ORDERED]:
            if i + 1 < tail and (log[i + 1] & 1) == 1:
                _log_order_ties(meta, pos, log, st[3], i)
            else:
                meta[M_LOG_ORDERED] = i + 1
        s = _log_slot(log, i)
        if _log_live(pos, log, i) and not _held(st, pins, s):
            return s
        i += 1
    return np.int64(-1)


@jit(_nrt=False, inline='always')
def _victim_hand(st, clock):
    """FIFO (``clock`` False) and CLOCK: the hand over the slot ring."""
    meta = st[0]
    freq = st[6]
    pins = st[11]
    c = meta[M_CAP]
    h = meta[M_HAND]
    for _ in range(2 * c + 1):
        if not _held(st, pins, h):
            if not clock or freq[h] == 0:
                return h
            freq[h] = 0
        h += 1
        if h == c:
            h = 0
        meta[M_HAND] = h
    return -1


@jit(_nrt=False, inline='always')
def _victim_fifo(st, pol):
    return _victim_hand(st, False)


@jit(_nrt=False, inline='always')
def _victim_clock(st, pol):
    return _victim_hand(st, True)


@jit(_nrt=False, inline='always')
def _victim_sieve(st, pol):
    meta = st[0]
    prev = st[4]
    freq = st[6]
    pins = st[11]
    c = meta[M_CAP]
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


@jit(_nrt=False, inline='always')
def _victim_heap(st, pol):  # LFU, BELADY
    top = st[9][0]
    if not _held(st, st[11], top):
        return top
    return _scan_unpinned(st)


@jit(_nrt=False, inline='always')
def _victim_random(st, pol):
    meta = st[0]
    pins = st[11]
    c = meta[M_CAP]
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


@jit(_nrt=False, inline='always')
def _victim_s3fifo(st, pol):
    meta = st[0]
    prev = st[4]
    nxt = st[5]
    freq = st[6]
    sq = st[7]
    pins = st[11]
    c = meta[M_CAP]
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


@jit(_nrt=False, inline='always')
def _victim_arc(st, pol):
    meta = st[0]
    prev = st[4]
    pins = st[11]
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


_VICTIM = (_victim_lru, _victim_fifo, _victim_clock, _victim_heap, _victim_sieve, _victim_s3fifo,
           _victim_arc, _victim_random, _victim_heap, _victim_lru_log)


def _choose_victim(st, pol):
    """Slot to evict (all slots are occupied), or -1 if every candidate is held."""
    if pol == LRU:
        return _victim_lru(st, pol)
    if pol == LRU_LOG:
        return _victim_lru_log(st, pol)
    if pol == FIFO:
        return _victim_fifo(st, pol)
    if pol == CLOCK:
        return _victim_clock(st, pol)
    if pol == SIEVE:
        return _victim_sieve(st, pol)
    if pol == LFU or pol == BELADY:
        return _victim_heap(st, pol)
    if pol == RANDOM:
        return _victim_random(st, pol)
    if pol == S3FIFO:
        return _victim_s3fifo(st, pol)
    if pol == ARC:
        return _victim_arc(st, pol)
    return -1


@overload(_choose_victim, prefer_literal=True, inline='always')
def _ol_choose_victim(st, pol):
    return _step_for(pol, _VICTIM, _choose_victim)


@jit(_nrt=False, inline='always')
def _unlink_lru(st, pol, s, ghost):
    _unlink(st[0], Q_BASE, st[4], st[5], s)


@jit(_nrt=False, inline='always')
def _unlink_lru_log(st, pol, s, ghost):
    meta = st[0]
    pos = st[21]
    if pos[s] == meta[M_LOG_HEAD] + 1:  # the victim scan's usual find: drop it at once
        meta[M_LOG_HEAD] += 1
    pos[s] = 0


@jit(_nrt=False, inline='always')
def _unlink_sieve(st, pol, s, ghost):
    meta = st[0]
    if meta[M_HAND] == s:
        meta[M_HAND] = st[4][s]
    _unlink(meta, Q_BASE, st[4], st[5], s)


@jit(_nrt=False, inline='always')
def _unlink_none(st, pol, s, ghost):  # FIFO, CLOCK, RANDOM: the slot ring has no links
    pass


@jit(_nrt=False, inline='always')
def _unlink_s3fifo(st, pol, s, ghost):
    q = st[7][s]
    _unlink(st[0], Q_BASE + 3 * q, st[4], st[5], s)
    if ghost and q == 0:
        _ghost_add(st, 0, st[3][s])


@jit(_nrt=False, inline='always')
def _unlink_arc(st, pol, s, ghost):
    meta = st[0]
    q = st[7][s]
    _unlink(meta, Q_BASE + 3 * q, st[4], st[5], s)
    if ghost and not (meta[M_FLAG] & F_NO_GHOST):
        _ghost_add(st, q, st[3][s])


@jit(_nrt=False, inline='always')
def _unlink_heap(st, pol, s, ghost):  # LFU, BELADY
    _heap_remove(st, s)


_UNLINK = (_unlink_lru, _unlink_none, _unlink_none, _unlink_heap, _unlink_sieve, _unlink_s3fifo,
           _unlink_arc, _unlink_none, _unlink_heap, _unlink_lru_log)


def _unlink_slot(st, pol, s, ghost):
    """Take slot ``s`` out of the policy's order, remembering its key in a ghost queue when
    ``ghost`` (S3-FIFO small queue, ARC)."""
    if pol == LRU:
        _unlink_lru(st, pol, s, ghost)
    elif pol == LRU_LOG:
        _unlink_lru_log(st, pol, s, ghost)
    elif pol == SIEVE:
        _unlink_sieve(st, pol, s, ghost)
    elif pol == S3FIFO:
        _unlink_s3fifo(st, pol, s, ghost)
    elif pol == ARC:
        _unlink_arc(st, pol, s, ghost)
    elif pol == LFU or pol == BELADY:
        _unlink_heap(st, pol, s, ghost)


@overload(_unlink_slot, prefer_literal=True, inline='always')
def _ol_unlink_slot(st, pol, s, ghost):
    return _step_for(pol, _UNLINK, _unlink_slot)


@jit(_nrt=False, inline='always')
def _evict(st, pol, s, ghost):
    """The one eviction funnel: unlink slot ``s`` from the policy, remember it in a ghost
    queue when ``ghost`` (S3-FIFO small queue, ARC), drop it from the map, free the slot.
    Returns the key that left."""
    meta = st[0]
    skey = st[3]
    key = skey[s]
    _unlink_slot(st, pol, s, ghost)
    hm_delete(st[2], key)
    skey[s] = -1
    st[6][s] = 0
    meta[M_SIZE] -= 1
    return key


@jit(_nrt=False, inline='always')
def _link_lru_log(st, pol, s, t, nu):
    _log_append(st[0], st[21], st[22], s)


@jit(_nrt=False, inline='always')
def _link_list(st, pol, s, t, nu):  # LRU, SIEVE: the newest at the head
    _push_head(st[0], Q_BASE, st[4], st[5], s)


@jit(_nrt=False, inline='always')
def _link_hand(st, pol, s, t, nu):  # FIFO, CLOCK
    # The new key takes the hand's slot and becomes the newest: advance past it.
    meta = st[0]
    if meta[M_NFREE] == 0 and meta[M_HAND] == s:
        h = s + 1
        meta[M_HAND] = 0 if h == meta[M_CAP] else h


@jit(_nrt=False, inline='always')
def _link_lfu(st, pol, s, t, nu):
    st[6][s] = 1
    st[8][s] = (np.int64(1) << 40) | t
    _heap_push(st, s)


@jit(_nrt=False, inline='always')
def _link_belady(st, pol, s, t, nu):
    st[8][s] = _belady_prio(nu, t)
    _heap_push(st, s)


@jit(_nrt=False, inline='always')
def _link_s3fifo(st, pol, s, t, nu):
    meta = st[0]
    if (meta[M_FLAG] & F_TO_MAIN) or (meta[M_HAS_EVICTED] == 0 and meta[Q_BASE + 2] >= meta[M_SMALL_CAP]):
        st[7][s] = 1
        _push_head(meta, Q_BASE + 3, st[4], st[5], s)
    else:
        st[7][s] = 0
        _push_head(meta, Q_BASE, st[4], st[5], s)


@jit(_nrt=False, inline='always')
def _link_arc(st, pol, s, t, nu):
    meta = st[0]
    q = 1 if meta[M_FLAG] & F_TO_MAIN else 0
    st[7][s] = q
    _push_head(meta, Q_BASE + 3 * q, st[4], st[5], s)


@jit(_nrt=False, inline='always')
def _link_none(st, pol, s, t, nu):  # RANDOM
    pass


_LINK = (_link_list, _link_hand, _link_hand, _link_lfu, _link_list, _link_s3fifo, _link_arc,
         _link_none, _link_belady, _link_lru_log)


def _link_slot(st, pol, s, t, nu):
    """Put the newly filled slot ``s`` into the policy's order."""
    if pol == LRU or pol == SIEVE:
        _link_list(st, pol, s, t, nu)
    elif pol == LRU_LOG:
        _link_lru_log(st, pol, s, t, nu)
    elif pol == FIFO or pol == CLOCK:
        _link_hand(st, pol, s, t, nu)
    elif pol == LFU:
        _link_lfu(st, pol, s, t, nu)
    elif pol == BELADY:
        _link_belady(st, pol, s, t, nu)
    elif pol == S3FIFO:
        _link_s3fifo(st, pol, s, t, nu)
    elif pol == ARC:
        _link_arc(st, pol, s, t, nu)


@overload(_link_slot, prefer_literal=True, inline='always')
def _ol_link_slot(st, pol, s, t, nu):
    return _step_for(pol, _LINK, _link_slot)


@jit(_nrt=False, inline='always')
def _insert(st, pol, s, key, t, nu):
    """Give slot ``s`` to ``key``, which the caller has already put in the map."""
    st[3][s] = key
    st[0][M_SIZE] += 1
    st[6][s] = 0
    _link_slot(st, pol, s, t, nu)


# --------------------------------------------------------------------------- admission


@jit(_nrt=False, inline='always')
def _sketch_index(h, row, wmask):
    h1 = h & np.uint64(0xFFFFFFFF)
    h2 = (h >> np.uint64(32)) | np.uint64(1)
    return np.int64((h1 + np.uint64(row) * h2) & np.uint64(wmask))


@jit(_nrt=False, inline='always')
def _tinylfu_record(adm, key):
    ameta = adm[0]
    sketch = adm[2]
    door = adm[3]
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
    ameta = adm[0]
    sketch = adm[2]
    door = adm[3]
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
    ameta = adm[0]
    counts = adm[1]
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


@jit(_nrt=False, inline='always')
def _next_victim_hint(st, pol):
    """The slot the next eviction looks at first, or -1: the tail (LRU), the oldest live
    entry of the log's first 8 (LRU_LOG), the hand (FIFO, SIEVE); -1 for the other
    policies, whose next victim is not known before it is chosen. LRU_LOG's look reads
    those entries' positions, random lines: bench_hierarchy's lru probe at a 0.53 hit rate
    took 21.4-21.9 ns a lookup with no look, 17.4-17.6 looking at 4 entries, 16.6-16.9 at 8
    or 16 (Zen 4; the list's 16.3)."""
    meta = st[0]
    if pol == FIFO:
        return meta[M_HAND]
    if pol == LRU:
        return meta[Q_BASE + 1]
    if pol == LRU_LOG:
        pos = st[21]
        log = st[22]
        head = meta[M_LOG_HEAD]
        end = min(head + 8, meta[M_LOG_TAIL])
        for i in range(head, end):
            if _log_live(pos, log, i):
                return _log_slot(log, i)
        return np.int64(-1)
    if pol == SIEVE:
        v = meta[M_HAND]
        return meta[Q_BASE + 1] if v < 0 else v
    return np.int64(-1)


@jit(_nrt=False, inline='always')
def prefetch_next_victim(st, pol):
    """After a miss, fetch what evicting the next victim will touch: its key's map entry
    (the delete) and, for the lists, its link toward the head (the new tail); returns that
    victim's slot, or -1 (a caller may fetch more of its lines). The next miss
    comes a few requests later, so the lines arrive in time. LRU, FIFO and SIEVE only: their
    next victim is known now (the tail or the log's oldest entry, the hand). On
    bench_policies' trace (Zen 4, a loop without outputs) LRU ran 8-10% faster, FIFO and SIEVE
    2%; CLOCK, whose hand skips referenced slots, not at all."""
    v = _next_victim_hint(st, pol)
    if v >= 0:
        k = st[3][v]
        if k >= 0:
            index = st[2]
            prefetch_row(index, 2 * _home(index, k), 16)
        if pol == LRU or pol == SIEVE:
            prefetch_row(st[4], v, 1)
    return v


# --------------------------------------------------------------------------- request


@jit(_nrt=False, inline='always')
def _access(st, adm, key, nu, pol, kind, t):
    """Serve one request for ``key`` (next use ``nu``, read by belady only) at time ``t``
    (the cache's request count before it) in a cache running policy ``pol`` behind
    admission filter ``kind`` (codes). The caller counts the request and its hit or miss
    (``M_TIME``, ``M_HITS``, ``M_MISSES``): a loop keeps them in registers.

    Returns ``(hit, slot, evicted)``: on a hit the key's slot; on a miss the slot now
    holding the key, or -1 when it was not admitted (admission filter, or every candidate
    victim pinned), and the key evicted to make room (-1 when none).
    """
    meta = st[0]
    if kind == ADM_TINYLFU:
        _tinylfu_record(adm, key)
    index = st[2]
    # Only _evict and the put below change the map, so the entry found here is where the
    # key goes on a miss: put there before the victim's delete (which may shift it back),
    # the key is probed for once.
    e = hm_entry(index, key)
    s = hm_value(index, e)
    if s >= 0:
        _on_hit(st, pol, s, t, nu)
        return True, s, np.int64(-1)
    if kind == ADM_THRESHOLD and not _threshold_admit(adm, key):
        meta[M_REJECTS] += 1
        return False, np.int64(-1), np.int64(-1)
    _pre_miss(st, pol, key)
    evicted = np.int64(-1)
    if meta[M_NFREE] > 0:
        meta[M_NFREE] -= 1
        s = np.int64(st[12][meta[M_NFREE]])
        hm_put(index, e, key, s)
    else:
        s = _choose_victim(st, pol)
        if s < 0:
            meta[M_REJECTS] += 1
            return False, np.int64(-1), np.int64(-1)
        if kind == ADM_TINYLFU and _tinylfu_estimate(adm, key) <= _tinylfu_estimate(adm, st[3][s]):
            meta[M_REJECTS] += 1
            return False, np.int64(-1), np.int64(-1)
        hm_put(index, e, key, s)
        evicted = _evict(st, pol, s, True)
        meta[M_EVICTIONS] += 1
    _insert(st, pol, s, key, t, nu)
    return False, s, evicted


@jit(_nrt=False, inline='always')
def access_one(st, adm, key, nu, pol):
    """Serve one request for ``key`` from inside another kernel (the store's batch path).

    ``st`` from :func:`make_cache_state` for policy code ``pol``, ``adm`` from
    :func:`make_admission_state`; ``nu`` is the request's next use for belady, else
    :data:`NEVER`. Returns ``(hit, slot, evicted)`` like :func:`serve_for`'s loop per
    request, and updates the cache's counters. Inlined into the caller at compile time (no
    per-call cost). Make ``pol`` a constant of the caller (a closure variable, as
    :func:`sdm.kernels.serve.probe_batch_for` does): then only that policy's steps are
    inlined and the caller compiles in seconds; a run-time code inlines every policy's, a
    compile of 80-115 s.
    """
    meta = st[0]
    t = meta[M_TIME]
    meta[M_TIME] = t + 1
    out = _access(st, adm, key, nu, pol, adm[0][A_KIND], t)
    if out[0]:
        meta[M_HITS] += 1
    else:
        meta[M_MISSES] += 1
    return out


@jit(_nrt=False, inline='always')
def hit_one(st, s, pol):
    """Serve a request whose key the caller found in slot ``s``, from inside another kernel:
    :func:`access_one`'s hit, without the map probe. Not for a cache behind TinyLFU, which
    counts every request in its sketch."""
    meta = st[0]
    t = meta[M_TIME]
    meta[M_TIME] = t + 1
    meta[M_HITS] += 1
    _on_hit(st, pol, s, t, NEVER)


@jit(_nrt=False, inline='always')
def hit_tied(st, slots, u):
    """Serve one batch's ``u`` distinct hits, on ``slots[:u]`` (int64), in an
    :data:`LRU_LOG` cache, from inside another kernel: as :func:`hit_one` on each, but tied,
    as recent as each other, so their order does not matter (the victim scan takes them by
    key, as the simulator replays a batch). One pass, the log's tail kept in a register."""
    meta = st[0]
    pos = st[21]
    log = st[22]
    tail = meta[M_LOG_TAIL]
    if tail + u > log.shape[0]:
        # at most c entries are live, and u <= c: the compacted log has room for all u
        tail = _log_compact(meta, pos, log)
    for k in range(u):
        s = slots[k]
        log[tail + k] = np.uint32((s << 1) | (1 if k > 0 else 0))
        pos[s] = tail + k + 1
    meta[M_LOG_TAIL] = tail + u
    meta[M_TIME] += u
    meta[M_HITS] += u


@functools.lru_cache(maxsize=None)
def serve_for(policy: int, admission: int, outputs: bool):
    """The simulator's per-request loop compiled for one policy, one admission kind (codes)
    and whether it writes per-request outputs: ``serve(st, adm, keys, next_use, hit, slot,
    evicted) -> hits``.

    ``serve`` serves ``keys`` (``(n,)`` int64) in order through the cache whose state ``st``
    (:func:`make_cache_state`) runs ``policy`` behind ``adm`` (:func:`make_admission_state`,
    of kind ``admission``), and returns the number of hits; at a negative key ``keys[i]``
    (the map's empty mark) it stops and returns ``-1 - i``, the keys before it served and
    the counters not updated. So a caller whose cache lives on validates the keys first,
    and one that drops the cache on that error (``sdm.simulate``) reads them once, not
    twice (a separate pass over 4M keys took 3% of the replay, Zen 4). ``next_use``: ``(n,)`` int64
    next-request positions for belady, else length 0. ``hit`` (bool), ``slot``, ``evicted``
    (int64): ``(n,)`` outputs; with ``outputs``, each is filled when it has n entries (the
    simulator passes empty arrays it does not need); without, none is touched.

    All three are constants of the compiled loop: it inlines only its own policy's steps
    (the overloads above) and admission filter, so it compiles in 2-4 s where one loop for
    every policy took 20-40 s, and runs 1.1-1.3x faster than one that branched on the codes
    per request (Zen 4, bench_policies' trace; bench/RESULTS.md). A loop that counts hits
    only runs 8% faster again than one that tests for its outputs per request (lru, same
    trace). Each loop compiles once per machine, then loads from Numba's cache.
    """
    policy, admission, outputs = int(policy), int(admission), bool(outputs)

    @jit(_nrt=False)
    def serve(st, adm, keys, next_use, hit, slot, evicted):
        n = keys.shape[0]
        have_nu = next_use.shape[0] == n
        want_hit = outputs and hit.shape[0] == n
        want_slot = outputs and slot.shape[0] == n
        want_evicted = outputs and evicted.shape[0] == n
        index = st[2]
        meta = st[0]
        t0 = meta[M_TIME]
        hits = 0
        for i in range(n):
            if i + _SERVE_AHEAD < n:  # the map entry of a later key, fetched while this one is served
                prefetch_row(index, 2 * _home(index, keys[i + _SERVE_AHEAD]), 16)
            key = keys[i]
            if key < 0:
                return -1 - i
            nu = next_use[i] if policy == BELADY and have_nu else NEVER
            h, s, e = _access(st, adm, key, nu, policy, admission, t0 + i)
            if h:
                hits += 1
            else:
                prefetch_next_victim(st, policy)
            if want_hit:
                hit[i] = h
            if want_slot:
                slot[i] = s
            if want_evicted:
                evicted[i] = e
        meta[M_TIME] = t0 + n
        meta[M_HITS] += hits
        meta[M_MISSES] += n - hits
        return hits

    return serve


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

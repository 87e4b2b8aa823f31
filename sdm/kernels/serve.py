"""The DRAM cache's batch path: probe a batch of keys, plan where every row will sit.

One call serves the distinct cache keys of one request, every table's, in ascending order
(so table by table, each table's ids ascending), through
the shared policy kernels (:func:`sdm.kernels.policies.access_one`), exactly the key stream
the simulator replays, so the live cache and ``sdm.simulate`` count the same hits. Where the
policy's hits commute, a batch that only hits may instead be served by one pass over its
lookups (:func:`hit_batch_for`), which leaves the same state.

Rows live in the caller's ``slots`` buffer: rows ``[0, capacity)`` are cache slots, the rows
after them scratch, of which each batch in flight owns a range starting at its
``scratch_start``. After the batch probe (:func:`probe_batch_for`), ``ptr[j]`` is the row of
``slots`` that will hold id ``j``'s row for this batch, every ``ptr`` distinct:

* a hit points at its slot;
* an admitted miss points at the slot the policy gave it (filled by the caller after the
  read from the tier below);
* a miss the policy did not admit (admission filter, every victim held) points at scratch.

A slot assigned to an id earlier in the same batch can be taken again by a later miss (the
policy does not know the batch is still using it). The earlier owner is then moved to
scratch: a hit's row is copied there at once (its bytes are in the slot now); a miss's row
has not been read yet, so only its pointer moves. A slot's use stamp (below) records which
id of the current batch it serves.

Many batches may be in flight (their reads run outside the cache's lock), so a slot also
has a state in ``state`` (:data:`READY_BITS`): ``SLOT_READY`` (its row is there),
``SLOT_PENDING`` (a batch is reading its row: the slot was given to a miss) or
``SLOT_FAILED`` (that read failed: the next batch to hit it reads it again, so it is planned
as a miss); bit :data:`PREFETCHED` marks a row a prefetch read that no demand batch used yet.

No slot another batch in flight reads is evicted, mostly without a pin per slot: the probe
stamps every slot it places with ``epoch << 32 | position`` in the policy's use array (state
array 19), the caller lists the epochs of the other batches in flight in the policy state
(``M_FLYING``), and the victim choice skips slots stamped by any of them
(:func:`sdm.kernels.policies._held`). A slot already stamped by a batch in flight keeps that
stamp and is pinned instead, the pin dropped when this batch ends (``shared``). So a batch
costs one stamp per slot and no unpinning, unless batches share rows while both are in
flight; with no other batch in flight nothing is held, and a single thread's decisions stay
exactly the simulator's.
"""

from __future__ import annotations

import functools

from sdm.kernels.jit import jit
from sdm.kernels.bag import prefetch_row
from sdm.kernels.hashmap import _home, hm_find
from sdm.kernels.policies import (ADM_TINYLFU, CLOCK, FIFO, LRU_LOG, M_FLYING, NEVER, RANDOM, S3FIFO, SIEVE,
                                  access_one, flying, hit_one, hit_tied, prefetch_next_victim)


#: A cache key is ``table_id << TABLE_SHIFT | row id`` (row ids are < 2**48, TableSpec's limit),
#: so one directory serves every table of a store and the simulator replays the same keys.
TABLE_SHIFT = 48

# Prefetch pipeline of the probe, in keys ahead: a probe of a cache this size takes a cache
# miss for the key's hash-map entry, then one for each per-slot array it touches. The entry
# of key j + _AHEAD_ENTRY is fetched; then key j + _AHEAD_SLOT is looked up (its entry
# arrived meanwhile) and its slot's state, stamp and policy metadata are fetched.
# bench_hierarchy's lru probe, all hits, with a list for LRU: 21.0 ms a pass at 16 / 8 (and 4
# for the list's neighbours), 18.9-19.3 at 32 / 16 / 8, 19.8-20.3 at 64 / 32 / 16 (Zen 4).
_AHEAD_ENTRY = 32
_AHEAD_SLOT = 16
# A miss also fetches what the next miss's eviction reads (LRU, FIFO, SIEVE: the log's oldest
# entry or the hand is known now): the victim's map entry and SIEVE's list link (as the
# simulator's loop does) and its state, stamp and pin count. bench_hierarchy's phases at a
# 0.52 hit rate, alternated, with a list for LRU: the lru probe 20.4-20.6 -> 16.5-16.9 ns a
# lookup, sieve 13.4-13.7 -> 10.2-10.4 (Zen 4).
# The all-hit pass (hit_batch_for) walks lookups, not distinct keys: about one in five is a
# batch's first sight of a row (a cache miss in the map; the repeats hit L2), so it fetches
# further ahead to keep as many misses in flight. bench_hierarchy's sieve all-hit path: 1.63-1.66x
# raw gather at 16 lookups ahead, 1.51-1.55x at 48-128 (Zen 4).
_AHEAD_LOOKUP = 64

# counters of the batch probe
C_HITS, C_MISSES, C_REJECTED, C_PREFETCH_USED, C_PREFETCH_WASTED = range(5)
N_COUNTERS = 5

# slot states (``state & READY_BITS``) and the prefetched-unused bit
SLOT_PENDING, SLOT_READY, SLOT_FAILED = 0, 1, 2
READY_BITS = 3
PREFETCHED = 4
# set only inside one call of the all-hit path (hit_batch_for): the slot was met earlier in it
_SEEN = 8
_NOT_SEEN = 0xFF ^ _SEEN  # a positive mask: uint8 & -9 is an error in NumPy, so in NUMBA_DISABLE_JIT=1

# Policies whose hit step gives the same state whatever order a batch's distinct hits come
# in (a reference bit or count, or nothing; the live LRU's hits tied by hit_tied, which its
# log orders by key when it evicts), so the all-hit path may apply them in order of first
# sight; LFU and ARC move or rank slots by order, so their batches are probed in ascending
# key order (probe_batch_for), as the simulator replays them.
_ORDER_FREE_HITS = (LRU_LOG, FIFO, CLOCK, SIEVE, S3FIFO, RANDOM)


@functools.lru_cache(maxsize=None)
def probe_batch_for(policy: int):
    """The batch probe compiled for one policy (a code of
    :data:`sdm.kernels.policies.POLICY_NAMES`): ``probe_batch(keys, st, adm, slots,
    scratch_start, state, stamp_base, prefetch, ptr, is_miss, waits, shared, counters)``.

    The policy is a constant of the kernel, so it inlines that policy's steps alone
    (:func:`sdm.kernels.policies.access_one`): a kernel compiles in seconds once per
    machine and policy, then loads from Numba's cache, where one kernel for every policy
    took 80-115 s to compile.
    """
    policy = int(policy)
    lru = policy == LRU_LOG
    bits = policy == CLOCK or policy == SIEVE or policy == S3FIFO

    # _nrt=False: without it every inlined access_one increfs and decrefs each array of the
    # policy state tuple (19 atomic pairs per key), measured 60x slower than the kernel itself.
    @jit(_nrt=False)
    def probe_batch(keys, st, adm, slots, scratch_start, state, stamp_base, prefetch, ptr,
                    is_miss, waits, shared, counters):
        """Probe ``keys`` and plan their rows.

        Args:
            keys: ``(u,)`` int64 distinct cache keys ``table_id << 48 | row id``, ascending.
            st, adm: policy and admission state (:func:`make_cache_state` with ``guarded``,
                :func:`make_admission_state`); the caller has listed the other batches in flight.
            slots: ``(capacity + scratch, slot_bytes)`` uint8 rows.
            scratch_start: the first of ``u`` scratch rows of ``slots`` this batch owns.
            state: ``(capacity,)`` uint8 slot states in/out: a slot given to a miss becomes
                ``SLOT_PENDING``; a hit on a ``SLOT_FAILED`` slot is claimed (``SLOT_PENDING``)
                and planned as a miss; ``PREFETCHED`` is set on a prefetch's admitted misses and
                cleared by a demand hit.
            stamp_base: ``epoch << 32`` for this call's epoch, above every earlier call's; the
                slot placed for id ``j`` is stamped ``stamp_base | j``.
            prefetch: True for a prefetch: every row it places (hit or admitted miss) is pinned
                at once, so no later id of the same call, nor any later batch, can evict it
                before its batch releases it. Else the slots are held by their stamps while the
                caller lists this epoch in flight.
            ptr: ``(u,)`` int64 out: row of ``slots`` serving each id.
            is_miss: ``(u,)`` bool out: the id's row must be read from the tier below into
                ``slots[ptr[j]]`` by this batch.
            waits: ``(u,)`` int64 out: positions ``j`` of hits whose slot another batch is still
                filling, in the first entries.
            shared: ``(u,)`` int64 out (demand batches): slots another batch in flight had
                stamped, pinned for this batch instead, in the first entries; unpin them at its end.
            counters: ``(N_COUNTERS,)`` int64 in/out: hits, misses, misses not admitted,
                prefetched rows used by a demand hit, prefetched rows evicted unused.

        Returns:
            ``(entries of waits, entries of shared)``.
        """
        # one array per statement: see the note on unpacking in sdm.kernels.policies
        meta = st[0]
        index = st[2]
        pins = st[11]
        use = st[19]
        freq = st[6]
        lru_pos = st[21]
        nfly = meta[M_FLYING]
        scratch = scratch_start
        n_waits = 0
        n_shared = 0
        n = keys.shape[0]
        for j in range(n):
            if j + _AHEAD_ENTRY < n:
                prefetch_row(index, 2 * _home(index, keys[j + _AHEAD_ENTRY]), 16)  # key, value
            if j + _AHEAD_SLOT < n:
                a = hm_find(index, keys[j + _AHEAD_SLOT])
                if a >= 0:
                    prefetch_row(state, a, 1)
                    prefetch_row(use, a, 1)
                    if lru:
                        prefetch_row(lru_pos, a, 1)
                    elif bits:
                        prefetch_row(freq, a, 1)
            hit, s, _ = access_one(st, adm, keys[j], NEVER, policy)
            if hit:
                counters[C_HITS] += 1
                v = state[s]
                ready = v & READY_BITS
                is_miss[j] = ready == SLOT_FAILED
                if is_miss[j]:  # a read of its row failed: this batch reads it again
                    v = (v & PREFETCHED) | SLOT_PENDING
                elif ready == SLOT_PENDING:  # another batch is reading it: wait for that
                    waits[n_waits] = j
                    n_waits += 1
                if (v & PREFETCHED) and not prefetch:
                    counters[C_PREFETCH_USED] += 1
                    v &= READY_BITS
                state[s] = v
            else:
                counters[C_MISSES] += 1
                is_miss[j] = True
                # the next eviction's lines, fetched while later keys are probed: its map entry
                # and link, then what the victim choice reads (-1: the policy cannot tell yet)
                victim = prefetch_next_victim(st, policy)
                if victim >= 0:
                    prefetch_row(state, victim, 1)
                    prefetch_row(use, victim, 1)
                    prefetch_row(pins, victim, 1)
                if s < 0:
                    counters[C_REJECTED] += 1
                    ptr[j] = scratch
                    scratch += 1
                    continue
                if state[s] & PREFETCHED:  # the evicted row was prefetched and never used
                    counters[C_PREFETCH_WASTED] += 1
                state[s] = (PREFETCHED if prefetch else 0) | SLOT_PENDING
                if use[s] >= stamp_base:  # the slot still serves an earlier id of this batch
                    owner = use[s] - stamp_base
                    if not is_miss[owner]:
                        for b in range(slots.shape[1]):
                            slots[scratch, b] = slots[s, b]
                    ptr[owner] = scratch
                    scratch += 1
            ptr[j] = s
            if nfly > 0 and flying(st, use[s]):  # another batch in flight reads it: keep its stamp
                pins[s] += 1
                if not prefetch:
                    shared[n_shared] = s
                    n_shared += 1
            else:
                use[s] = stamp_base | j
                if prefetch:
                    pins[s] += 1
        return n_waits, n_shared

    return probe_batch


def hits_commute(policy: int, admission: int) -> bool:
    """A batch that only hits leaves the same cache state whatever order its distinct keys are
    served in (for LRU_LOG, the same recency order, its log's layout aside), for ``policy``
    behind ``admission`` (codes): :func:`hit_batch_for` serves it (TinyLFU counts every
    request in a sketch that ages by request count, so order matters)."""
    return int(policy) in _ORDER_FREE_HITS and int(admission) != ADM_TINYLFU


@functools.lru_cache(maxsize=None)
def hit_batch_for(policy: int):
    """The all-hit batch path compiled for one policy where :func:`hits_commute`:
    ``hit_batch(ids, base, st, state, stamp_base, ptr, seen, counters) -> (u, n_shared)``.

    It looks every lookup's key up in the map, repeats included, where the general path
    first dedups the batch (:func:`sdm.kernels.dedup.unique_ranked`), probes each distinct
    key (:func:`probe_batch_for`) and then maps lookups to slots
    (:func:`sdm.kernels.dedup.compose`): two hash passes and a third over the lookups become
    one. Its state ends as the general path leaves it after the same batch, counters
    included, since every key hits and the policy's hits commute; only the use stamps'
    positions differ (first sight, not ascending rank), which no batch reads after its own
    probe, and LRU_LOG's log, whose tied entries give the same recency order.
    """
    policy = int(policy)

    @jit(_nrt=False)  # as probe_batch: no reference counts on the state tuple
    def hit_batch(ids, base, st, state, stamp_base, ptr, seen, counters):
        """Serve keys ``base | ids[i]`` if every one is a hit on a ready slot.

        Args:
            ids, base: a batch's lookups, in lookup order, repeats included: ``(n,)`` integer
                row ids and int64 ``table_id << TABLE_SHIFT`` of a batch of one table (no
                array of keys made), or cache keys and 0.
            st, state, stamp_base, counters: as :func:`probe_batch_for`'s.
            ptr: ``(n,)`` int64 out: the slot serving each lookup.
            seen: ``(n,)`` int64 scratch; out: the slots another batch in flight had stamped,
                pinned for this one instead, in its first ``n_shared`` entries.

        Returns:
            ``(u, n_shared)``: the batch's distinct keys, all hits, and the entries of
            ``seen`` to unpin at its end; ``(-1, 0)`` with nothing changed when a key is not
            in the cache or its slot is not ready (pending or failed): the general path
            serves that batch.
        """
        meta = st[0]
        index = st[2]
        pins = st[11]
        use = st[19]
        n = ids.shape[0]
        u = 0
        for i in range(n):
            if i + _AHEAD_LOOKUP < n:
                prefetch_row(index, 2 * _home(index, base | ids[i + _AHEAD_LOOKUP]), 16)  # key, value
            s = hm_find(index, base | ids[i])
            v = state[s] if s >= 0 else SLOT_PENDING
            if (v & READY_BITS) != SLOT_READY:
                for k in range(u):  # undo the marks: the general path sees the state as it was
                    state[seen[k]] &= _NOT_SEEN
                return -1, 0
            ptr[i] = s
            seen[u] = s
            u += (v & _SEEN) == 0  # no branch: whether a lookup is a first sight is unpredictable
            state[s] = v | _SEEN
        nfly = meta[M_FLYING]
        n_shared = 0
        if policy == LRU_LOG:  # before the loop below reuses seen
            hit_tied(st, seen, u)
        for k in range(u):  # the distinct slots in order of first sight
            s = seen[k]
            v = state[s] & _NOT_SEEN
            if v & PREFETCHED:
                counters[C_PREFETCH_USED] += 1
                v &= READY_BITS
            state[s] = v
            if policy != LRU_LOG:
                hit_one(st, s, policy)
            if nfly > 0 and flying(st, use[s]):  # another batch in flight reads it: keep its stamp
                pins[s] += 1
                seen[n_shared] = s  # n_shared <= k: an entry already read
                n_shared += 1
            else:
                use[s] = stamp_base | k
        counters[C_HITS] += u
        return u, n_shared

    return hit_batch


@jit(_nrt=False)
def fill_rows(slots, ptr, rows):
    """``slots[ptr[k], :row_bytes] = rows[k]`` for each fetched row ``k``."""
    width = rows.shape[1]
    for k in range(ptr.shape[0]):
        dst = slots[ptr[k]]  # 1-D views: the byte loop runs without 2-D index arithmetic
        src = rows[k]
        for b in range(width):
            dst[b] = src[b]

"""The DRAM cache's batch path: probe a batch of ids, plan where every row will sit.

One call serves the distinct ids of one table in one batch, in ascending order, through
the shared policy kernels (:func:`sdm.kernels.policies.access_one`), exactly the key stream
the simulator replays, so the live cache and ``sdm.simulate`` count the same hits.

Rows live in the caller's ``slots`` buffer: rows ``[0, capacity)`` are cache slots, the rows
after them scratch, of which each batch in flight owns a range starting at its
``scratch_start``. After :func:`probe_batch`, ``ptr[j]`` is the row of ``slots`` that will
hold id ``j``'s row for this batch, every ``ptr`` distinct:

* a hit points at its slot;
* an admitted miss points at the slot the policy gave it (filled by the caller after the
  read from the tier below);
* a miss the policy did not admit (admission filter, every victim pinned) points at scratch.

A slot assigned to an id earlier in the same batch can be taken again by a later miss (the
policy does not know the batch is still using it). The earlier owner is then moved to
scratch: a hit's row is copied there at once (its bytes are in the slot now); a miss's row
has not been read yet, so only its pointer moves. ``slot_epoch``/``slot_owner`` record which
slot serves which id of the current batch; ``epoch`` changes every call.

Many batches may be in flight (their reads run outside the cache's lock), so a slot also
has a state in ``ready``: ``SLOT_READY`` (its row is there), ``SLOT_PENDING`` (a batch is
reading its row: the slot was given to a miss) or ``SLOT_FAILED`` (that read failed: the
next batch to hit it reads it again, so it is planned as a miss). Slots other batches are
using are pinned by them, so no probe evicts them.
"""

from __future__ import annotations

from sdm.kernels.jit import jit
from sdm.kernels.bag import prefetch_row
from sdm.kernels.hashmap import _home
from sdm.kernels.policies import NEVER, access_one


#: A cache key is ``table_id << TABLE_SHIFT | row id`` (row ids are < 2**48, TableSpec's limit),
#: so one directory serves every table of a store and the simulator replays the same keys.
TABLE_SHIFT = 48

# Keys ahead whose hash-map entry is prefetched: a probe of a cache this size is a cache miss
# per key, so the next keys' entries are fetched while this one's policy work runs.
_PREFETCH_KEYS = 8

# counters of probe_batch
C_HITS, C_MISSES, C_REJECTED, C_PREFETCH_USED, C_PREFETCH_WASTED = range(5)
N_COUNTERS = 5

# slot states (``ready``)
SLOT_PENDING, SLOT_READY, SLOT_FAILED = 0, 1, 2


# _nrt=False: without it every inlined access_one increfs and decrefs each array of the
# policy state tuple (19 atomic pairs per key), measured 60x slower than the kernel itself.
@jit(_nrt=False)
def probe_batch(ids, key_base, st, adm, slots, scratch_start, slot_epoch, slot_owner, epoch,
                slot_flag, ready, prefetch, ptr, is_miss, counters):
    """Probe ``ids`` and plan their rows.

    Args:
        ids: ``(u,)`` int64 distinct row ids of one table, ascending.
        key_base: ``table_id << 48``; the cache key of id ``i`` is ``key_base | i``.
        st, adm: policy and admission state (:func:`make_cache_state`, :func:`make_admission_state`).
        slots: ``(capacity + scratch, slot_bytes)`` uint8 rows.
        scratch_start: the first of ``u`` scratch rows of ``slots`` this batch owns.
        slot_epoch, slot_owner: ``(capacity,)`` int64: batch stamp and id position per slot.
        epoch: this call's stamp (distinct from every earlier call's).
        slot_flag: ``(capacity,)`` uint8: 1 while a slot holds a row a prefetch read that no
            demand batch has used yet.
        ready: ``(capacity,)`` uint8 slot states in/out: a slot given to a miss becomes
            ``SLOT_PENDING``; a hit on a ``SLOT_FAILED`` slot is claimed (``SLOT_PENDING``)
            and planned as a miss.
        prefetch: True for a prefetch: every row it places (hit or admitted miss) is pinned
            at once, so no later id of the same call, nor any later batch, can evict it
            before its batch releases it; admitted misses are flagged.
        ptr: ``(u,)`` int64 out: row of ``slots`` serving each id.
        is_miss: ``(u,)`` bool out: the id's row must be read from the tier below into
            ``slots[ptr[j]]`` by this batch.
        counters: ``(N_COUNTERS,)`` int64 in/out: hits, misses, misses not admitted,
            prefetched rows used by a demand hit, prefetched rows evicted unused.

    Returns:
        The number of scratch rows used.
    """
    pins = st[11]
    index = st[2]  # the policy's key -> slot hash map
    scratch = scratch_start
    n = ids.shape[0]
    for j in range(n):
        if j + _PREFETCH_KEYS < n:
            prefetch_row(index, 2 * _home(index, key_base | ids[j + _PREFETCH_KEYS]), 16)  # key, value
        hit, s, _ = access_one(st, adm, key_base | ids[j], NEVER)
        if hit:
            counters[C_HITS] += 1
            is_miss[j] = ready[s] == SLOT_FAILED
            if is_miss[j]:  # a read of its row failed: this batch reads it again
                ready[s] = SLOT_PENDING
            if slot_flag[s] and not prefetch:
                counters[C_PREFETCH_USED] += 1
                slot_flag[s] = 0
        else:
            counters[C_MISSES] += 1
            is_miss[j] = True
            if s < 0:
                counters[C_REJECTED] += 1
                ptr[j] = scratch
                scratch += 1
                continue
            if slot_flag[s]:  # the evicted row was prefetched and never used
                counters[C_PREFETCH_WASTED] += 1
            slot_flag[s] = 1 if prefetch else 0
            ready[s] = SLOT_PENDING
            if slot_epoch[s] == epoch:  # the slot still serves an earlier id of this batch
                owner = slot_owner[s]
                if not is_miss[owner]:
                    for b in range(slots.shape[1]):
                        slots[scratch, b] = slots[s, b]
                ptr[owner] = scratch
                scratch += 1
        if prefetch:
            pins[s] += 1
        ptr[j] = s
        slot_epoch[s] = epoch
        slot_owner[s] = j
    return scratch - scratch_start


@jit(_nrt=False)
def fill_rows(slots, ptr, rows):
    """``slots[ptr[k], :row_bytes] = rows[k]`` for each fetched row ``k``."""
    width = rows.shape[1]
    for k in range(ptr.shape[0]):
        for b in range(width):
            slots[ptr[k], b] = rows[k, b]


@jit(_nrt=False)
def pin_placed(st, ptr, capacity, delta):
    """Add ``delta`` to the pin count of every cache slot ``ptr`` places a row in (entries
    ``< capacity``; scratch rows are nobody's); counts never drop below 0."""
    pins = st[11]
    for j in range(ptr.shape[0]):
        s = ptr[j]
        if s < capacity:
            v = pins[s] + delta
            pins[s] = v if v > 0 else 0


@jit(_nrt=False)
def pending_hits(ptr, is_miss, ready, capacity, out):
    """Write into ``out`` the positions ``j`` of hits whose slot another batch is still
    filling (``ready`` not ``SLOT_READY``); returns how many."""
    n = 0
    for j in range(ptr.shape[0]):
        s = ptr[j]
        if not is_miss[j] and s < capacity and ready[s] != SLOT_READY:
            out[n] = j
            n += 1
    return n

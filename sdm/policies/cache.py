"""The policy-driven cache directory shared by the simulator and the store's DRAM tier.

:class:`Cache` holds the kernel state of one cache (:mod:`sdm.kernels.policies`) and does
all validation; every method is one Numba call over a whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from sdm.errors import InvalidArgumentError
from sdm.kernels import policies as K
from sdm.validate import as_int_array, check_choice, check_id_array, check_int, check_number

__all__ = ["POLICIES", "ADMISSIONS", "Admission", "AccessResult", "Cache", "check_keys",
           "check_policy", "check_capacity"]

POLICIES = K.POLICY_NAMES
ADMISSIONS = ("threshold", "tinylfu")
MAX_CAPACITY = (1 << 31) - 1  # slots are int32 inside the kernels
_EMPTY_I64 = np.empty(0, dtype=np.int64)


def check_policy(policy) -> int:
    """Policy code of a name in :data:`POLICIES` (any case); raise InvalidArgumentError otherwise."""
    return POLICIES.index(check_choice(policy.lower() if isinstance(policy, str) else policy, "policy",
                                       POLICIES))


def check_capacity(capacity) -> int:
    """A capacity in slots: an integer in ``[1, 2**31 - 1]``."""
    return check_int(capacity, "capacity", lo=1, hi=MAX_CAPACITY)


def check_keys(keys, *, what: str = "keys", sign: bool = True) -> np.ndarray:
    """Validate a key stream: 1-D, integer dtype, every key in ``[0, 2**63 - 1]``.

    Returns a contiguous int64 array (a view when already one). Negative keys are refused
    because -1 marks an empty entry inside the id -> slot map; ``sign`` False leaves them to
    :meth:`Cache._serve`, which refuses them as it meets them.
    """
    return check_id_array(keys, what, sign=sign)


@dataclass(frozen=True)
class Admission:
    """An admission filter in front of any policy.

    * ``kind="threshold"`` (Bandana-style): a missing key is admitted on its
      ``threshold``-th miss. Miss counts are exact, kept for at most ``history`` keys
      (default ``4 * capacity``); when that table is full it is cleared (aging by reset).
    * ``kind="tinylfu"``: every request is recorded in a 4-row count-min sketch of 4-bit
      counters behind a doorkeeper bit array; after ``sample_factor * capacity`` records the
      counters are halved and the doorkeeper cleared. A miss that would evict is admitted
      only if its estimated frequency exceeds the victim's; misses into free slots are
      always admitted.
    """

    kind: str
    threshold: int = 2
    history: int | None = None
    sample_factor: int = 10

    def __post_init__(self):
        check_choice(self.kind, "admission", ADMISSIONS)
        for name in ("threshold", "history", "sample_factor"):
            value = getattr(self, name)
            if value is not None or name != "history":
                object.__setattr__(self, name, check_int(value, f"admission {name}", lo=1))

    @classmethod
    def coerce(cls, admission) -> "Admission | None":
        """``None``, an :class:`Admission`, or a kind name (default parameters)."""
        if admission is None or isinstance(admission, Admission):
            return admission
        if isinstance(admission, str):
            return cls(admission)
        raise InvalidArgumentError(
            f"admission must be None, one of {ADMISSIONS} or an sdm.policies.Admission, got {admission!r}")

    def make_state(self, capacity: int):
        code = K.ADM_THRESHOLD if self.kind == "threshold" else K.ADM_TINYLFU
        return K.make_admission_state(code, capacity, threshold=self.threshold,
                                      history=self.history, sample_factor=self.sample_factor)



def _no_admission():
    # A fresh tuple each time: kernels never write the meta of a "none" filter, but sharing
    # mutable arrays across caches would be a trap for later changes.
    return K.make_admission_state(K.ADM_NONE, 1)


class AccessResult(NamedTuple):
    """Per-request outcome of :meth:`Cache.access`, all ``(n,)`` arrays in request order.

    * ``hit``: bool, the key was resident when its request was served.
    * ``slot``: int64, the key's slot after the request: its slot on a hit; on a miss the
      slot assigned to it (the caller must fill that row), or -1 when the key was not
      admitted (admission filter said no, or every candidate victim is pinned).
    * ``evicted``: int64, the key evicted from ``slot`` to make room, -1 if none (free slot,
      hit, or not admitted).
    """

    hit: np.ndarray
    slot: np.ndarray
    evicted: np.ndarray


class Cache:
    """A fixed-size cache directory: which key sits in which of ``capacity`` slots.

    The policy owns metadata only; rows live in a buffer the caller owns and indexes by
    slot (``rows[slot]``). Slots are stable: a key stays in its slot until evicted or
    removed. The simulator (:func:`sdm.simulate`) runs exactly this code (a guarded LRU
    cache its own, with the same decisions), so a store using a :class:`Cache` counts the
    same hits as the simulator for the same key stream.

    Args:
        capacity: number of slots, ``>= 1``.
        policy: a name in :data:`POLICIES`. ``belady`` needs ``next_use`` on every access.
        admission: ``None``, ``"threshold"``, ``"tinylfu"`` or an :class:`Admission`.
        seed: seed of the ``random`` policy.
        small_ratio, ghost_ratio, move_to_main: S3-FIFO parameters (libCacheSim defaults).
        guarded: keep a use stamp per slot, so a caller serving many batches at once can hold
            every slot a batch in flight reads without a pin per slot (the live DRAM cache,
            :mod:`sdm.kernels.serve`). A guarded ``lru`` cache keeps a recency log in place
            of the list, 20 bytes a slot against 8, whose hits cost less in a large cache and
            may be served a batch at a time in any order (:mod:`sdm.kernels.policies`).

    Requests in one batch are served strictly in order, so a key repeated in a batch hits
    on its second request, and a slot assigned early in a batch may be reassigned later in
    the same batch (``evicted`` then names the key assigned earlier). A caller that fills
    rows after the call should pin the slots it still needs (:meth:`pin`) or process the
    result in order. Not thread-safe: one thread at a time per cache.

    Pinned slots (pin count > 0, see :meth:`pin`) are never chosen as victims; when every
    candidate is pinned a miss is not admitted (slot -1).
    """

    def __init__(self, capacity, policy="lru", *, admission=None, seed=0,
                 small_ratio=0.1, ghost_ratio=0.9, move_to_main=2, guarded=False):
        self._capacity = check_capacity(capacity)
        self._code = check_policy(policy)
        self._policy = POLICIES[self._code]
        if guarded and self._code == K.LRU:
            # the live cache's LRU: a recency log, whose hits cost a line where the list's
            # cost three and may be served in any order (sdm.kernels.policies); same decisions
            self._code = K.LRU_LOG
        ratios = [check_number(v, name, lo=0, hi=1, lo_open=True, hi_open=True)
                  for name, v in (("small_ratio", small_ratio), ("ghost_ratio", ghost_ratio))]
        move_to_main = check_int(move_to_main, "move_to_main", lo=1)
        seed = check_int(seed, "seed")
        self._admission = Admission.coerce(admission)
        self._state = K.make_cache_state(self._capacity, self._code, seed=seed, small_ratio=ratios[0],
                                         ghost_ratio=ratios[1], move_to_main=move_to_main,
                                         guarded=bool(guarded))
        self._adm = (self._admission.make_state(self._capacity) if self._admission
                     else _no_admission())

    # ------------------------------------------------------------------ properties
    @property
    def capacity(self) -> int:
        """Number of slots."""
        return self._capacity

    @property
    def policy(self) -> str:
        """Policy name."""
        return self._policy

    @property
    def admission(self) -> Admission | None:
        """The admission filter, or None."""
        return self._admission

    def __len__(self) -> int:
        return int(self._state[0][K.M_SIZE])

    def __contains__(self, key) -> bool:
        k = check_keys(np.array([key]) if np.isscalar(key) else key, what="key")
        return bool(k.size == 1 and self.lookup(k)[0] >= 0)

    # ------------------------------------------------------------------ batch API
    def access(self, keys, *, next_use=None) -> AccessResult:
        """Serve a batch of requests, updating policy state; one Numba call.

        Args:
            keys: ``(n,)`` integer keys ``>= 0`` (int64 preferred; no copy then).
            next_use: ``(n,)`` int64, for ``belady`` only: the position of the next request
                for the same key in the caller's global request numbering, or a value
                ``>= sdm.kernels.policies.NEVER`` when there is none.

        Returns:
            :class:`AccessResult` ``(hit bool (n,), slot int64 (n,), evicted int64 (n,))``.
        """
        keys = check_keys(keys)
        nu = self._check_next_use(next_use, keys.shape[0])
        n = keys.shape[0]
        hit = np.empty(n, dtype=np.bool_)
        slot = np.empty(n, dtype=np.int64)
        evicted = np.empty(n, dtype=np.int64)
        self._serve(keys, nu, hit, slot, evicted)
        return AccessResult(hit, slot, evicted)

    def _serve(self, keys, next_use, hit, slot, evicted) -> int:
        """One Numba call serving int64 ``keys`` (:func:`sdm.kernels.policies.serve_for`'s
        loop for this cache's policy and admission); returns the number of hits.

        Raises:
            InvalidArgumentError: a key is negative. The keys before it were served, so a
                cache that lives on has its keys checked first (:func:`check_keys`).
        """
        outputs = hit.shape[0] + slot.shape[0] + evicted.shape[0] > 0
        serve = K.serve_for(self._code, int(self._adm[0][K.A_KIND]), outputs)
        hits = int(serve(self._state, self._adm, keys, next_use, hit, slot, evicted))
        if hits < 0:
            raise InvalidArgumentError(f"keys {int(keys[-1 - hits])} is negative (valid: >= 0)")
        return hits

    def lookup(self, keys) -> np.ndarray:
        """``(n,)`` int64 slot of each key, -1 if absent; no policy state changes."""
        keys = check_keys(keys)
        return K.peek_batch(self._state, keys, np.empty(keys.shape[0], dtype=np.int64))

    def remove(self, keys) -> np.ndarray:
        """Drop keys (e.g. rows rewritten below); ``(n,)`` int64 freed slot or -1 if absent.

        Removing a pinned key also clears its slot's pin count. Freed slots are reused
        before any eviction. FIFO and CLOCK keep their hand over the
        slot ring, so a key inserted into a freed slot takes that slot's place in the ring
        (exact FIFO order holds for traces without removals).
        """
        keys = check_keys(keys)
        return K.remove_batch(self._state, keys, np.empty(keys.shape[0], dtype=np.int64))

    def pin(self, slots) -> None:
        """Increment the pin count of each slot (``(n,)`` integers in ``[0, capacity)``);
        a pinned slot is never evicted. Pins are counts: pin twice, unpin twice."""
        K.pin_batch(self._state, self._check_slots(slots), 1)

    def unpin(self, slots) -> None:
        """Decrement the pin count of each slot (never below zero)."""
        K.pin_batch(self._state, self._check_slots(slots), -1)

    def pin_counts(self) -> np.ndarray:
        """``(capacity,)`` int32 copy of the pin counts."""
        return self._state[11].copy()

    def slot_keys(self) -> np.ndarray:
        """``(capacity,)`` int64 copy: the key held by each slot, -1 for a free slot."""
        return self._state[3].copy()

    def stats(self) -> dict:
        """Counters since creation: requests, hits, misses, evictions, rejects (misses not
        admitted)."""
        m = self._state[0]
        return {"requests": int(m[K.M_TIME]), "hits": int(m[K.M_HITS]),
                "misses": int(m[K.M_MISSES]), "evictions": int(m[K.M_EVICTIONS]),
                "rejects": int(m[K.M_REJECTS])}

    def check_invariants(self) -> None:
        """Raise AssertionError if the state is inconsistent (tests and debugging)."""
        st = self._state
        meta, skey = st[0], st[3]
        resident = skey[skey >= 0]
        if len(set(resident.tolist())) != resident.size:
            raise AssertionError("a key occupies two slots")
        if resident.size != meta[K.M_SIZE] or meta[K.M_SIZE] + meta[K.M_NFREE] != self._capacity:
            raise AssertionError("size and free-slot counts disagree with the slot table")
        slots = self.lookup(resident)
        if not np.array_equal(skey[slots], resident):
            raise AssertionError("id -> slot map disagrees with the slot table")
        if self._code == K.LRU_LOG:
            pos, log = st[21], st[22]
            head, tail = meta[K.M_LOG_HEAD], meta[K.M_LOG_TAIL]
            where = pos[skey >= 0] - 1
            if not ((where >= head) & (where < tail)).all() or pos[skey < 0].any():
                raise AssertionError("a resident slot has no live entry in the recency log, or a free one has")
            if not np.array_equal(log[where].astype(np.int64) >> 1, np.flatnonzero(skey >= 0)):
                raise AssertionError("recency log entries name other slots than their positions say")
            if not 0 <= head <= tail <= log.shape[0]:
                raise AssertionError(f"recency log bounds {head}, {tail} outside 0..{log.shape[0]}")
        if self._code in (K.LRU, K.SIEVE, K.S3FIFO, K.ARC):
            nq = meta[K.Q_BASE + 2] + meta[K.Q_BASE + 5]
            if nq != resident.size:
                raise AssertionError(f"queues hold {nq} slots, {resident.size} resident")
        if self._code in (K.LFU, K.BELADY) and meta[K.M_HEAPN] != resident.size:
            raise AssertionError("heap size disagrees with the resident count")
        if self._code == K.ARC:
            t = meta[K.Q_BASE + 2] + meta[K.Q_BASE + 5]
            b = meta[K.G_BASE + 2] + meta[K.G_BASE + 5]
            if meta[K.Q_BASE + 2] + meta[K.G_BASE + 2] > self._capacity or t + b > 2 * self._capacity:
                raise AssertionError("ARC list sizes exceed c or 2c")

    # ------------------------------------------------------------------ helpers
    def _check_slots(self, slots) -> np.ndarray:
        s = np.asarray(slots)
        return check_id_array(s.reshape(1) if s.ndim == 0 else s, "slot", upper=self._capacity,
                              domain=f"a cache of {self._capacity} slots", range_error=InvalidArgumentError)

    def _check_next_use(self, next_use, n: int) -> np.ndarray:
        if next_use is None:
            if self._code == K.BELADY:
                raise InvalidArgumentError("policy 'belady' needs next_use: the position of each "
                                           "key's next request (see sdm.simulate)")
            return _EMPTY_I64
        nu = as_int_array(next_use, "next_use")
        if nu.shape != (n,):
            raise InvalidArgumentError(f"next_use must be ({n},) integers like keys, got shape {nu.shape}")
        return nu

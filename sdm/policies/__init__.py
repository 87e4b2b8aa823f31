"""Cache policies and the trace simulator.

* :class:`Cache`: the policy-driven slot directory shared by the simulator and the store's
  DRAM tier (batch ``access`` / ``lookup`` / ``remove`` / ``pin``).
* :func:`simulate`, :func:`miss_ratio_curve`: replay key streams.
* :data:`POLICIES`: ``lru fifo clock lfu sieve s3fifo arc random belady``.

Policy definitions (they follow libCacheSim; differences are noted):

* ``lru``, ``fifo``: textbook.
* ``clock``: FIFO with one reference bit; a referenced key at the hand is cleared and
  passed (reinserted), an unreferenced one evicted; new keys start unreferenced.
* ``lfu``: evict the least frequently used; ties go to the least recently used (the key
  that reached its count earliest, libCacheSim's LFU). Counts start at 1 on insertion and
  are forgotten on eviction.
* ``sieve``: SIEVE (Zhang et al., NSDI'24): new keys at the head; the hand walks from the
  tail toward the head clearing visited bits and evicts the first unvisited key.
* ``s3fifo``: S3-FIFO (Yang et al., SOSP'23) as libCacheSim's S3FIFO: small FIFO of
  ``floor(0.1 c)`` keys (at least 1; libCacheSim caches nothing when that floor is < 2),
  main FIFO with a 2-bit clock, a ghost FIFO of ``floor(0.9 c)`` keys; keys move to main
  after 2 hits in small; keys found in the ghost go straight to main; until the first
  eviction, keys overflowing a full small queue go to main.
* ``arc``: ARC (Megiddo and Modha, FAST'03) with real-valued target ``p``.
* ``random``: evict a uniformly random slot (seeded, reproducible).
* ``belady``: offline optimum with every miss inserted; the key whose next request is
  farthest away (or never comes) is evicted.
"""

from sdm.policies.cache import (ADMISSIONS, POLICIES, AccessResult, Admission, Cache,
                                check_keys)
from sdm.policies.simulate import (SimResult, lru_stack_distances_of, miss_ratio_curve,
                                   next_use, simulate)

__all__ = ["POLICIES", "ADMISSIONS", "Admission", "AccessResult", "Cache", "SimResult",
           "simulate", "miss_ratio_curve", "next_use", "lru_stack_distances_of", "check_keys"]

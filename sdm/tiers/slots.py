"""CPU slots: how many of a store's requests run their CPU work at once.

Python threads serving one store share one interpreter lock. Past a few threads each request
costs more CPU, not less time. Every kernel call and every lock wait hands the interpreter
lock over, and each hand-over is a futex wake-up and a context switch. Measured on a 2-core
Zen 4 VM, one process, 8 threads closed-loop over ``sdm-nand`` all-hit: 40% of the CPU in
the kernel's task switching (``perf``), 2.5-3.1 ms per request against 0.9-1.0 ms with one
thread (bench/RESULTS.md, "CPU slots").

A store therefore admits at most ``n`` requests (by default, the cores this process may use)
into their CPU work; the others wait their turn, first come first served, blocked in a lock
where they cost nothing. A request gives its slot up when it first waits for devices, for
other requests' reads or for room (:func:`give_up`, called by every wait inside the tiers),
and its deferred paced device wait comes after its slot is returned, so waits still overlap
as many requests as there are threads. Only how many run CPU work at once is bounded.
"""

from __future__ import annotations

import collections
import os
import threading
from contextlib import contextmanager

from sdm.validate import check_int

__all__ = ["CpuSlots", "default_cpu_slots", "give_up", "cpu_slots_text"]

_local = threading.local()


def default_cpu_slots() -> int:
    """The cores this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cpu_slots_text(n: int) -> str:
    """A store's bound ``n`` in words, for reports (0: no bound)."""
    return f"{n} CPU slots" if n else "no CPU slot bound"


class CpuSlots:
    """At most ``n`` holders at once; the rest wait first come first served, and a slot
    given back goes straight to the longest waiter (no barging, so no waiter starves)."""

    def __init__(self, n: int):
        self.n = check_int(n, "cpu_slots", lo=1)
        self._lock = threading.Lock()
        self._free = self.n
        self._waiters: collections.deque = collections.deque()

    def _acquire(self) -> None:
        with self._lock:
            if self._free and not self._waiters:
                self._free -= 1
                return
            turn = threading.Lock()
            turn.acquire()
            self._waiters.append(turn)
        try:
            turn.acquire()  # released by _release: the slot is handed over, not freed
        except BaseException:  # interrupted while waiting: leave the queue, or pass the slot on
            with self._lock:
                handed = turn not in self._waiters
                if not handed:
                    self._waiters.remove(turn)
            if handed:
                self._release()
            raise

    def _release(self) -> None:
        with self._lock:
            if self._waiters:
                self._waiters.popleft().release()
            else:
                self._free += 1

    @contextmanager
    def held(self):
        """Hold a slot for the block (one request's CPU work), unless :func:`give_up` gives
        it back earlier. Nested blocks on the same thread are part of the outer one."""
        if getattr(_local, "slots", None) is not None:
            yield
            return
        self._acquire()
        _local.slots = self
        try:
            yield
        finally:
            if _local.slots is self:
                self._release()
            _local.slots = None


_GIVEN_UP = object()  # this thread's request has returned its slot


def give_up() -> None:
    """This thread's request waits now (for devices, for other requests' reads, for room):
    return its slot for the rest of the request. A no-op outside a request or after the
    first call.

    The request does not take a slot again after the wait. Taking one there could wait for
    slots held by requests that need what the waiter holds (the cache's lock, rows it is
    reading), and a request that waits is IO-bound anyway, so freeing the cores for the rest
    of it is what it needs."""
    slots = getattr(_local, "slots", None)
    if slots is not None and slots is not _GIVEN_UP:
        _local.slots = _GIVEN_UP
        slots._release()

"""Clocks that device models charge time to.

Device time is never read from the machine in ``modeled`` mode: every tier charges its
modeled service time to an injected clock, so a replay is deterministic and tests drive time
by hand. :class:`SimClock` is that clock; :func:`wait_until_ns` is the real waiting used by
``paced`` mode.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from contextlib import contextmanager

from sdm.errors import InvalidArgumentError
from sdm.tiers.slots import give_up
from sdm.validate import check_int

__all__ = ["SimClock", "Timeline", "on_timeline", "current_timeline", "wait_until_ns", "spin_below_ns",
           "PacedRequest", "paced_request", "current_paced_request", "recorded_issues", "current_issue_log"]

# time.sleep overshoots a deadline by the thread's timer slack (50 us by default on Linux)
# plus the wake-up: measured on this project's VMs, 63-75 us median, 100-220 us p99. So
# waits sleep to within a margin of the deadline, then spin. With the slack cut to 1 ns
# (prctl, per thread) the median overshoot is 17-24 us and the margin can be short: a paced
# store serving many requests then spends its cores on requests, not on spinning.
_SPIN_DEFAULT_NS = 300_000
_SPIN_TIGHT_NS = 50_000
_PR_SET_TIMERSLACK = 29
_local_wait = threading.local()


def _tighten_timer_slack() -> bool:
    """Set this thread's timer slack to 1 ns (Linux); True if it worked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def spin_below_ns() -> int:
    """The calling thread's spin margin: waits sleep until this close to their deadline."""
    margin = getattr(_local_wait, "margin", None)
    if margin is None:
        margin = _local_wait.margin = _SPIN_TIGHT_NS if _tighten_timer_slack() else _SPIN_DEFAULT_NS
    return margin


class SimClock:
    """A simulated clock in integer nanoseconds, advanced only by :meth:`advance_ns`.

    Thread-safe: concurrent lookups charge their device time one after another, as if
    served by one queue (the model's deliberately simple view of concurrency).
    """

    def __init__(self, start_ns: int = 0):
        self._now = check_int(start_ns, "start_ns", lo=0)
        self._lock = threading.Lock()

    def now_ns(self) -> int:
        """The current simulated time."""
        return self._now

    def advance_ns(self, ns: int) -> int:
        """Move time forward by ``ns >= 0`` nanoseconds; returns the new time."""
        ns = int(ns)
        if ns < 0:
            raise InvalidArgumentError(f"a clock only moves forward; advance_ns({ns}) is negative")
        with self._lock:
            self._now += ns
            return self._now

    def advance_to_ns(self, ns: int) -> int:
        """Move time forward to ``ns`` unless it is already later; returns the new time."""
        with self._lock:
            self._now = max(self._now, int(ns))
            return self._now

    def __repr__(self):
        return f"SimClock(now_ns={self._now})"


def wait_until_ns(deadline_ns: int) -> int:
    """Block until ``time.perf_counter_ns() >= deadline_ns``; returns the time reached.

    Sleeps for the bulk of long waits (so a paced store does not burn a core for
    milliseconds), then spins for the last :func:`spin_below_ns`, which keeps the overshoot
    to microseconds. Each turn of the spin yields the GIL (``sleep(0)``): a pure-Python spin
    would hold it for the interpreter's whole switch interval (5 ms), and other requests'
    threads, which a paced store serves meanwhile, would wait behind the spinner.
    """
    margin = spin_below_ns()
    now = time.perf_counter_ns()
    remaining = deadline_ns - now
    if remaining > 0:
        give_up()  # a request waiting for devices needs no core
    if remaining > margin:
        time.sleep((remaining - margin) / 1e9)
    now = time.perf_counter_ns()
    while now < deadline_ns:
        time.sleep(0)
        now = time.perf_counter_ns()
    return now


class Timeline:
    """One request's own simulated time, for serving many requests at once in ``modeled`` mode.

    While a thread serves a request :func:`on_timeline`, every device the request reads from
    is charged from ``now_ns`` (the request's arrival, then the completion of its previous
    reads) and moves it to the reads' completion; the devices' queues are shared by every
    request in flight. Without a timeline, charges go to the store's :class:`SimClock`, one
    batch after another.

    Start requests in arrival order (``start_ns`` nondecreasing), as ``sdm load`` does: a
    device queue forgets what ended before the start of the request charging it.
    """

    __slots__ = ("start_ns", "now_ns")

    def __init__(self, start_ns: float = 0.0):
        self.start_ns = float(start_ns)
        self.now_ns = self.start_ns

    @property
    def elapsed_ns(self) -> float:
        """Simulated time the request has taken so far."""
        return self.now_ns - self.start_ns

    def __repr__(self):
        return f"Timeline(start_ns={self.start_ns:.0f}, now_ns={self.now_ns:.0f})"


_local = threading.local()


@contextmanager
def _bound(name: str, value):
    """This thread's ``name`` is ``value`` inside the block (yielded), as before it after."""
    previous = getattr(_local, name, None)
    setattr(_local, name, value)
    try:
        yield value
    finally:
        setattr(_local, name, previous)


def on_timeline(timeline: Timeline):
    """Charge this thread's device reads to ``timeline`` inside the ``with`` block."""
    return _bound("timeline", timeline)


def current_timeline() -> Timeline | None:
    """The timeline this thread's reads are charged to, or None (the store's clock)."""
    return getattr(_local, "timeline", None)


class PacedRequest:
    """One request's paced device waits, taken once at its end (:func:`paced_request`).

    ``deadline_ns`` is the wall-clock (``perf_counter_ns``) completion of the request's
    latest read so far; each next read issues no earlier than it, as if the request had
    waited there, so the device queues see the same schedule as a request that waits after
    every read.
    """

    __slots__ = ("deadline_ns",)

    def __init__(self):
        self.deadline_ns = 0.0

    def wait_for(self, deadline_ns: float) -> None:
        """The request also completes no earlier than ``deadline_ns``."""
        self.deadline_ns = max(self.deadline_ns, float(deadline_ns))

    def __repr__(self):
        return f"PacedRequest(deadline_ns={self.deadline_ns:.0f})"


@contextmanager
def paced_request():
    """Defer the paced waits of this thread's reads inside the block to one wait at its end.

    A request reads table after table, and each paced wait is a sleep and a spin (a few tens
    of microseconds of CPU, and GIL hand-offs between the threads of a serving process);
    one wait per request keeps that to once. Nested blocks join the outermost. An exception
    leaves without waiting.
    """
    if getattr(_local, "paced", None) is not None:
        yield _local.paced
        return
    scope = _local.paced = PacedRequest()
    try:
        yield scope
    finally:
        _local.paced = None
    if scope.deadline_ns:
        wait_until_ns(int(scope.deadline_ns))


def current_paced_request() -> PacedRequest | None:
    """The request this thread's paced reads defer their waits to, or None (wait at once)."""
    return getattr(_local, "paced", None)


def recorded_issues():
    """Record where this thread's device reads issue inside the block, for profiling
    (:mod:`sdm.host.profile`): yields a list to which every charge appends ``(tier kind,
    wall ns)``, the ``perf_counter_ns`` its reads issue from (where the request's work
    reached them, before any wait)."""
    return _bound("issues", [])


def current_issue_log() -> list | None:
    """The list :func:`recorded_issues` is filling on this thread, or None."""
    return getattr(_local, "issues", None)

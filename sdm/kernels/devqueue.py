"""The shared device queue: when a batch of block reads completes, given the device's load.

A device is modeled as parallel internal units: ``units = latency / spacing`` of them, where
``spacing = max(1 / max_read_iops, access_bytes / read_bandwidth)`` (Little's law: a P4500
has ~55 units at 85 us). A read holds one unit for one read latency, so the device serves
``units / latency`` reads per second at most. A batch of ``reads`` issued at queue depth
``q`` keeps ``lanes = min(q, reads)`` reads in flight:

* **Alone on an idle device** it holds ``min(lanes, units)`` units and takes
  ``span = max(ceil(reads / lanes) x latency, reads x spacing)``: waves of one latency while
  its lanes fit in the units (``lanes x spacing <= latency``, the latency-bound regime), the
  device's throughput once they do not. One wave of ``k <= q`` reads takes exactly
  ``max(latency, k x spacing)``, the static form of DESIGN.md §3. A non-integer number of
  units (3DXP's ~5.2) needs no rounding: units are a fluid capacity.
* **Beside other batches** it gets the units that earlier batches left free, up to
  ``min(lanes, units)`` at each instant, and needs ``reads x latency`` unit-ns of them: it
  completes when it has had them, and no sooner than its lone span. A batch keeps the units
  it was given until it is done (its later waves are reserved when it is submitted), so a
  batch submitted later never takes units from one submitted earlier: first come first
  served, but a batch that leaves units idle no longer holds the device's whole queue back.

The device's state is the number of units in use as a step function of time, kept as
breakpoints ``times[:count]`` (ascending, ns) and ``used[:count]`` (units in use from that
breakpoint to the next; 0 before the first, and the last is always 0). Submitting a batch
drops the steps that ended before the caller's watermark and walks those after its issue:
O(batches in flight) per batch, however many reads it has (a request of the bundled trace
reads 10^5 DRAM lines).
"""

from __future__ import annotations

import numpy as np

from sdm.kernels.jit import jit

__all__ = ["make_device_state", "grow_device_state", "reserve", "lone_spans"]

# Capacity below this many units is treated as none: a step saturated up to rounding.
_NO_UNITS = 1e-12
# Overlap with an earlier batch shorter than this, right at the issue, holds no batch back.
_ROUNDING_NS = 1.0


def make_device_state(capacity: int = 64):
    """An idle device: ``(times (capacity,) float64, used (capacity,) float64, count (1,) int64,
    scratch (2, capacity) float64)``. :func:`reserve` needs ``capacity >= count + 3``; the
    caller grows the arrays (:func:`grow_device_state`)."""
    return (np.zeros(capacity, dtype=np.float64), np.zeros(capacity, dtype=np.float64),
            np.zeros(1, dtype=np.int64), np.zeros((2, capacity), dtype=np.float64))


def grow_device_state(state):
    """``state`` with room for at least 3 more breakpoints (twice the capacity when it is full)."""
    times, used, count, scratch = state
    if count[0] + 3 <= len(times):
        return state
    grown = 2 * len(times)
    return np.resize(times, grown), np.resize(used, grown), count, np.zeros((2, grown), dtype=np.float64)


@jit
def _put(out_t, out_u, n, t, v):
    """Append breakpoint ``(t, v)`` to the ``n`` in ``out``, ``t >= out_t[n - 1]``: at the same
    instant the later value holds, a value equal to the one before adds nothing. Returns ``n``."""
    if out_t[n - 1] == t:
        out_u[n - 1] = v
        return n - 1 if n > 1 and out_u[n - 2] == v else n
    if out_u[n - 1] == v:
        return n
    out_t[n] = t
    out_u[n] = v
    return n + 1


# nogil=False: callers hold the device's lock around this short kernel. Releasing the GIL inside
# it lets another thread take the GIL and block on that lock, and the holder then waits a whole
# GIL switch interval to get it back (a lock convoy that measured 10% of serving threads' time).
@jit(nogil=False)
def reserve(times, used, count, scratch, keep_from_ns, issue_ns, reads, queue_depth, latency_ns, units):
    """Submit a batch of ``reads`` (>= 0) block reads issued at ``issue_ns``, ``queue_depth``
    (>= 1) in flight, on the device whose state is ``(times, used, count, scratch)`` (this
    module's docstring, :func:`make_device_state`), and reserve the units it gets.

    ``keep_from_ns`` (<= ``issue_ns``) is the caller's promise that no later batch issues
    before it: the steps that ended by then are dropped. Batches may come out of issue order
    after it (one request's later tables, issued after another request's first), and see
    every reservation made before them.

    Returns:
        ``(took, in_device)``: the batch completes at ``issue_ns + took`` (ns); ``in_device``
        is the time its reads spent issued and not complete, summed (ns: over a window, the
        integral of the device's queue depth). Times are relative to ``issue_ns`` inside, so
        a batch on an idle device takes exactly :func:`lone_spans`, wherever on the clock.
    """
    if reads <= 0:
        return 0.0, 0.0
    lanes = min(queue_depth, reads)
    width = min(float(lanes), units)
    waves = (reads + lanes - 1) // lanes
    span = max(waves * latency_ns, reads * latency_ns / units)
    m = count[0]
    drop = 0  # breakpoints whose step ended by keep_from_ns
    while drop + 1 < m and times[drop + 1] <= keep_from_ns:
        drop += 1
    pos = m  # the first breakpoint at or after the issue
    while pos > drop and times[pos - 1] >= issue_ns:
        pos -= 1
    before = used[pos - 1] if pos > drop else 0.0  # units in use just before the issue
    # Walk the steps from the issue on, taking min(width, free units) until the batch has had
    # reads x latency unit-ns; the last step (after every breakpoint) has all units free.
    left = reads * latency_ns
    u = before
    start = 0.0
    i = pos
    held_back = False  # whether some step left the batch fewer units than its width
    while True:
        end = times[i] - issue_ns if i < m else np.inf
        rate = min(width, units - u)
        if end > start and rate < width:
            # A step ending within _ROUNDING_NS of the issue is an earlier completion rounded
            # down onto the caller's integer-ns clock (the store clock advances by whole ns),
            # not a wait.
            held_back = held_back or start > 0.0 or end >= _ROUNDING_NS
        if rate > _NO_UNITS * units:
            if left <= rate * (end - start):
                finish = start + left / rate
                break
            left -= rate * (end - start)
        start = end
        u = used[i]
        i += 1
    # Never held back, the batch is as alone: exactly its span (finish <= span but for rounding).
    took = max(span, finish) if held_back else span
    # The steps from the issue on, rebuilt in scratch: the batch's units added over [issue,
    # issue + finish); breakpoints at one instant made one, equal neighbours merged.
    out_t = scratch[0]
    out_u = scratch[1]
    end_abs = issue_ns + finish
    out_t[0] = issue_ns
    out_u[0] = min(before + width, units)
    n = 1
    i = pos
    while i < m and times[i] < end_abs:
        n = _put(out_t, out_u, n, times[i], min(used[i] + width, units))
        i += 1
    if i == m or times[i] != end_abs:  # else the old breakpoint there gives the value on
        n = _put(out_t, out_u, n, end_abs, used[i - 1] if i > pos else before)
    if i < m:  # the steps after the batch are as they were, merged already
        n = _put(out_t, out_u, n, times[i], used[i])
        i += 1
    kept = pos - drop
    for j in range(kept):  # shift the steps kept before the issue down over the dropped ones
        times[j] = times[drop + j]
        used[j] = used[drop + j]
    tail = m - i  # moved from [i, m) to [kept + n, ...): n <= i - pos + 2 ahead or behind
    if kept + n > i:
        for j in range(tail - 1, -1, -1):
            times[kept + n + j] = times[i + j]
            used[kept + n + j] = used[i + j]
    elif kept + n < i:
        for j in range(tail):
            times[kept + n + j] = times[i + j]
            used[kept + n + j] = used[i + j]
    for j in range(n):
        times[kept + j] = out_t[j]
        used[kept + j] = out_u[j]
    count[0] = kept + n + tail
    return took, took * reads / waves


@jit
def lone_spans(reads, queue_depth, latency_ns, units, out):
    """``out[i]``: how long a batch of ``reads[i]`` block reads at ``queue_depth`` takes alone
    on an idle device (:func:`reserve`), ``(n,)`` int64 -> ``(n,)`` float64 ns."""
    for i in range(reads.shape[0]):
        k = reads[i]
        if k <= 0:
            out[i] = 0.0
        else:
            lanes = min(queue_depth, k)
            out[i] = max(((k + lanes - 1) // lanes) * latency_ns, k * latency_ns / units)
    return out

"""The shared device queue: when each block read of a batch completes, given the device's load.

A device is modeled as parallel internal units: up to ``units = max_read_iops x latency``
reads in service at once (Little's law), each taking at least the device's read latency,
first come first served once all are busy. In the fluid form used here each read brings
``spacing = max(1 / max_read_iops, access_bytes / read_bandwidth)`` of work, the device does
the work of the reads in the order they were issued (FCFS, whichever request issued them:
this is where requests queue behind one another), and a read completes when its work is
done and its latency has passed::

    work_i = max(work_{i-1}, issue_i) + spacing
    done_i = max(issue_i + latency, work_i)

A batch issues its reads ``queue_depth`` at a time: read ``i`` is issued when read
``i - queue_depth`` of the same batch completes. Alone on an idle device a batch of ``k <= q``
reads then takes exactly ``max(latency, k x spacing)``, and ``k`` reads at queue depth ``q``
take ``ceil(k / q)`` waves of ``max(latency, q x spacing)`` while ``q x spacing <= latency``
and about ``k x spacing`` once the device is throughput-bound: the static form
``max(latency, q / max_iops)`` per read of DESIGN.md §3. A non-integer number of units
(3DXP's ~5.2) needs no rounding.
"""

from __future__ import annotations

import numpy as np

from sdm.kernels.jit import jit

__all__ = ["queue_reads", "lone_batches", "batch_span"]


@jit
def queue_reads(work, issue_ns, reads, queue_depth, latency_ns, spacing_ns, lanes, in_device):
    """Queue ``reads`` block reads issued from ``issue_ns`` on, ``queue_depth`` at a time.

    Args:
        work: ``(1,)`` float64 in/out: when the device finishes the work queued so far (ns).
        issue_ns: when the batch issues its first reads (ns).
        reads: block reads of the batch, >= 0.
        queue_depth: reads of this batch in flight at once, >= 1.
        latency_ns, spacing_ns: the device's read latency and work per read (ns).
        lanes: ``(>= min(queue_depth, reads),)`` float64 scratch.
        in_device: ``(1,)`` float64 in/out, += the time each read spent issued and not yet
            complete (over time, the integral of the device's queue depth).

    Returns:
        How long the batch takes (ns): its completion is ``issue_ns`` plus this. Times are
        kept relative to ``issue_ns`` inside, so a batch on an idle device takes exactly what
        :func:`lone_batches` gives it, wherever on the clock it starts.
    """
    if reads <= 0:
        return 0.0
    q = min(queue_depth, reads)
    for j in range(q):
        lanes[j] = 0.0  # when lane j issues its next read, after issue_ns
    w = max(work[0] - issue_ns, 0.0)
    done = 0.0
    # Once the batch is in a steady state, the rest of it follows in closed form, so a batch
    # of n reads costs O(q) instead of O(n) (an all-hit batch charges its DRAM lines here:
    # ~10^5 reads). Latency-bound (q x spacing <= latency): a wave whose lanes all free at
    # the same T with the device idle by then takes exactly one latency, and so does every
    # later one. Throughput-bound: once q reads in a row were queued behind work and completed
    # when it did, each later read adds one spacing and stays in the device for q spacings.
    latency_bound = q * spacing_ns <= latency_ns
    throughput_bound = q * spacing_ns > latency_ns * (1.0 + 1e-9)
    backlogged = 0  # reads in a row queued behind work and completing when it did
    i = 0
    while i < reads:
        lane = i % q  # a batch's reads complete in issue order, so lanes free round robin
        if lane == 0 and i > 0 and latency_bound:
            t = lanes[0]
            uniform = w <= t
            for j in range(1, q):
                if lanes[j] != t:
                    uniform = False
                    break
            waves = (reads - i) // q
            if uniform and waves > 0:
                w = t + (waves - 1) * latency_ns + q * spacing_ns
                done = t + waves * latency_ns
                in_device[0] += waves * q * latency_ns
                for j in range(q):
                    lanes[j] = done
                i += waves * q
                continue
        if throughput_bound and backlogged >= q:
            left = reads - i
            w += left * spacing_ns
            in_device[0] += left * q * spacing_ns
            done = w
            break
        issue = lanes[lane]
        steady = w >= issue  # the device was still busy: this read adds exactly one spacing
        w = max(w, issue) + spacing_ns
        done = max(issue + latency_ns, w)
        backlogged = backlogged + 1 if steady and done == w else 0
        in_device[0] += done - issue
        lanes[lane] = done
        i += 1
    work[0] = max(work[0], issue_ns + w)
    return done


@jit
def lone_batches(reads, queue_depth, latency_ns, spacing_ns, out):
    """``out[i]``: how long a batch of ``reads[i]`` block reads at ``queue_depth`` takes alone
    on an idle device (:func:`queue_reads`), ``(n,)`` int64 -> ``(n,)`` float64 ns."""
    lanes = np.empty(max(queue_depth, 1), dtype=np.float64)
    scratch = np.zeros(1, dtype=np.float64)
    for i in range(reads.shape[0]):
        work = np.zeros(1, dtype=np.float64)
        out[i] = queue_reads(work, 0.0, reads[i], queue_depth, latency_ns, spacing_ns, lanes, scratch)
    return out


@jit
def batch_span(backlog_ns, reads, queue_depth, latency_ns, spacing_ns):
    """:func:`queue_reads` in closed form, O(1) in ``reads``: ``(done, work)``, both ns after
    the batch's issue, for a batch issued when the device still has ``backlog_ns`` (>= 0) of
    earlier work queued: its last read completes at ``done`` and the device's queued work ends
    at ``work``.

    Why a closed form: a host simulation issues batches of 10^5 DRAM line reads, too many to
    walk one by one. The recurrences of :func:`queue_reads` are max-plus linear, so ``done``
    is the longest path through the reads' graph, whose edges are a device step (the next read
    in FCFS order, ``+spacing``) and a lane step (the read ``q`` later on the same lane,
    ``+latency``, or its issue, ``+spacing``). With ``r - 1 = u q + v`` the longest paths
    are all device steps, device steps to read ``v`` then lane steps, or lane steps from the
    start (``tests/test_host_sim.py`` checks this against the loop).
    """
    if reads <= 0:
        return 0.0, backlog_ns
    q = min(queue_depth, reads)
    u = (reads - 1) // q
    v = (reads - 1) - u * q
    done = max(backlog_ns + reads * spacing_ns, backlog_ns + (v + 1) * spacing_ns + u * latency_ns,
               (u + 1) * latency_ns)
    work = backlog_ns + reads * spacing_ns
    if reads > q:  # a later wave's issue can start device work after the device went idle
        gain = latency_ns - q * spacing_ns
        top = (reads - q - 1) // q
        work = max(work, backlog_ns + (reads + 1 - q) * spacing_ns + max(top * gain, 0.0),
                   reads * spacing_ns + max((top + 1) * gain, gain))
    return done, work

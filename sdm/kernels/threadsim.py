"""Discrete-event simulation of thread workers in one process: a load-dependent processor-sharing server.

Worker threads in one CPython process share its GIL and its cores, and switch every
interval, so the requests in service progress together, each at a share of what the process
completes with that many in service. That share is measured, not derived: ``rate_of_k[k]`` is
the process's closed-loop throughput with ``k`` threads serving back to back
(:func:`sdm.host.workers.closed_loop`), in requests per ns. Serving ``k`` requests, each gets
``rate_of_k[k] / k`` units of work per ns, where a unit is the mean profiled request
(processor sharing whose speed depends on the number served: the flow-equivalent server of
queueing theory, here with the measured curve).

A request ``n`` arrives at ``arrivals[n]`` and is profiled request ``r = n % R`` with
``work[r]`` units. At most ``workers`` are in service; the others wait first come first
served. A request that starts while none is in service, after the process was idle ``g`` ns,
takes ``1 + cpu_share x (f - 1)`` times its work, ``f = interp(g, cold_gap_ns,
cold_factor[cold_row[n]])``: the profile's cold-core factors (a row drawn per request)
stretch CPU time, and ``cpu_share`` of a
request served alone is CPU (the rest is waiting on devices). With others in service the
process is warm. Ties: an arrival at the instant of a completion is taken first. A run is a deterministic function of its inputs.

A request that finds a free worker while ``k`` others hold theirs waits, once served, for
its thread to have woken from the wait for its arrival and got the GIL: ``late[k,
late_q[n]]`` ns, drawn per request from measured quantiles, is added to its latency (the
other requests do not see it). All zeros is the plain server.
"""

from __future__ import annotations

import numpy as np

from sdm.kernels.jit import jit

__all__ = ["simulate_threads"]


@jit
def simulate_threads(arrivals, work, rate_of_k, workers, cold_gap_ns, cold_factor, cpu_share, late, late_q,
                     cold_row, latency_out, busy_out):
    """Run the server of this module's docstring over ``N`` arrivals.

    Args:
        arrivals: ``(N,)`` float64 ns, nondecreasing.
        work: ``(R,)`` float64 > 0: each profiled request's work, in mean requests.
        rate_of_k: ``(W + 1,)`` float64 > 0 from index 1: requests per ns the process
            completes with ``k`` in service (index 0 unused).
        workers: ``W >= 1``, threads: requests in service at once at most.
        cold_gap_ns: ``(G,)`` float64, gaps ascending (``G = 0``: no slowdown).
        cold_factor: ``(S, G)`` float64: the factors of row ``s`` at each gap.
        cpu_share: float in [0, 1]: the CPU share of a request served alone.
        late: ``(W + 1, P)`` float64 >= 0 ns: a waking worker's lateness with ``k`` others
            holding a worker, by quantile index (row 0: an idle process).
        late_q: ``(N,)`` int64 in ``[0, P)``: each arrival's index into ``late``.
        cold_row: ``(N,)`` int64 in ``[0, S)``: each arrival's row of ``cold_factor``.
        latency_out: ``(N,)`` float64 out: completion minus arrival, ns.
        busy_out: ``(W + 1,)`` float64 out: ns spent with ``k`` requests in service.

    Returns:
        When the last request completed (ns).
    """
    n_req = arrivals.shape[0]
    n_prof = work.shape[0]
    rem = np.zeros(workers)  # work left of each request in service
    who = np.zeros(workers, dtype=np.int64)
    wake = np.zeros(workers)  # each one's thread's lateness, added to its latency
    busy_out[:] = 0.0
    k = 0
    now = 0.0
    arrived = 0  # requests [0, arrived) have arrived
    started = 0  # requests [0, started) have started; [started, arrived) wait
    idle_since = 0.0
    last_done = 0.0
    while started < n_req or k > 0:
        t_arrival = arrivals[arrived] if arrived < n_req else np.inf
        t_done = np.inf
        first = -1
        speed = 0.0
        if k > 0:
            speed = rate_of_k[k] / k
            first = 0
            for j in range(1, k):
                if rem[j] < rem[first]:
                    first = j
            t_done = now + max(rem[first], 0.0) / speed
        t = min(t_arrival, t_done)
        if k > 0:
            busy_out[k] += t - now
            for j in range(k):
                rem[j] -= (t - now) * speed
        now = t
        if t_arrival <= t_done:
            arrived += 1
        else:  # the request with the least work left completes; the last in service takes its place
            n = who[first]
            latency_out[n] = now - arrivals[n] + wake[first]
            last_done = max(last_done, now)
            k -= 1
            rem[first], who[first], wake[first] = rem[k], who[k], wake[k]
            if k == 0:
                idle_since = now
        while k < workers and started < arrived:
            w = work[started % n_prof]
            if k == 0 and cold_gap_ns.shape[0] > 0:
                f = np.interp(now - idle_since, cold_gap_ns, cold_factor[cold_row[started]])
                w *= 1.0 + cpu_share * (f - 1.0)
            # a worker free at the arrival was waiting for it; one taking a queued request
            # goes straight on
            rem[k], who[k] = w, started
            wake[k] = late[k, late_q[started]] if arrivals[started] == now else 0.0
            k += 1
            started += 1
    return last_done

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
cold_factor)``: the profile's cold-core factors stretch CPU time, and ``cpu_share`` of a
request served alone is CPU (the rest is waiting on devices). With others in service the
process is warm. Ties: an arrival at the instant of a completion is taken first. A run is a deterministic function of its inputs.

Requests sharing the process do not progress alike: live, which one the GIL and the cores
serve next varies, and a request's latency with ``k`` in service spreads around the mean
curve's. Request ``n`` draws a quantile index ``spread_q[n]``; with ``k`` in service it
progresses at ``rate_of_k[k] / k / spread[k, spread_q[n]]`` (``spread`` holds the measured
quantiles of that ratio, mean 1; all ones is the plain processor sharing). A request that
finds a free worker while ``k`` others hold theirs starts only once its thread, waking from
its wait for the arrival, gets to run: ``late[k, late_q[n]]`` ns, which the request waits
(holding its worker, not yet in service: no share of the process) and its latency includes.
"""

from __future__ import annotations

import numpy as np

from sdm.kernels.jit import jit

__all__ = ["simulate_threads"]


@jit
def simulate_threads(arrivals, work, rate_of_k, workers, cold_gap_ns, cold_factor, cpu_share, spread, spread_q,
                     late, late_q, latency_out, busy_out):
    """Run the server of this module's docstring over ``N`` arrivals.

    Args:
        arrivals: ``(N,)`` float64 ns, nondecreasing.
        work: ``(R,)`` float64 > 0: each profiled request's work, in mean requests.
        rate_of_k: ``(W + 1,)`` float64 > 0 from index 1: requests per ns the process
            completes with ``k`` in service (index 0 unused).
        workers: ``W >= 1``, threads: requests in service at once at most.
        cold_gap_ns, cold_factor: ``(G,)`` float64, gaps ascending (``G = 0``: no slowdown).
        cpu_share: float in [0, 1]: the CPU share of a request served alone.
        spread: ``(W + 1, Q)`` float64 > 0: a request's slowness with ``k`` in service, by
            quantile index (row 0 unused).
        spread_q: ``(N,)`` int64 in ``[0, Q)``: each arrival's index into ``spread``.
        late: ``(W + 1, P)`` float64 >= 0 ns: a waking worker's lateness with ``k`` others
            holding a worker, by quantile index.
        late_q: ``(N,)`` int64 in ``[0, P)``: each arrival's index into ``late``.
        latency_out: ``(N,)`` float64 out: completion minus arrival, ns.
        busy_out: ``(W + 1,)`` float64 out: ns spent with ``k`` requests in service (past
            their lateness).

    Returns:
        When the last request completed (ns).
    """
    n_req = arrivals.shape[0]
    n_prof = work.shape[0]
    rem = np.zeros(workers)  # work left of each request holding a worker
    who = np.zeros(workers, dtype=np.int64)
    begin = np.zeros(workers)  # when it starts progressing (its thread's lateness past)
    busy_out[:] = 0.0
    k = 0  # requests holding a worker: slots [0, k)
    now = 0.0
    arrived = 0  # requests [0, arrived) have arrived
    started = 0  # requests [0, started) have taken a worker; [started, arrived) wait
    idle_since = 0.0
    last_done = 0.0
    while started < n_req or k > 0:
        t_arrival = arrivals[arrived] if arrived < n_req else np.inf
        running = 0
        for j in range(k):
            if begin[j] <= now:
                running += 1
        speed = rate_of_k[running] / running if running > 0 else 0.0
        t_event = np.inf
        first = -1  # the slot whose request completes next, or starts progressing next
        for j in range(k):
            if begin[j] > now:
                t = begin[j]
            else:
                t = now + max(rem[j], 0.0) * spread[running, spread_q[who[j]]] / speed
            if t < t_event:
                t_event = t
                first = j
        t = min(t_arrival, t_event)
        if running > 0:
            busy_out[running] += t - now
            for j in range(k):
                if begin[j] <= now:
                    rem[j] -= (t - now) * speed / spread[running, spread_q[who[j]]]
        completes = first >= 0 and begin[first] <= now
        now = t
        if t_arrival <= t_event:
            arrived += 1
        elif completes:  # its slot goes to the last slot's request
            n = who[first]
            latency_out[n] = now - arrivals[n]
            last_done = max(last_done, now)
            k -= 1
            rem[first], who[first], begin[first] = rem[k], who[k], begin[k]
            if k == 0:
                idle_since = now
        while k < workers and started < arrived:
            n = started
            w = work[n % n_prof]
            if k == 0 and cold_gap_ns.shape[0] > 0:
                w *= 1.0 + cpu_share * (np.interp(now - idle_since, cold_gap_ns, cold_factor) - 1.0)
            # a worker free at the arrival was waiting for it: its thread runs late_q's
            # lateness later; one taking a queued request goes straight on
            wake = late[k, late_q[n]] if arrivals[n] == now else 0.0
            rem[k], who[k], begin[k] = w, n, now + wake
            k += 1
            started += 1
    return last_done

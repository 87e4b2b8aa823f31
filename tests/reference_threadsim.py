"""A slow, obviously correct simulator of thread workers in one process, for
``sdm.kernels.threadsim`` to be checked against: time steps from event to event, each
request in service losing ``rate(k) / k`` of its work per ns while ``k`` are in service, its
thread's lateness added to its latency."""

from __future__ import annotations

import numpy as np


def simulate(arrivals, work, rate_of_k, workers, cold_gap=(), cold_factor=(), cpu_share=1.0,
             late=None, late_q=None, cold_rows=None):
    """Latency (ns) of every arrival (see :mod:`sdm.kernels.threadsim`); no ``late``: none;
    ``cold_factor`` a table (a row per draw): arrival ``n`` takes row ``cold_rows[n]``."""
    n = len(arrivals)
    latency = np.zeros(n)
    in_service: dict[int, float] = {}  # request -> work left, in the order they started
    wake: dict[int, float] = {}  # request -> its thread's lateness, added to its latency
    waiting: list[int] = []
    now, nxt, idle_since = 0.0, 0, 0.0
    while nxt < n or waiting or in_service:
        k = len(in_service)
        speed = rate_of_k[k] / k if k else 0.0
        t_done = now + min(in_service.values()) / speed if k else float("inf")
        t_arrival = arrivals[nxt] if nxt < n else float("inf")
        t = min(t_arrival, t_done)
        for r in in_service:
            in_service[r] -= (t - now) * speed
        now = t
        if t_arrival <= t_done:
            waiting.append(nxt)
            nxt += 1
        else:
            first = min(in_service, key=lambda r: (in_service[r], list(in_service).index(r)))
            del in_service[first]
            latency[first] = now - arrivals[first] + wake[first]
            if not in_service:
                idle_since = now
        while waiting and len(in_service) < workers:
            r = waiting.pop(0)
            w = work[r % len(work)]
            if not in_service and len(cold_gap):
                row = cold_factor[cold_rows[r]] if np.ndim(cold_factor) == 2 else cold_factor
                slower = np.interp(now - idle_since, cold_gap, row) - 1.0  # on the CPU share only
                w *= 1.0 + cpu_share * slower
            wake[r] = late[len(in_service)][late_q[r]] if late is not None and arrivals[r] == now else 0.0
            in_service[r] = w
    return latency

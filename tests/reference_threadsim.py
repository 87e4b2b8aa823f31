"""A slow, obviously correct simulator of thread workers in one process, for
``sdm.kernels.threadsim`` to be checked against: time steps from event to event, each
request past its thread's lateness losing ``rate(k) / k / spread`` of its work per ns while
``k`` are past theirs."""

from __future__ import annotations

import numpy as np


def simulate(arrivals, work, rate_of_k, workers, cold_gap=(), cold_factor=(), cpu_share=1.0,
             spread=None, spread_q=None, late=None, late_q=None):
    """Latency (ns) of every arrival (see :mod:`sdm.kernels.threadsim`); no ``spread``: all
    ones, no ``late``: none."""
    n = len(arrivals)
    latency = np.zeros(n)
    held: dict[int, list] = {}  # request -> [work left, when it starts progressing], by start
    waiting: list[int] = []
    now, nxt, idle_since = 0.0, 0, 0.0

    def slowness(r, k):
        return 1.0 if spread is None else spread[k][spread_q[r]]

    while nxt < n or waiting or held:
        running = [r for r in held if held[r][1] <= now]
        k = len(running)
        speed = rate_of_k[k] / k if k else 0.0
        events = {r: (now + held[r][0] * slowness(r, k) / speed if r in running else held[r][1]) for r in held}
        first = min(held, key=lambda r: (events[r], list(held).index(r))) if held else None
        t_event = events[first] if held else float("inf")
        t_arrival = arrivals[nxt] if nxt < n else float("inf")
        t = min(t_arrival, t_event)
        for r in running:
            held[r][0] -= (t - now) * speed / slowness(r, k)
        completes = first is not None and first in running
        now = t
        if t_arrival <= t_event:
            waiting.append(nxt)
            nxt += 1
        elif completes:
            del held[first]
            latency[first] = now - arrivals[first]
            if not held:
                idle_since = now
        while waiting and len(held) < workers:
            r = waiting.pop(0)
            w = work[r % len(work)]
            if not held and len(cold_gap):
                slower = np.interp(now - idle_since, cold_gap, cold_factor) - 1.0  # on the CPU share only
                w *= 1.0 + cpu_share * slower
            wake = late[len(held)][late_q[r]] if late is not None and arrivals[r] == now else 0.0
            held[r] = [w, now + wake]
    return latency

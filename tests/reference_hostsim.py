"""A slow, obviously-correct host simulator: the peer of sdm.kernels.hostsim.simulate_host.

Plain Python over ``heapq``: every event is ``(time, sequence, what)``; CPU tasks wait in a
``deque`` for a core; each device is a :class:`sdm.tiers.metered.DeviceQueue`-like owner of
one :func:`sdm.kernels.devqueue.reserve` state (that model is checked against its own
plain-Python transcription in ``tests/test_devqueue.py``; sharing its arithmetic here keeps
ties between events the same in both simulators, so they can be compared exactly).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque

import numpy as np

from sdm.kernels.devqueue import grow_device_state, make_device_state, reserve


class _Device:
    def __init__(self, latency_ns, spacing_ns):
        self.latency, self.units = float(latency_ns), latency_ns / spacing_ns
        self.state = make_device_state(2)

    def submit(self, issue, reads, queue_depth):
        self.state = grow_device_state(self.state)
        return reserve(*self.state, issue, issue, reads, queue_depth, self.latency, self.units)[0]


def simulate(arrivals, requests, devices, cores, workers=0, stall=None, wake=None, overlap=False, cold=None,
             read_cpu=None, read_threads=None, cold_rows=None):
    """Latency (ns) of each arrival.

    ``requests``: a list of profiled requests, arrival ``n`` being ``requests[n % R]``; each a
    dict ``{"emb": ns, "bottom": ns, "top": ns, "batches": [(queue_depth, [(device, reads),
    ...]), ...]}``. ``devices``: ``[(latency_ns, spacing_ns), ...]``. ``stall[n][stage]``: ns
    added to arrival ``n``'s CPU task ``stage`` (0 emb, 1 bottom, 2 top); ``wake[n]``: its
    wake-up when it starts on a free worker and after its last device read (default none).
    ``overlap``: a request's reads start when its embedding task starts, not when it ends,
    and its batch ``i`` not before ``after[i] + (f - 1) x cold[i]`` ns into that task
    (``"after"``, ``"cold"``: optional lists per request, default all 0; ``f`` the task's
    cold factor).
    ``cold``: ``(gaps_ns, factors)``: a task's time is multiplied by the factor interpolated at
    how long its core was idle (default none); ``factors`` may be a table, a row per draw, of
    which arrival ``n`` takes row ``cold_rows[n]``.
    ``read_cpu[d]``: core ns each read on device ``d`` costs (default none): a batch with such
    reads also queues ``min(queue_depth, cores, such reads)`` equal CPU tasks of their total,
    and never more than ``read_threads[d]`` of such a device where that is above 0 (default
    0); the next batch waits for them and its reads; no cold factor or stall applies to them.
    """
    stages = {"emb": 0, "bottom": 1, "top": 2}
    seq = itertools.count()
    events = []
    latency = np.zeros(len(arrivals))
    queues = [_Device(lat, spacing) for lat, spacing in devices]
    idle = list(range(cores))  # idle cores, the last one freed at the end
    free_at = [0.0] * cores  # when each core last became idle
    emb_done = set()
    ready = deque()  # CPU tasks (request, stage) in the order they became ready
    waiting = deque()  # arrivals waiting for a worker
    active = 0
    left = {}  # request -> branches (reads, bottom) still running
    step = {}  # request -> index of the batch in flight
    started = {}  # request -> (when its embedding task started, its cold factor)
    batch_left = {}  # request -> its batch's reads and read-CPU tasks still running
    part = {}  # request -> the time of each read-CPU task of its batch

    def cost_of(n, stage):
        return part[n] if stage == "read" else profile(n)[stage]

    def at(t, what):
        heapq.heappush(events, (t, next(seq), what))

    def profile(n):
        return requests[n % len(requests)]

    def begin(n):
        bottom = profile(n)["bottom"] > 0
        left[n] = (2 if bottom else 1) + (1 if overlap else 0)
        ready.append((n, "emb"))
        if bottom:
            ready.append((n, "bottom"))

    def branch_done(n):
        left[n] -= 1
        if left[n] == 0:
            ready.append((n, "top"))

    def issue(n, now):
        batches = profile(n)["batches"]
        if step[n] == len(batches):
            slept = n in emb_done or not overlap  # else its CPU work outlasted the reads
            if step[n] > 0 and wake is not None and wake[n][1] > 0 and slept:
                at(now + wake[n][1], ("woke from reads", n))
            else:
                branch_done(n)
            return
        if overlap:
            start, factor = started[n]
            none = [0] * len(batches)
            due = (start + profile(n).get("after", none)[step[n]]
                   + (factor - 1.0) * profile(n).get("cold", none)[step[n]])
            if due > now:
                at(due, ("due", n))
                return
        qd, parts = batches[step[n]]
        done = 0.0
        cpu = 0.0
        cpu_reads = 0
        threads = [qd]
        for d, reads in parts:
            done = max(done, queues[d].submit(float(now), int(reads), int(qd)))
            cost = 0.0 if read_cpu is None else read_cpu[d]
            cpu += reads * cost
            cpu_reads += reads if cost > 0 else 0
            if cost > 0 and read_threads is not None and read_threads[d] > 0:
                threads.append(read_threads[d])
        at(now + done, ("reads", n))
        batch_left[n] = 1
        if cpu > 0:
            k = min(min(threads), cores, cpu_reads)
            part[n] = cpu / k
            batch_left[n] += k
            ready.extend([(n, "read")] * k)

    def batch_part_done(n, now):
        batch_left[n] -= 1
        if batch_left[n] == 0:
            step[n] += 1
            issue(n, now)

    if len(arrivals):
        at(arrivals[0], ("arrive", 0))
    while events:
        now, _, (kind, *rest) = heapq.heappop(events)
        if kind == "arrive":
            n = rest[0]
            if n + 1 < len(arrivals):
                at(arrivals[n + 1], ("arrive", n + 1))
            if workers <= 0 or active < workers:
                active += 1
                if wake is not None and wake[n][0] > 0:
                    at(now + wake[n][0], ("woke", n))
                else:
                    begin(n)
            else:
                waiting.append(n)
        elif kind == "woke":
            begin(rest[0])
        elif kind == "woke from reads":
            branch_done(rest[0])
        elif kind == "reads":
            batch_part_done(rest[0], now)
        elif kind == "reads start":
            n = rest[0]
            step[n] = 0
            issue(n, now)
        elif kind == "due":
            issue(rest[0], now)
        else:  # a CPU task ended
            n, stage, core = rest
            if core is not None:
                idle.append(core)
                free_at[core] = now
            if stage == "read":
                batch_part_done(n, now)
            elif stage == "emb" and overlap:
                emb_done.add(n)
                branch_done(n)
            elif stage == "emb":
                step[n] = 0
                issue(n, now)
            elif stage == "bottom":
                branch_done(n)
            else:
                latency[n] = now - arrivals[n]
                active -= 1
                if waiting:
                    active += 1
                    begin(waiting.popleft())
        for n, stage in list(ready):
            if cost_of(n, stage) <= 0:  # no core needed, no wait for one
                ready.remove((n, stage))
                at(now, ("cpu", n, stage, None))
                if stage == "emb" and overlap:
                    started[n] = (now, 1.0)
                    at(now, ("reads start", n))
        while ready and idle:
            n, stage = ready.popleft()
            core = idle.pop()
            if stage == "read":  # the device's work, not the request's: no cold factor, no stall
                at(now + part[n], ("cpu", n, stage, core))
                continue
            if cold is None:
                factor = 1.0
            else:
                gaps, factors = cold
                row = factors[cold_rows[n]] if np.ndim(factors) == 2 else factors
                factor = float(np.interp(now - free_at[core], gaps, row))
            cost = profile(n)[stage] * factor
            extra = 0.0 if stall is None else stall[n][stages[stage]]
            at(now + (cost + extra), ("cpu", n, stage, core))
            if stage == "emb" and overlap:
                started[n] = (now, factor)
                at(now, ("reads start", n))
    return latency

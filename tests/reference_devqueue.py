"""A slow, obviously-correct transcription of the shared device model's rules (the peer of
sdm.kernels.devqueue.reserve): every batch's reservation kept as rectangles (start, end, units)
in a plain list, the units in use at an instant summed over them, nothing dropped or merged.

Rules: a batch of ``reads`` at queue depth ``q`` has ``lanes = min(q, reads)`` and may hold
``width = min(lanes, units)`` units; alone it takes ``span = max(ceil(reads / lanes) x latency,
reads x latency / units)``. Submitted after others, it takes ``min(width, units left free)`` at
each instant from its issue until it has had ``reads x latency`` unit-ns, and completes then,
or at its span if that is later; units left free below 1e-12 of the device count as none, and
an earlier batch ending less than 1 ns after the issue holds the batch back from no span.
"""

from __future__ import annotations

import math


class ReferenceDevice:
    def __init__(self, latency_ns: float, units: float):
        self.latency = latency_ns
        self.units = units
        self.held = []  # (start, end, units) of every batch so far
        self.in_device = 0.0

    def used(self, t: float) -> float:
        return sum(w for a, b, w in self.held if a <= t < b)

    def submit(self, issue: float, reads: int, queue_depth: int) -> float:
        """How long the batch takes (ns)."""
        if reads <= 0:
            return 0.0
        lanes = min(queue_depth, reads)
        width = min(lanes, self.units)
        waves = math.ceil(reads / lanes)
        span = max(waves * self.latency, reads * self.latency / self.units)
        points = sorted({issue} | {x for a, b, _ in self.held for x in (a, b) if x > issue}) + [math.inf]
        need = reads * self.latency
        mine = []
        short = False
        for start, end in zip(points, points[1:]):
            rate = min(width, self.units - self.used(start))
            # an overlap under 1 ns right at the issue is a completion rounded to integer ns
            short = short or (rate < width and (start > issue or end - issue >= 1.0))
            if rate <= 1e-12 * self.units:
                continue
            if need <= rate * (end - start):
                finish = start + need / rate
                mine.append((start, finish, rate))
                break
            need -= rate * (end - start)
            mine.append((start, end, rate))
        self.held += mine
        took = max(span, finish - issue) if short else span
        self.in_device += took * reads / waves
        return took

"""Open-loop load tests of a live store (``sdm load``), in the spirit of wrk2 and Triton's
perf_analyzer: requests of a trace arrive as a Poisson process at a set rate, whatever the
store's speed, and each request's latency runs from its *scheduled* arrival, so a slow
server is not hidden by a client that waits for it (no coordinated omission).

* :func:`load_test` runs one or more rates (or searches for the highest rate within a p99
  SLA) and returns a :class:`LoadResult`; :mod:`sdm.load.render` formats it.
"""

from sdm.load.run import LoadPoint, LoadResult, load_test

__all__ = ["load_test", "LoadResult", "LoadPoint"]

"""Thread workers: one process's throughput by requests in service, measured closed-loop.

``sdm load``'s default workers are threads of one process. They share its GIL: the Python
around each kernel runs one thread at a time, and CPython hands the GIL over every switch
interval, so more threads cost more CPU each and can serve fewer requests. The host
simulation's cores and devices (:mod:`sdm.kernels.hostsim`) have no GIL; they describe worker
processes. For threads the profile measures the process itself instead: its throughput and
CPU per request with ``k`` threads serving the trace back to back
(:func:`sdm.host.workers.closed_loop`, the same serving code and switch interval as ``sdm
load``), and the simulation treats the process as a server whose speed depends on the number
of requests in it (:mod:`sdm.kernels.threadsim`).

Measured so on the AMD EPYC VM (bundled trace, ``sdm-nand`` paced, 1 s per count, before
the store bounded its CPU slots): 714 requests/s with one thread, 850 with two, then 523,
536, 453 and 514 with 3, 4, 6 and 8, at 1.1, 1.9, 2.9, 2.9, 3.2 and 2.8 ms of process CPU
per request. A single 1 s count moved by up to 30% between profiles (dram's X(3): 1,647
and 2,044/s), so each count is now measured twice, the counts up and then down.

Beyond the means, the curve keeps how late a thread waking in the process runs while each
count serves (:meth:`ThreadCurve.wake_late_of_k`): a request that arrives while others are
served waits so for its worker, which a closed loop never does.

The curve is this machine's: a host other than ``this-machine`` has no thread workers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from sdm.host.blas import blas_threads
from sdm.host.workers import WARM_REQUESTS, blas_share, closed_loop, frozen_heap, serve, serving_works
from sdm.store.store import Store
from sdm.validate import check_int

__all__ = ["ThreadCurve", "thread_counts", "measure_threads", "MEASURE_S", "QUANTILES"]

#: Seconds each thread count is counted over (after a settling 0.2 s).
MEASURE_S = 1.0


#: Quantiles kept of each count's wake-up lateness, at probabilities ``(i + 0.5) /
#: QUANTILES``: the simulation draws one of them per request.
QUANTILES = 256


def _quantiles(values: np.ndarray) -> np.ndarray:
    """Measured values at the probabilities of :data:`QUANTILES` (each one a value measured, so
    a draw of an index is a draw from what was measured)."""
    return np.quantile(values, (np.arange(QUANTILES) + 0.5) / QUANTILES, method="inverted_cdf")


@dataclass(frozen=True)
class ThreadCurve:
    """``threads`` ``(K,)`` int64, ascending from 1: the thread counts measured; ``qps``
    ``(K,)`` float64: requests per second the process completed with that many serving back
    to back; ``cpu_ns`` ``(K,)`` float64: its CPU time per request (every thread's);
    ``cpu_slots``: the store's bound on lookups running CPU work at once (0: none).

    ``wake_late_ns``: per count, ``(L,)`` float64, how late a thread waking in the process
    ran (:func:`~sdm.host.workers.closed_loop`; empty when not measured)."""

    threads: np.ndarray
    qps: np.ndarray
    cpu_ns: np.ndarray
    cpu_slots: int = 0
    wake_late_ns: tuple = ()

    @property
    def workers(self) -> int:
        """The most threads measured."""
        return int(self.threads[-1])

    def _of_k(self, values: np.ndarray, workers: int) -> np.ndarray:
        out = np.empty(workers + 1)
        out[1:] = np.interp(np.arange(1, workers + 1), self.threads, values)
        out[0] = out[1]  # unused: nothing is served with none in service
        return out

    def rate_of_k(self, workers: int) -> np.ndarray:
        """``(workers + 1,)`` float64 requests per ns with ``k`` in service (linear between
        the counts measured)."""
        return self._of_k(self.qps / 1e9, workers)

    def cpu_of_k(self, workers: int) -> np.ndarray:
        """``(workers + 1,)`` float64 process CPU ns per request with ``k`` in service."""
        return self._of_k(self.cpu_ns, workers)

    def wake_late_of_k(self, workers: int) -> np.ndarray:
        """``(workers + 1, QUANTILES)`` float64 ns: with ``k`` others serving, the quantiles
        of how late a waking thread runs, each linear in ``k`` between the counts measured (a
        count without samples left out); row 0 (an idle process), and every row when no
        count has samples: 0."""
        have = [i for i, w in enumerate(self.wake_late_ns) if w.size]
        out = np.zeros((workers + 1, QUANTILES))
        if have:
            counts = self.threads[have].astype(np.float64)
            rows = np.array([_quantiles(self.wake_late_ns[i]) for i in have])
            for j in range(QUANTILES):
                out[1:, j] = np.interp(np.arange(1, workers + 1), counts, rows[:, j])
        return out

    def to_json(self) -> list:
        out = []
        for i, (k, q, c) in enumerate(zip(self.threads, self.qps, self.cpu_ns)):
            row = {"threads": int(k), "qps": float(q), "cpu_us_per_request": float(c) / 1e3}
            late = self.wake_late_ns[i] if i < len(self.wake_late_ns) else np.zeros(0)
            if late.size:
                row["wake_late_us"] = {f"p{p}": float(np.percentile(late, p)) / 1e3 for p in (50, 95, 99)}
            out.append(row)
        return out


def thread_counts(workers: int) -> list[int]:
    """The thread counts measured for ``workers``: every count to 4, then about 1.5x apart, and
    ``workers`` itself (1, 2, 3, 4, 6, 8 for 8)."""
    workers = check_int(workers, "workers", lo=1, hi=256)
    counts, k = [], 1
    while k < workers:
        counts.append(k)
        k = k + 1 if k < 4 else max(k + 1, int(k * 1.5))
    return counts + [workers]


def measure_threads(store_path, config, trace, request_size, workers: int, *, model: str | None = None,
                    seed: int = 0, fit_model: bool = False, seconds: float = MEASURE_S,
                    cpu_slots: int | None = None) -> ThreadCurve:
    """The :class:`ThreadCurve` of ``workers`` threads serving ``trace`` over the store at
    ``store_path`` under ``config`` (its IO mode), with ``model``'s forward as ``sdm load
    --model`` runs it: each count of :func:`thread_counts` closed-loop for ``seconds``, twice
    (the counts up, then down, so a drift of the machine weighs on every count alike), in
    one process whose store was warmed as a load test's is, its heap frozen, BLAS on the
    threads' share of the cores, the store opened with ``cpu_slots`` (None: the cores, 0: no
    bound). A count's rate and CPU are its two runs' means, its wake-up lateness both runs'."""
    counts = thread_counts(workers)
    with Store.open(os.fspath(store_path), config=config, cpu_slots=cpu_slots) as st:
        slots = st.cpu_slots
        works, net = serving_works(st, trace, request_size, model, seed, fit_model)
        try:
            with blas_threads(blas_share(workers)):
                for work in works[:WARM_REQUESTS]:
                    serve(st, net, work)
                with frozen_heap():
                    up = [closed_loop(st, net, works, k, seconds) for k in counts]
                    down = [closed_loop(st, net, works, k, seconds) for k in reversed(counts)][::-1]
        finally:
            if net is not None:
                net.close()
    # One count's runs last about ``seconds`` each: the mean rate is the rate over both, and
    # the CPU per request is weighted by the requests each run completed.
    qps = np.array([(a.qps + b.qps) / 2 for a, b in zip(up, down)])
    cpu = np.array([(a.qps * a.cpu_ns + b.qps * b.cpu_ns) / (a.qps + b.qps) if a.qps + b.qps > 0
                    else (a.cpu_ns + b.cpu_ns) / 2 for a, b in zip(up, down)])
    return ThreadCurve(np.asarray(counts, dtype=np.int64), qps, cpu, slots,
                       tuple(np.concatenate((a.wake_late_ns, b.wake_late_ns)) for a, b in zip(up, down)))

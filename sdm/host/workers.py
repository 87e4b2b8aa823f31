"""How a serving worker serves requests, shared by ``sdm load`` and the host model.

A request is a :class:`Work` (its bags per table, dense features for a model), served by
:func:`serve`: its bags through the store, or the DLRM forward over the store's tables. A
serving process warms up, freezes its heap (:func:`frozen_heap`), sets BLAS to its share of
the cores (:func:`blas_share`) and, with thread workers, a short switch interval
(:func:`thread_switching`). :func:`closed_loop` is the throughput of ``k`` threads serving so
back to back, with how late a thread waking among them runs, which the host model's thread
workers rest on (:mod:`sdm.host.threads`).
``sdm load`` (:mod:`sdm.load.run`) serves open-loop traffic with the same pieces.
"""

from __future__ import annotations

import gc
import itertools
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from sdm.errors import InvalidArgumentError
from sdm.replay.live import check_store_tables, make_model
from sdm.replay.requests import iter_requests
from sdm.tiers.clock import wait_until_ns
from sdm.validate import check_int, check_number

__all__ = ["Work", "serving_works", "serve", "blas_share", "frozen_heap", "thread_switching",
           "closed_loop", "ClosedLoop", "WARM_REQUESTS", "SWITCH_INTERVAL_S"]

#: Requests a serving process serves before it is measured (its cache and kernels warm).
WARM_REQUESTS = 4096
# Worker threads waking from device waits queue for the GIL behind a thread running Python;
# at CPython's default 5 ms switch interval every wake-up can cost that much (a convoy), so
# thread workers run with a shorter one (restored afterwards).
SWITCH_INTERVAL_S = 2e-4


@dataclass
class Work:
    """What one request runs: its bags per table, and dense features for a model."""

    bags: dict
    dense: np.ndarray | None
    samples: int


def blas_share(workers: int) -> int:
    """BLAS threads for one serving process: the cores over the requests served at once (by
    ``workers`` processes sharing the cores, or threads sharing one process), at least 1."""
    return max(1, (os.cpu_count() or 1) // workers)


@contextmanager
def frozen_heap():
    """The objects alive now, out of the cyclic garbage collector's sight until the block ends
    (``gc.freeze``), as a serving process is after its warm-up.

    A warm serving process holds about 10^5 long-lived objects (the store, Numba's
    dispatchers, the trace's requests). A full collection walks them all, 56-82 ms on the AMD
    EPYC VM, inside whichever request's allocation triggered it. With two worker processes over
    ``dram`` those pauses set the p99 from 356/s on: 43-62 ms at 450 and 600/s, against 4.0-4.7
    ms with the collector off (bench/RESULTS.md). Objects made while serving are still
    collected; a frozen one that becomes garbage in the block waits for the block's end, unless
    reference counting frees it."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _works_of(tr, names, request_size) -> list[Work]:
    """Every request of ``tr`` (``request_size`` samples each, None: as the trace has them),
    its bags keyed by the store's table ``names``."""
    works = []
    for req in iter_requests(tr, request_size):
        bags = {n: (np.ascontiguousarray(ix, dtype=np.int64), np.ascontiguousarray(of, dtype=np.int64))
                for n, ix, of in zip(names, req.indices, req.offsets)}
        works.append(Work(bags, req.dense, req.samples))
    if not works:
        raise InvalidArgumentError("the trace has no requests to send")
    return works


def _with_dense(work: Work, net, seed: int) -> Work:
    """The request's dense features, or seeded random ones when the trace has none of the
    model's width (as ``sdm replay --model``)."""
    dense = work.dense
    if dense is None or dense.ndim != 2 or dense.shape[1] != net.num_dense:
        dense = np.random.default_rng(seed).random((work.samples, net.num_dense), dtype=np.float32)
    return Work(work.bags, np.ascontiguousarray(dense, dtype=np.float32), work.samples)


def serving_works(store, trace, request_size, model: str | None, seed: int, fit_model: bool = False) -> tuple:
    """``(works, net)``: every request of ``trace`` as a :class:`Work` over ``store``'s tables
    (checked against the trace's), and with ``model`` the DLRM over them
    (:func:`sdm.replay.live.make_model`; None without), each request given dense features
    (the trace's, or seeded random ones)."""
    works = _works_of(trace, check_store_tables(store, trace.table_sizes), request_size)
    net = make_model(model, store, seed, trace.table_sizes, fit=fit_model) if model is not None else None
    if net is not None:
        works = [_with_dense(w, net, seed + i) for i, w in enumerate(works)]
    return works, net


def serve(store, net, work: Work, *, overlap: bool | None = None):
    """One request: its bags through the store, or the DLRM forward with the store's tables.
    ``overlap=False`` keeps the lookups on the calling thread (a timeline is per thread)."""
    if net is None:
        return store.embedding_bags(work.bags)
    sparse = [work.bags[n] for n in store.tables]
    return net.forward(work.dense, sparse, embeddings=store, overlap=overlap)


@contextmanager
def thread_switching():
    """CPython's switch interval at most :data:`SWITCH_INTERVAL_S` inside the block."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, SWITCH_INTERVAL_S))
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


class ClosedLoop(NamedTuple):
    """What :func:`closed_loop` measured over its window.

    ``qps``: requests completed per second; ``cpu_ns``: the process's CPU time per request;
    ``wake_late_ns``: ``(L,)`` float64, how late a waiting thread ran again after each of its
    waits came due while the workers served (a request arriving at a busy process waits so
    for its worker)."""

    qps: float
    cpu_ns: float
    wake_late_ns: np.ndarray


#: The probe's waits in closed_loop: uniform over this range (ns), about an arrival gap of a
#: serving process under load.
_PROBE_WAIT_NS = (500_000, 3_000_000)


def closed_loop(store, net, works: list, threads: int, seconds: float, *, settle_s: float = 0.2,
                seed: int = 0) -> ClosedLoop:
    """``threads`` worker threads serving ``works`` back to back, in order and cycled, over
    ``store`` (with ``net``, its forward), as ``sdm load``'s thread workers serve them (the
    same switch interval; the caller freezes the heap and sets BLAS's threads as a load test
    does). Counted over a window that opens ``settle_s`` after the threads start and lasts
    ``seconds``, or longer until ``2 x threads`` requests have completed in it (slow
    requests: a rate needs some): the requests completed in the window over its length, and
    the process's CPU time in it over them.

    Beside the workers a probe thread waits, as an idle ``sdm load`` worker waits for its next
    arrival (:func:`~sdm.tiers.clock.wait_until_ns`, waits seeded by ``seed``), and records how
    late it ran again after each wait: a thread waking in a busy process waits for the GIL.

    The host model's thread workers (:mod:`sdm.host.threads`) rest on this.
    """
    threads = check_int(threads, "threads", lo=1, hi=256)
    seconds = check_number(seconds, "seconds", lo=0, lo_open=True)
    claim = itertools.count().__next__  # atomic under the GIL
    ends: list[list[int]] = [[] for _ in range(threads)]
    late: list[tuple] = []  # (deadline, ns late) of the probe's waits
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker(mine: list) -> None:
        try:
            while not stop.is_set():
                serve(store, net, works[claim() % len(works)])
                mine.append(time.perf_counter_ns())
        except BaseException as exc:  # reported after the run, never lost
            errors.append(exc)
            stop.set()

    def probe() -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            deadline = time.perf_counter_ns() + int(rng.integers(*_PROBE_WAIT_NS))
            wait_until_ns(deadline)
            late.append((deadline, time.perf_counter_ns() - deadline))

    def completed(since: int) -> int:
        return sum(1 for mine in ends for t in list(mine) if t >= since)

    pool = [threading.Thread(target=worker, args=(ends[t],), daemon=True) for t in range(threads)]
    pool.append(threading.Thread(target=probe, daemon=True))
    with thread_switching():
        start = time.perf_counter_ns()
        for t in pool:
            t.start()
        w0 = start + int(settle_s * 1e9)
        time.sleep(max(w0 - time.perf_counter_ns(), 0) / 1e9)
        cpu0 = time.process_time_ns()
        time.sleep(seconds)
        while not stop.is_set() and completed(w0) < 2 * threads:
            time.sleep(0.01)
        w1 = time.perf_counter_ns()
        cpu = time.process_time_ns() - cpu0
        stop.set()
        for t in pool:
            t.join()
    if errors:
        raise errors[0]
    done = sum(1 for mine in ends for t in mine if w0 <= t < w1)
    wake = np.array([ns for d, ns in late if w0 <= d < w1], dtype=np.float64)
    return ClosedLoop(done / ((w1 - w0) / 1e9), cpu / max(done, 1), wake)


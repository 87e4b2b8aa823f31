"""Concurrent serving: many batches in flight over one store, none waiting behind another's
device reads.

Unit tests drive the DRAM cache with a lower tier whose reads block until released, so the
interleavings that matter (a hit while another batch reads, two batches missing the same row,
an eviction aimed at a slot in use, a failed read) happen on purpose. Stress tests run many
threads, and two processes, against every preset with updates under way, and check every
result bit for bit against the version of the rows the batch saw. Every wait has a timeout:
a deadlock fails, it does not hang.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import sdm
from sdm.tiers.base import Bags, Tier
from sdm.tiers.clock import paced_request
from sdm.kernels.serve import hits_commute
from sdm.tiers.dram_cache import DramCacheTier
from sdm.tiers.metered import Metered
from sdm.tiers.manifest import TableLayout, TableSpec

TIMEOUT = 60  # seconds any single wait may take before the test fails


class GatedTier(Tier):
    """Rows from an array; reads of ids in ``gated`` block until ``gate`` is set, and every
    read is logged (ids), so tests see who read what and when."""

    name = "gated"

    def __init__(self, rows: np.ndarray):
        self.rows = rows
        self.gate = threading.Event()
        self.gated: set[int] = set()
        self.entered = threading.Event()  # set when a gated read starts waiting
        self.reads: list[list[int]] = []
        self.fail_next = False
        self._lock = threading.Lock()

    def read_rows(self, layout, ids, out):
        with self._lock:
            self.reads.append(ids.tolist())
            fail, self.fail_next = self.fail_next, False
        if self.gated & set(ids.tolist()):
            self.entered.set()
            assert self.gate.wait(TIMEOUT), "gated read never released"
        if fail:
            raise OSError("injected read failure")
        np.take(self.rows, ids, axis=0, out=out)

    def row_offsets(self, layout, ids):
        return ids * layout.spec.row_bytes


SPEC = TableSpec("t", 64, 4, "fp32")
LAYOUT = TableLayout.for_spec(SPEC, 0)


# lru takes the general path for every batch; sieve serves a batch of hits alone in one pass
# (DramCacheTier._serve_hits), which must keep the same promises
POLICIES = ["lru", "sieve"]


@pytest.fixture(params=POLICIES)
def cache(request):
    rows = sdm.quantize_rows(np.arange(64 * 4, dtype=np.float32).reshape(64, 4), "fp32")
    lower = GatedTier(rows)
    return DramCacheTier(lower, 8, SPEC.row_bytes, policy=request.param), lower


def bags(ids):
    ids = np.asarray(ids, dtype=np.int64)
    return ids, np.array([0, len(ids)], dtype=np.int64)


def pooled(cache, ids):
    out = np.empty((1, 4), dtype=np.float32)
    cache.pool_bags([Bags(LAYOUT, *bags(ids), None, False, out)])
    return out[0]


def want(ids):
    return np.arange(64 * 4, dtype=np.float32).reshape(64, 4)[list(ids)].sum(axis=0)


def test_hits_do_not_wait_for_another_batchs_device_reads(cache):
    cache, lower = cache
    np.testing.assert_array_equal(pooled(cache, [1, 2]), want([1, 2]))  # now cached
    lower.gated = {9}
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(pooled, cache, [9])  # a miss, blocked in its device read
        assert lower.entered.wait(TIMEOUT)
        fast = pool.submit(pooled, cache, [1, 2])  # hits only
        np.testing.assert_array_equal(fast.result(TIMEOUT), want([1, 2]))
        assert not slow.done()  # the hit batch finished while the miss was still reading
        lower.gate.set()
        np.testing.assert_array_equal(slow.result(TIMEOUT), want([9]))


@pytest.mark.parametrize("policy", POLICIES)
def test_a_row_read_under_a_deferred_wait_is_not_there_before_its_read_completes(policy):
    """A paced request marks its rows ready before its deferred wait ends (paced_request);
    another request hitting one of them completes no earlier than that read, with or
    without a deferred wait of its own."""
    rows = sdm.quantize_rows(np.arange(64 * 4, dtype=np.float32).reshape(64, 4), "fp32")
    slow = dataclasses.replace(sdm.DEVICES["nand-p4500"], name="slow", read_latency_us=200_000.0,
                               max_read_iops=1000.0)
    cache = DramCacheTier(Metered(GatedTier(rows), slow, io_mode="paced"), 8, SPEC.row_bytes, policy=policy)

    def other(deferred):
        if deferred:
            with paced_request() as b:
                got = pooled(cache, [3])
            return got, b.deadline_ns, time.perf_counter_ns()
        out = np.empty((1, SPEC.row_bytes), dtype=np.uint8)
        cache.read_rows(LAYOUT, np.array([3]), out)
        return sdm.dequantize_rows(out, "fp32", 4)[0], 0.0, time.perf_counter_ns()

    for deferred in (True, False):
        with paced_request() as a:
            np.testing.assert_array_equal(pooled(cache, [3, 4 + deferred]), want([3, 4 + deferred]))
            read_done = a.deadline_ns
            with ThreadPoolExecutor(1) as pool:
                got, deadline, end = pool.submit(other, deferred).result(TIMEOUT)
        np.testing.assert_array_equal(got, want([3]))
        assert end >= read_done and (not deferred or deadline >= read_done)
        cache.invalidate(LAYOUT)  # the next round misses row 3 again


@pytest.mark.parametrize("policy", POLICIES + ["lfu"])  # lfu: no one-pass batches of hits
def test_threads_serving_hits_alone_and_misses_at_once_get_their_rows(policy):
    """Four threads pool batches through a cache of 40 of 64 rows: batches of hits alone (one
    pass, where hits commute) and batches with misses run at once, hold slots for each other and pin
    the ones they share. Every result is exact, and at the end nothing is in flight or pinned."""
    rows = sdm.quantize_rows(np.arange(64 * 4, dtype=np.float32).reshape(64, 4), "fp32")
    cache = DramCacheTier(GatedTier(rows), 40, SPEC.row_bytes, policy=policy)
    served_alone = []
    serve_hits = cache._serve_hits

    def counted(*args):
        batch = serve_hits(*args)
        served_alone.append(batch is not None)
        return batch

    cache._serve_hits = counted

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(300):
            ids = rng.integers(0, 24 if rng.random() < 0.8 else 64, rng.integers(1, 20)).tolist()
            np.testing.assert_array_equal(pooled(cache, ids), want(ids))

    with ThreadPoolExecutor(4) as pool:
        for done in [pool.submit(worker, seed) for seed in range(4)]:
            done.result(TIMEOUT)
    assert not cache._flying and cache._inflight == 0 and not cache.directory.pin_counts().any()
    cache.check_invariants()
    assert any(served_alone) == hits_commute(cache.directory._code, 0)


def test_two_batches_missing_one_row_read_it_once(cache):
    cache, lower = cache
    lower.gated = {5}
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(pooled, cache, [5])
        assert lower.entered.wait(TIMEOUT)
        second = pool.submit(pooled, cache, [5, 6])  # 5 is pending: waits for it, reads 6
        while not any(6 in r for r in lower.reads):
            assert not second.done()
            threading.Event().wait(0.001)
        assert not second.done()  # it waits for row 5, which the first batch is reading
        lower.gate.set()
        np.testing.assert_array_equal(first.result(TIMEOUT), want([5]))
        np.testing.assert_array_equal(second.result(TIMEOUT), want([5, 6]))
    assert sum(r.count(5) for r in lower.reads) == 1


def test_slots_in_use_are_never_evicted(cache):
    cache, lower = cache
    lower.gated = {0}
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(pooled, cache, list(range(8)))  # fills every slot; 0 blocks
        assert lower.entered.wait(TIMEOUT)
        # every slot is pinned by the first batch: these misses find no victim, so they are
        # served from scratch, not admitted, and the first batch's rows survive
        np.testing.assert_array_equal(pooled(cache, list(range(20, 28))), want(range(20, 28)))
        lower.gate.set()
        np.testing.assert_array_equal(held.result(TIMEOUT), want(range(8)))
    assert cache.stats()["not_admitted"] == 8
    np.testing.assert_array_equal(pooled(cache, list(range(8))), want(range(8)))  # all hits
    assert cache.stats()["hits"] == 8
    cache.check_invariants()
    assert not cache.directory.pin_counts().any()


def test_a_failed_read_is_read_again_by_the_next_batch(cache):
    cache, lower = cache
    lower.fail_next = True
    with pytest.raises(OSError, match="injected"):
        pooled(cache, [3])
    np.testing.assert_array_equal(pooled(cache, [3]), want([3]))  # the slot was not trusted
    assert [r for r in lower.reads if 3 in r] == [[3], [3]]
    assert not cache.directory.pin_counts().any()


def test_a_waiter_reads_a_row_whose_read_failed(cache):
    cache, lower = cache
    lower.gated = {4}
    lower.fail_next = True
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(pooled, cache, [4])
        assert lower.entered.wait(TIMEOUT)
        second = pool.submit(pooled, cache, [4])  # waits for the first's read of 4
        threading.Event().wait(0.05)
        lower.gate.set()
        with pytest.raises(OSError):
            first.result(TIMEOUT)
        np.testing.assert_array_equal(second.result(TIMEOUT), want([4]))
    assert not cache.directory.pin_counts().any()


def test_prefetched_rows_are_never_evicted_before_release(cache):
    cache, lower = cache
    cache.prefetch(LAYOUT, np.arange(6, dtype=np.int64))
    pooled(cache, list(range(30, 40)))  # pressure: only 2 unpinned slots
    before = len(lower.reads)
    np.testing.assert_array_equal(pooled(cache, list(range(6))), want(range(6)))
    assert len(lower.reads) == before  # every prefetched row was still there
    cache.release(LAYOUT, np.arange(6, dtype=np.int64))
    assert not cache.directory.pin_counts().any()


# -- the store under many threads and two processes -------------------------------------------

PRESETS = ["dram", "ssd", "sdm-nand", "sdm-3dxp", "three-tier"]
TABLES = [sdm.TableSpec("a", 3000, 8, "fp32"), sdm.TableSpec("b", 2000, 16, "fp16"),
          sdm.TableSpec("c", 1000, 8, "fp32")]
BASE = {t.name: np.random.default_rng(i).integers(-50, 50, (t.num_rows, t.dim)).astype(np.float32)
        for i, t in enumerate(TABLES)}


def small_cache(preset):
    """The preset with caches of a few hundred rows, so batches evict each other's rows."""
    if preset in ("dram", "ssd"):
        return preset
    from sdm.store.config import HIERARCHY_PRESETS, with_options
    return with_options(HIERARCHY_PRESETS[preset], cache_bytes=200 * 64)


def random_batch(rng):
    out = {}
    for t in TABLES:
        lens = rng.integers(0, 6, 8)
        ids = rng.zipf(1.2, int(lens.sum())) % t.num_rows  # skewed: batches share rows
        out[t.name] = (ids.astype(np.int64), np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
    return out


def expected(batch, shift):
    """Pooled sums when table ``name`` holds ``BASE[name] + shift[name]`` (integers: exact)."""
    return {n: sdm.embedding_bag(BASE[n] + shift[n], ids, off) for n, (ids, off) in batch.items()}


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("serving") / "s"
    with sdm.Store.create(path, TABLES) as store:
        for t in TABLES:
            store.write_table(t.name, BASE[t.name])
    return path


def serve_many(store, batches, workers):
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(store.embedding_bags, b) for b in batches]
        return [f.result(TIMEOUT) for f in futures]


@pytest.mark.parametrize("preset", PRESETS)
def test_many_threads_equal_a_serial_run_bitwise(store_path, preset):
    rng = np.random.default_rng(7)
    batches = [random_batch(rng) for _ in range(120)]
    zero = {t.name: 0 for t in TABLES}
    with sdm.Store.open(store_path, config=small_cache(preset)) as store:
        results = serve_many(store, batches, 8)
        stats = store.stats()
    for batch, got in zip(batches, results):
        for name, want_ in expected(batch, zero).items():
            assert got[name].view(np.uint32).tobytes() == want_.view(np.uint32).tobytes()
    cache = [t for t in stats["tiers"] if t["kind"] == "cache"]
    if cache:
        assert cache[0]["hits"] > 0 and cache[0]["misses"] > 0  # the stress did evict


@pytest.mark.parametrize("preset", ["sdm-nand", "three-tier"])
def test_paced_threads_with_updates_see_one_version_per_batch(tmp_path, preset):
    """Readers in 6 threads, paced (real device waits widen every race), while a writer
    thread updates whole tables: each batch equals the rows of one version, bit for bit."""
    path = tmp_path / "s"
    with sdm.Store.create(path, TABLES) as store:
        for t in TABLES:
            store.write_table(t.name, BASE[t.name])
    from sdm.store.config import with_io_mode
    config = with_io_mode(small_cache(preset), "paced")
    history = [(0, {t.name: 0 for t in TABLES})]  # (version, shift per table) in order
    stop = threading.Event()

    def write():
        shift = dict(history[-1][1])
        with sdm.Store.open(path) as writer:
            for k in range(12):
                name = TABLES[k % len(TABLES)].name
                shift[name] += 1
                ids = np.arange(BASE[name].shape[0], dtype=np.int64)
                version = writer.update_rows(name, ids, BASE[name] + shift[name])
                history.append((version, dict(shift)))
                if stop.wait(0.01):
                    return

    rng = np.random.default_rng(3)
    batches = [random_batch(rng) for _ in range(150)]
    with sdm.Store.open(path, config=config) as store:
        writer = threading.Thread(target=write)
        writer.start()
        try:
            results = serve_many(store, batches, 6)
        finally:
            stop.set()
            writer.join(TIMEOUT)
        assert not writer.is_alive()
    for batch, got in zip(batches, results):
        matches = [v for v, shift in history
                   if all(got[n].view(np.uint32).tobytes() == w.view(np.uint32).tobytes()
                          for n, w in expected(batch, shift).items())]
        assert matches, "a batch matched no single version of the rows"


def _reader_process(path, preset, seed, out):
    """A second process serving batches from the same store directory (threads inside)."""
    rng = np.random.default_rng(seed)
    batches = [random_batch(rng) for _ in range(40)]
    with sdm.Store.open(path, config=small_cache(preset)) as store:
        results = serve_many(store, batches, 4)
    zero = {t.name: 0 for t in TABLES}
    bad = sum(any(got[n].view(np.uint32).tobytes() != w.view(np.uint32).tobytes()
                  for n, w in expected(b, zero).items()) for b, got in zip(batches, results))
    out.put(bad)


@pytest.mark.parametrize("preset", ["sdm-nand", "three-tier"])
def test_two_processes_with_threads_share_one_store(store_path, preset):
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_reader_process, args=(str(store_path), preset, s, out))
             for s in (1, 2)]
    for p in procs:
        p.start()
    try:
        bad = [out.get(timeout=TIMEOUT * 10) for _ in procs]  # a cold JIT cache compiles first
    finally:
        for p in procs:
            p.join(TIMEOUT)
            if p.is_alive():
                p.kill()
    assert bad == [0, 0] and all(p.exitcode == 0 for p in procs)


def test_the_gil_is_released_while_pooling(store_path):
    """Pooling a large batch in one thread leaves the GIL to another (kernels are nogil)."""
    rng = np.random.default_rng(0)
    big = {"a": (rng.integers(0, 3000, 400_000).astype(np.int64),
                 np.arange(0, 400_001, 100, dtype=np.int64))}
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(1)
            stop.wait(0.0005)

    with sdm.Store.open(store_path, config="dram") as store:
        store.embedding_bags(big)  # compile and load
        t = threading.Thread(target=tick)
        t.start()
        for _ in range(5):
            store.embedding_bags(big)
        stop.set()
        t.join(TIMEOUT)
    assert len(ticks) > 5


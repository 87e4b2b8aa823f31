"""A hypothesis state machine serves concurrent requests against a dict model.

Each step runs several requesters at once (threads started together on a barrier, and a
second process serving the same store directory) while the model's owner updates rows or
publishes whole tables, under every hierarchy preset and a cache small enough to evict on
every batch, modeled and paced:

* every batch equals, bit for bit, ``sdm.embedding_bag`` on the model's rows of one version
  (the one before or after a write running beside it), so no half-filled slot is served and
  no batch mixes versions;
* when every requester is done, no slot is pinned or pending any more;
* every wait has a timeout, so a deadlock fails the test instead of hanging it.
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import sdm
from sdm.kernels.serve import READY_BITS, SLOT_PENDING
from sdm.store.config import HIERARCHY_PRESETS, HierarchyConfig, TierConfig, with_io_mode

TIMEOUT = 60  # seconds any one wait may take
SPECS = [sdm.TableSpec("a", 400, 8, "fp32"), sdm.TableSpec("b", 300, 16, "int8")]
BY_NAME = {s.name: s for s in SPECS}

TIGHT = HierarchyConfig("tight", (TierConfig("cache", capacity_rows=24, policy="sieve"),
                                  TierConfig("mmap", "nand-p4500", queue_depth=4)))
CONFIGS = {**HIERARCHY_PRESETS, "tight": TIGHT}


def random_rows(spec, seed):
    return np.random.default_rng(seed).standard_normal((spec.num_rows, spec.dim)).astype(np.float32)


def random_batch(seed):
    """A request over one or both tables: up to 12 bags of 0-6 ids each."""
    rng = np.random.default_rng(seed)
    names = [s.name for s in SPECS if rng.random() < 0.7] or ["a"]
    batch = {}
    for name in names:
        sizes = rng.integers(0, 7, rng.integers(1, 13))
        ids = rng.integers(0, BY_NAME[name].num_rows, int(sizes.sum())).astype(np.int64)
        batch[name] = (ids, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
    return batch


def encoded(name, rows):
    """``rows`` as table ``name`` stores them: ``(n, row_bytes) uint8`` (quantized once, so
    the model's int8 codes, scales and biases are the store's exactly)."""
    return sdm.quantize_rows(rows, BY_NAME[name].fmt)


def expected(raw, batch):
    """What the store must return for ``batch`` when its tables hold ``raw``."""
    return {name: sdm.embedding_bag(sdm.formats.typed_rows(raw[name], BY_NAME[name].fmt), ids, offsets,
                                    fmt=BY_NAME[name].fmt, dim=BY_NAME[name].dim)
            for name, (ids, offsets) in batch.items()}


def same(got, want):
    return sorted(got) == sorted(want) and all(
        got[n].view(np.uint32).tobytes() == want[n].view(np.uint32).tobytes() for n in want)


def _serve_process(conn):
    """A second process: ``("open", path, config)``, ``("serve", [batch, ...])`` (2 threads),
    ``("close",)``; answers every command on ``conn``."""
    store = None
    while True:
        command = conn.recv()
        try:
            if command[0] == "open":
                store = sdm.Store.open(command[1], config=command[2], readonly=True)
                conn.send(("ok", None))
            elif command[0] == "serve":
                with ThreadPoolExecutor(2) as pool:
                    conn.send(("ok", list(pool.map(store.embedding_bags, command[1]))))
            elif command[0] == "close":
                if store is not None:
                    store.close()
                store = None
                conn.send(("ok", None))
            else:
                return
        except Exception as exc:  # noqa: BLE001 - sent to the test, which fails on it
            conn.send(("error", repr(exc)))


class ServingProcess:
    """The test's end of :func:`_serve_process`; every answer has a timeout. Started warm:
    it has served a batch under ``config`` once (a cold JIT cache compiles for minutes)."""

    def __init__(self, config):
        self.conn, child = mp.get_context("spawn").Pipe()
        self.proc = mp.get_context("spawn").Process(target=_serve_process, args=(child,), daemon=True)
        self.proc.start()
        warm = tempfile.mkdtemp(prefix="sdm-serving-warm-")
        try:
            with sdm.Store.create(f"{warm}/s", SPECS) as store:
                for spec in SPECS:
                    store.write_table(spec.name, random_rows(spec, 0))
            self.ask("open", f"{warm}/s", config, timeout=TIMEOUT * 10)
            self.ask("serve", [random_batch(0)], timeout=TIMEOUT * 10)
            self.ask("close")
        finally:
            shutil.rmtree(warm, ignore_errors=True)

    def ask(self, *command, timeout=TIMEOUT):
        self.conn.send(command)
        return self.answer(command[0], timeout)

    def answer(self, command, timeout=TIMEOUT):
        if not self.conn.poll(timeout):
            raise AssertionError(f"the serving process did not answer {command!r} in {timeout} s")
        status, value = self.conn.recv()
        assert status == "ok", value
        return value

    def stop(self):
        self.conn.send(("stop",))
        self.proc.join(TIMEOUT)
        if self.proc.is_alive():
            self.proc.kill()


class ConcurrentServing(RuleBasedStateMachine):
    """The model: ``self.raw[name]`` holds the encoded rows every batch must pool."""

    config: HierarchyConfig = TIGHT
    process: ServingProcess | None = None  # set per test: one process serves every example

    @initialize(seed=st.integers(0, 2**16))
    def create(self, seed):
        self.dir = tempfile.mkdtemp(prefix="sdm-serving-sm-")
        self.path = f"{self.dir}/s"
        self.store = sdm.Store.create(self.path, SPECS, config=self.config)
        self.raw = {}
        for i, spec in enumerate(SPECS):
            rows = random_rows(spec, seed + i)
            self.store.write_table(spec.name, rows)
            self.raw[spec.name] = encoded(spec.name, rows)
        self.opened_remote = False

    def serve_together(self, batches, during=None):
        """Serve ``batches`` on one thread each, started together; ``during()`` runs on this
        thread meanwhile. Returns the results in order."""
        barrier = threading.Barrier(len(batches) + 1, timeout=TIMEOUT)

        def serve(batch):
            barrier.wait()
            return self.store.embedding_bags(batch)

        with ThreadPoolExecutor(len(batches)) as pool:
            futures = [pool.submit(serve, b) for b in batches]
            barrier.wait()
            if during is not None:
                during()
            return [f.result(TIMEOUT) for f in futures]

    @rule(seeds=st.lists(st.integers(0, 2**32 - 1), min_size=2, max_size=8))
    def concurrent_batches(self, seeds):
        batches = [random_batch(s) for s in seeds]
        for batch, got in zip(batches, self.serve_together(batches)):
            assert same(got, expected(self.raw, batch))

    def write_beside_readers(self, seeds, write):
        """Serve ``seeds``' batches while ``write(after)`` changes the store and ``after``, a
        copy of the model: every batch equals the rows before or the rows after, whole."""
        before, after = self.raw, {n: r.copy() for n, r in self.raw.items()}
        batches = [random_batch(s) for s in seeds]
        results = self.serve_together(batches, during=lambda: write(after))
        self.raw = after
        for batch, got in zip(batches, results):
            assert same(got, expected(before, batch)) or same(got, expected(self.raw, batch)), \
                "a batch matched neither the version before the write nor the one after"

    @rule(seeds=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=6),
          name=st.sampled_from(sorted(BY_NAME)), seed=st.integers(0, 2**16), every=st.booleans())
    def update_beside_readers(self, seeds, name, seed, every):
        spec = BY_NAME[name]
        rng = np.random.default_rng(seed)
        ids = (np.arange(spec.num_rows) if every else
               np.unique(rng.integers(0, spec.num_rows, rng.integers(1, 40)))).astype(np.int64)
        rows = rng.standard_normal((len(ids), spec.dim)).astype(np.float32)

        def write(model):
            self.store.update_rows(name, ids, rows)
            model[name][ids] = encoded(name, rows)

        self.write_beside_readers(seeds, write)

    @rule(seeds=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=6),
          name=st.sampled_from(sorted(BY_NAME)), seed=st.integers(0, 2**16))
    def publish_beside_readers(self, seeds, name, seed):
        spec = BY_NAME[name]
        rows = random_rows(spec, seed)

        def write(model):
            self.store.write_table(name, rows)
            model[name] = encoded(name, rows)

        self.write_beside_readers(seeds, write)

    @rule(ahead=st.integers(0, 2**32 - 1), others=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=4))
    def prefetched_beside_others(self, ahead, others):
        batch = random_batch(ahead)
        ticket = self.store.prefetch(batch)
        batches = [batch] + [random_batch(s) for s in others]
        try:
            results = self.serve_together(batches)
        finally:
            self.store.release(ticket)
        for b, got in zip(batches, results):
            assert same(got, expected(self.raw, b))

    @rule(seeds=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=6),
          name=st.sampled_from(sorted(BY_NAME)), seed=st.integers(0, 2**16),
          write=st.sampled_from([None, "update", "publish"]))
    def another_process(self, seeds, name, seed, write):
        """The second process serves batches while this one updates or publishes."""
        if self.process is None:
            return
        if not self.opened_remote:  # a process opens once, then follows the writes itself
            self.process.ask("open", self.path, self.config)
            self.opened_remote = True
        before, after = self.raw, {n: r.copy() for n, r in self.raw.items()}
        batches = [random_batch(s) for s in seeds]
        self.process.conn.send(("serve", batches))
        rows = random_rows(BY_NAME[name], seed)
        if write == "update":
            ids = np.arange(0, len(rows), 3, dtype=np.int64)
            self.store.update_rows(name, ids, rows[ids])
            after[name][ids] = encoded(name, rows[ids])
        elif write == "publish":
            self.store.write_table(name, rows)
            after[name] = encoded(name, rows)
        results = self.process.answer("serve")
        self.raw = after
        for batch, got in zip(batches, results):
            assert same(got, expected(before, batch)) or same(got, expected(self.raw, batch))

    @invariant()
    def nothing_left_pinned_or_pending(self):
        hierarchy = getattr(getattr(self, "store", None), "_hierarchy", None)
        cache = hierarchy and hierarchy._cache and hierarchy._cache.inner
        if cache is not None:
            cache.check_invariants()
            assert not cache.directory.pin_counts().any()
            assert not ((cache._state & READY_BITS) == SLOT_PENDING).any()
            assert not cache._flying  # every batch left the set in flight

    def teardown(self):
        if self.process is not None and getattr(self, "opened_remote", False):
            self.process.ask("close")
        if hasattr(self, "store"):
            self.store.close()
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.mark.parametrize("io_mode", ["modeled", "paced"])
@pytest.mark.parametrize("preset", sorted(CONFIGS))
def test_concurrent_serving_state_machine(preset, io_mode):
    config = with_io_mode(CONFIGS[preset], io_mode)
    machine = type(f"ConcurrentServing_{preset}_{io_mode}", (ConcurrentServing,), {"config": config})
    settings(max_examples=4, stateful_step_count=6, deadline=None,
             suppress_health_check=[HealthCheck.too_slow])(machine).TestCase().runTest()


@pytest.mark.parametrize("preset", ["sdm-nand", "tight"])
def test_concurrent_serving_state_machine_with_a_second_process(preset):
    process = ServingProcess(CONFIGS[preset])
    try:
        machine = type(f"ConcurrentServing2_{preset}", (ConcurrentServing,),
                       {"config": CONFIGS[preset], "process": process})
        settings(max_examples=3, stateful_step_count=8, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])(machine).TestCase().runTest()
    finally:
        process.stop()

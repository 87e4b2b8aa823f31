"""A hypothesis state machine drives a store against a dict model through random batches,
prefetched batches, table writes (whole snapshots), row updates and reopens, under every hierarchy preset and every live
cache policy, for every row format: results are bitwise those of ``sdm.embedding_bag`` on
the model's rows, so identical across hierarchies. Plus concurrent readers."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import threading

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import sdm
from sdm.store.config import CACHE_POLICIES, HIERARCHY_PRESETS, HierarchyConfig, TierConfig

SPECS = [sdm.TableSpec("f32", 300, 8, "fp32"), sdm.TableSpec("f16", 200, 4, "fp16"),
         sdm.TableSpec("i8", 500, 16, "int8")]
NAMES = [s.name for s in SPECS]
BY_NAME = {s.name: s for s in SPECS}



def tight(policy, admission=None):
    """A cache of 40 rows over Nand SCM: batches hit, miss and evict all the time."""
    name = f"tight-{policy}" + (f"-{admission}" if admission else "")
    return HierarchyConfig(name, (TierConfig("cache", capacity_rows=40, policy=policy, admission=admission),
                                  TierConfig("mmap", "nand-p4500", queue_depth=4)))


CONFIGS = {**HIERARCHY_PRESETS, **{f"tight-{p}": tight(p) for p in CACHE_POLICIES},
           "tight-lru-tinylfu": tight("lru", "tinylfu"), "tight-sieve-threshold": tight("sieve", "threshold"),
           # a pooled-embedding cache small enough to evict, over a tight row cache and over DRAM
           "tight-lru-pooled": dataclasses.replace(tight("lru"), pooled_cache_bytes=2048),
           "dram-pooled": dataclasses.replace(HIERARCHY_PRESETS["dram"], pooled_cache_bytes=1 << 16)}


def decoded(spec, rows):
    return sdm.dequantize_rows(sdm.quantize_rows(rows, spec.fmt), spec.fmt, spec.dim)


def kernel_table(spec, rows):
    """The model's rows as ``sdm.embedding_bag`` takes them for ``spec.fmt``."""
    raw = sdm.quantize_rows(rows, spec.fmt)
    return sdm.formats.typed_rows(raw, spec.fmt)


class StoreMachine(RuleBasedStateMachine):
    """The model: ``self.rows[name]`` is what every lookup of ``name`` must return."""

    preset = "dram"

    @initialize()
    def create(self):
        self.dir = tempfile.mkdtemp(prefix="sdm-sm-")
        self.path = f"{self.dir}/s"
        self.store = sdm.Store.create(self.path, SPECS, config=CONFIGS[self.preset])
        self.rows: dict[str, np.ndarray] = {}
        self.kernel_rows: dict[str, np.ndarray] = {}

    @rule(name=st.sampled_from(NAMES), seed=st.integers(0, 2**16), chunked=st.booleans())
    def write(self, name, seed, chunked):
        spec = BY_NAME[name]
        rows = np.random.default_rng(seed).standard_normal((spec.num_rows, spec.dim)).astype(np.float32)
        data = (rows[i:i + 64] for i in range(0, spec.num_rows, 64)) if chunked else rows
        self.store.write_table(name, data)
        self.rows[name] = decoded(spec, rows)
        self.kernel_rows[name] = kernel_table(spec, rows)

    def draw_batch(self, data):
        names = data.draw(st.lists(st.sampled_from(sorted(self.rows)), min_size=1, unique=True))
        requests, expected = {}, {}
        for name in names:
            spec = BY_NAME[name]
            sizes = data.draw(st.lists(st.integers(0, 6), min_size=1, max_size=8))
            ids = np.array(data.draw(st.lists(st.integers(0, spec.num_rows - 1),
                                              min_size=sum(sizes), max_size=sum(sizes))), dtype=np.int64)
            offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            requests[name] = (ids, offsets)
            table = self.rows[name]
            want = np.stack([table[ids[a:b]].sum(axis=0) for a, b in zip(offsets[:-1], offsets[1:])])
            # the same kernel on the model's rows: the store must match it bit for bit
            exact = sdm.embedding_bag(self.kernel_rows[name], ids, offsets, fmt=spec.fmt, dim=spec.dim)
            np.testing.assert_allclose(exact, want, rtol=1e-5, atol=1e-4)
            expected[name] = exact
        return requests, expected

    def check(self, got, expected):
        assert sorted(got) == sorted(expected)
        for name, want in expected.items():
            np.testing.assert_array_equal(got[name], want)

    @precondition(lambda self: self.rows)
    @rule(data=st.data())
    def batch(self, data):
        requests, expected = self.draw_batch(data)
        self.check(self.store.embedding_bags(requests), expected)

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), between=st.booleans())
    def prefetched_batch(self, data, between):
        requests, expected = self.draw_batch(data)
        ticket = self.store.prefetch(requests)
        if between:  # another batch served between prefetch and use
            other, other_expected = self.draw_batch(data)
            self.check(self.store.embedding_bags(other), other_expected)
        self.check(self.store.embedding_bags(requests), expected)
        self.store.release(ticket)

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), seed=st.integers(0, 2**16))
    def update(self, data, seed):
        name = data.draw(st.sampled_from(sorted(self.rows)))
        spec = BY_NAME[name]
        ids = np.array(sorted(set(data.draw(st.lists(st.integers(0, spec.num_rows - 1), min_size=1, max_size=30)))))
        rows = np.random.default_rng(seed).standard_normal((len(ids), spec.dim)).astype(np.float32)
        before = self.store.stats()["version"]
        assert self.store.update_rows(name, ids, rows) == before + 1
        self.rows[name][ids] = decoded(spec, rows)
        self.kernel_rows[name][ids] = kernel_table(spec, rows)

    @precondition(lambda self: self.rows)
    @rule(data=st.data())
    def lookup(self, data):
        name = data.draw(st.sampled_from(sorted(self.rows)))
        ids = data.draw(st.lists(st.integers(0, BY_NAME[name].num_rows - 1), max_size=20))
        np.testing.assert_array_equal(self.store.lookup(name, np.array(ids, dtype=np.int64)),
                                      self.rows[name][ids])

    @rule()
    def reopen(self):
        self.store.close()
        self.store = sdm.Store.open(self.path, config=CONFIGS[self.preset])

    @invariant()
    def tables_unchanged(self):
        if hasattr(self, "store"):
            assert list(self.store.tables) == NAMES

    @invariant()
    def no_pins_leak(self):
        cache = getattr(getattr(self, "store", None), "_hierarchy", None)
        cache = cache and cache._cache and cache._cache.inner
        if cache is not None:
            cache.check_invariants()
            assert not cache.directory.pin_counts().any()

    def teardown(self):
        if hasattr(self, "store"):
            self.store.close()
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.mark.parametrize("preset", sorted(CONFIGS))
def test_store_state_machine(preset):
    machine = type(f"StoreMachine_{preset}", (StoreMachine,), {"preset": preset})
    examples = 12 if preset in HIERARCHY_PRESETS else 6
    settings(max_examples=examples, stateful_step_count=12, deadline=None)(machine).TestCase().runTest()


@pytest.mark.parametrize("preset", sorted(HIERARCHY_PRESETS) + ["tight-lru", "tight-s3fifo"])
def test_concurrent_readers_get_correct_results(tmp_path, preset):
    spec = sdm.TableSpec("t", 5000, 32, "fp32")
    rows = np.random.default_rng(0).standard_normal((spec.num_rows, spec.dim)).astype(np.float32)
    with sdm.Store.create(tmp_path / "s", [spec], config=CONFIGS[preset]) as store:
        store.write_table("t", rows)
        failures = []

        def reader(seed):
            rng = np.random.default_rng(seed)
            for _ in range(40):
                ids = rng.integers(0, spec.num_rows, 200)
                offsets = np.arange(0, 201, 10)
                got = store.embedding_bags({"t": (ids, offsets)})["t"]
                want = rows[ids].reshape(20, 10, spec.dim).sum(axis=1)
                if not np.allclose(got, want, rtol=1e-5, atol=1e-4):
                    failures.append(seed)

        threads = [threading.Thread(target=reader, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not failures

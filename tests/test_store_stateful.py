"""A hypothesis state machine drives a store against a dict model through random batches,
table writes and reopens, under every hierarchy preset; plus concurrent readers."""

from __future__ import annotations

import shutil
import tempfile
import threading

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import sdm
from sdm.config import HIERARCHY_PRESETS

SPECS = [sdm.TableSpec("f32", 300, 8, "fp32"), sdm.TableSpec("f16", 200, 4, "fp16"),
         sdm.TableSpec("i8", 500, 16, "int8")]
NAMES = [s.name for s in SPECS]
BY_NAME = {s.name: s for s in SPECS}


def decoded(spec, rows):
    return sdm.dequantize_rows(sdm.quantize_rows(rows, spec.fmt), spec.fmt, spec.dim)


class StoreMachine(RuleBasedStateMachine):
    """The model: ``self.rows[name]`` is what every lookup of ``name`` must return."""

    preset = "dram"

    @initialize()
    def create(self):
        self.dir = tempfile.mkdtemp(prefix="sdm-sm-")
        self.path = f"{self.dir}/s"
        self.store = sdm.Store.create(self.path, SPECS, config=self.preset)
        self.rows: dict[str, np.ndarray] = {}

    @rule(name=st.sampled_from(NAMES), seed=st.integers(0, 2**16), chunked=st.booleans())
    def write(self, name, seed, chunked):
        spec = BY_NAME[name]
        rows = np.random.default_rng(seed).standard_normal((spec.num_rows, spec.dim)).astype(np.float32)
        data = (rows[i:i + 64] for i in range(0, spec.num_rows, 64)) if chunked else rows
        self.store.write_table(name, data)
        self.rows[name] = decoded(spec, rows)

    @precondition(lambda self: self.rows)
    @rule(data=st.data())
    def batch(self, data):
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
            expected[name] = np.stack([table[ids[a:b]].sum(axis=0) for a, b in zip(offsets[:-1], offsets[1:])])
        got = self.store.embedding_bags(requests)
        for name in names:
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-4)

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
        self.store = sdm.Store.open(self.path, config=self.preset)

    @invariant()
    def tables_unchanged(self):
        if hasattr(self, "store"):
            assert list(self.store.tables) == NAMES

    def teardown(self):
        if hasattr(self, "store"):
            self.store.close()
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.mark.parametrize("preset", sorted(HIERARCHY_PRESETS))
def test_store_state_machine(preset):
    machine = type(f"StoreMachine_{preset}", (StoreMachine,), {"preset": preset})
    settings(max_examples=12, stateful_step_count=12, deadline=None)(machine).TestCase().runTest()


@pytest.mark.parametrize("preset", sorted(HIERARCHY_PRESETS))
def test_concurrent_readers_get_correct_results(tmp_path, preset):
    spec = sdm.TableSpec("t", 5000, 32, "fp32")
    rows = np.random.default_rng(0).standard_normal((spec.num_rows, spec.dim)).astype(np.float32)
    with sdm.Store.create(tmp_path / "s", [spec], config=preset) as store:
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

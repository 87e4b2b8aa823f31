"""sdm.model: parity with the reference DLRM's golden output, through the model's own
tables and through a store under every hierarchy preset; a naive numpy reference for dot,
dot with self-interaction and cat; width checks; presets; preprocessing; npz round trip;
profiling and the lookup/bottom-MLP overlap."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sdm
from sdm.store.config import HIERARCHY_PRESETS
from sdm.errors import (
    ConfigError, IdOutOfRangeError, InvalidArgumentError, InvalidOffsetsError, StoreExistsError,
)
from sdm.model import DLRM, PRESETS, ModelPreset, Profiler, load_npz, preprocess_dense, save_npz
from sdm.model.profile import STAGES

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "fixtures", "dlrm_reference",
                       "small_dot.npz")
if not os.path.exists(FIXTURE):
    FIXTURE = "/work/shared/fixtures/dlrm_reference/small_dot.npz"


@pytest.fixture(scope="module")
def ref():
    """The golden file's arrays, with offsets in the project's CSR form (B + 1 entries)."""
    with np.load(FIXTURE, allow_pickle=False) as d:
        arrays = {k: d[k] for k in d.files}
    n_tables = len(json.loads(str(arrays["config_json"]))["ln_emb"])
    arrays["sparse"] = [(arrays[f"indices_{k}"], np.append(arrays[f"offsets_{k}"], len(arrays[f"indices_{k}"])))
                        for k in range(n_tables)]
    arrays["pooled"] = np.stack([arrays[f"pooled_{k}"] for k in range(n_tables)])
    return arrays


@pytest.fixture(scope="module")
def model():
    return load_npz(FIXTURE)


# -- naive reference ------------------------------------------------------------------------

def naive_bag(table, ids, offsets):
    out = np.zeros((len(offsets) - 1, table.shape[1]), dtype=np.float64)
    for b in range(len(offsets) - 1):
        for k in range(offsets[b], offsets[b + 1]):
            out[b] += table[ids[k]]
    return out


def naive_forward(m: DLRM, dense_x, sparse, tables=None):
    """Loop-and-float64 DLRM, written from the reference's description."""
    tables = m.sparse.tables if tables is None else tables
    h = np.asarray(dense_x, dtype=np.float64)
    for w, b in zip(m.bottom.weights, m.bottom.biases):
        h = np.maximum(h @ w.T.astype(np.float64) + b, 0.0)
    pooled = [naive_bag(t, i, o) for t, (i, o) in zip(tables, sparse)]
    if m.interaction == "cat":
        r = np.concatenate([h] + pooled, axis=1)
    else:
        feats = [h] + pooled
        cols = [h]
        for i in range(len(feats)):
            for j in range(i + (1 if m.self_interaction else 0)):
                cols.append((feats[i] * feats[j]).sum(axis=1, keepdims=True))
        r = np.concatenate(cols, axis=1)
    n = len(m.top.weights)
    for i, (w, b) in enumerate(zip(m.top.weights, m.top.biases)):
        r = r @ w.T.astype(np.float64) + b
        r = np.maximum(r, 0.0) if i < n - 1 else 1.0 / (1.0 + np.exp(-r))
    return r[:, 0]


def random_batch(rng, m: DLRM, batch: int, max_pool: int = 6, empty_share: float = 0.2):
    dense = rng.standard_normal((batch, m.num_dense)).astype(np.float32)
    sparse = []
    for rows in m.sparse.table_sizes:
        lengths = rng.integers(1, max_pool + 1, batch)
        lengths[rng.random(batch) < empty_share] = 0
        ids = rng.integers(0, rows, int(lengths.sum()))
        sparse.append((ids, np.concatenate([[0], np.cumsum(lengths)])))
    return dense, sparse


def small_arch(interaction="dot", self_interaction=False, tables=(30, 7, 1, 50), dim=8, bottom_out=None):
    bottom = (5, 12, dim if bottom_out is None else bottom_out)
    return ModelPreset("t", dim, bottom, (10, 1), tables, 3, interaction, self_interaction)


# -- golden parity --------------------------------------------------------------------------

@pytest.mark.parametrize("overlap", [True, False])
def test_golden_output_with_own_tables(model, ref, overlap):
    prof = Profiler()
    y = model.forward(ref["dense_x"], ref["sparse"], profile=prof, overlap=overlap)
    assert y.shape == (64,) and y.dtype == np.float32
    np.testing.assert_allclose(y, ref["output"][:, 0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(model.pooled(ref["sparse"], batch=64), ref["pooled"], rtol=0, atol=1e-5)
    assert len(prof.records) == 1 and prof.records[0].overlapped == overlap


def test_golden_file_has_empty_and_repeated_bags(ref):
    for ids, offs in ref["sparse"]:
        assert (np.diff(offs) == 0).any()
    assert any(len(np.unique(ids[a:b])) < b - a for ids, offs in ref["sparse"]
               for a, b in zip(offs[:-1], offs[1:]))


@pytest.mark.parametrize("preset", sorted(HIERARCHY_PRESETS))
def test_golden_output_through_store(model, ref, tmp_path, preset):
    with model.to_store(tmp_path / "store", fmt="fp32", config=preset) as store:
        assert store.config.name == preset
        for overlap in (True, False):
            y = model.forward(ref["dense_x"], ref["sparse"], embeddings=store, overlap=overlap)
            np.testing.assert_allclose(y, ref["output"][:, 0], rtol=0, atol=1e-5)
        np.testing.assert_allclose(model.pooled(ref["sparse"], batch=64, embeddings=store), ref["pooled"],
                                   rtol=0, atol=1e-5)
        assert store.stats()["lookups"] > 0
    # reopened under the preset: the durable copy serves the same answer
    with sdm.Store.open(tmp_path / "store", config=preset) as store:
        y = model.forward(ref["dense_x"], ref["sparse"], embeddings=store)
        np.testing.assert_allclose(y, ref["output"][:, 0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("fmt,pooled_tol,out_tol", [("fp16", 2e-3, 1e-4), ("int8", 1e-2, 1e-3)])
def test_quantized_store(model, ref, tmp_path, fmt, pooled_tol, out_tol):
    with model.to_store(tmp_path / "s", fmt=fmt) as store:
        pooled = model.pooled(ref["sparse"], batch=64, embeddings=store)
        y = model.forward(ref["dense_x"], ref["sparse"], embeddings=store)
    # exact against rows that went through the same quantization ...
    deq = [sdm.dequantize_rows(sdm.quantize_rows(t, fmt), fmt, t.shape[1]) for t in model.sparse.tables]
    want = np.stack([naive_bag(t, i, o) for t, (i, o) in zip(deq, ref["sparse"])])
    np.testing.assert_allclose(pooled, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(y, naive_forward(model, ref["dense_x"], ref["sparse"], deq), rtol=0, atol=1e-5)
    # ... and close to the fp32 golden output
    np.testing.assert_allclose(pooled, ref["pooled"], rtol=0, atol=pooled_tol)
    np.testing.assert_allclose(y, ref["output"][:, 0], rtol=0, atol=out_tol)


def test_sparse_as_mapping_by_table_name(model, ref):
    by_name = dict(zip(model.sparse.names, ref["sparse"]))
    np.testing.assert_array_equal(model.forward(ref["dense_x"], by_name), model.forward(ref["dense_x"], ref["sparse"]))


# -- naive reference, all interactions --------------------------------------------------------

@pytest.mark.parametrize("interaction,itself", [("dot", False), ("dot", True), ("cat", False)])
@pytest.mark.parametrize("overlap", [True, False])
def test_matches_naive_reference(interaction, itself, overlap):
    m = DLRM.random(small_arch(interaction, itself), seed=3, overlap=overlap)
    rng = np.random.default_rng(0)
    dense, sparse = random_batch(rng, m, 37)
    np.testing.assert_allclose(m.forward(dense, sparse), naive_forward(m, dense, sparse), rtol=0, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 9), st.integers(0, 12), st.booleans(), st.integers(0, 2**32 - 1))
def test_interaction_kernel_matches_numpy(tables, dim, batch, itself, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, dim)).astype(np.float32)
    pooled = rng.standard_normal((tables, batch, dim)).astype(np.float32)
    got = sdm.model.interact(x, pooled, "dot", itself)
    feats = np.concatenate([x[:, None, :], pooled.transpose(1, 0, 2)], axis=1).astype(np.float64)
    z = feats @ feats.transpose(0, 2, 1)
    li, lj = np.tril_indices(tables + 1, 0 if itself else -1)
    want = np.concatenate([x, z[:, li, lj]], axis=1)
    assert got.shape == (batch, dim + sdm.model.pair_count(tables + 1, itself))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    cat = sdm.model.interact(x, pooled, "cat")
    np.testing.assert_array_equal(cat, np.concatenate([x] + list(pooled), axis=1))


def test_all_bags_empty_and_batch_of_zero():
    m = DLRM.random(small_arch(), seed=1)
    dense = np.ones((4, 5), np.float32)
    empty = [(np.empty(0, np.int64), np.zeros(5, np.int64))] * m.num_tables
    np.testing.assert_allclose(m.forward(dense, empty), naive_forward(m, dense, empty), atol=1e-6)
    y = m.forward(np.empty((0, 5), np.float32), [(np.empty(0, np.int64), np.zeros(1, np.int64))] * m.num_tables)
    assert y.shape == (0,) and y.dtype == np.float32


# -- construction and widths ------------------------------------------------------------------

def test_bottom_width_must_equal_dim_for_dot():
    with pytest.raises(ConfigError, match=r"bottom MLP output width 6 != embedding dim 8"):
        DLRM.random(small_arch(bottom_out=6), seed=0)
    DLRM.random(small_arch("cat", bottom_out=6), seed=0)  # cat takes any width


def test_top_input_width_is_named(model):
    tw = [np.zeros((64, 25), np.float32), model.top.weights[1]]
    with pytest.raises(ConfigError, match=r"top MLP input width 25 != 26"):
        DLRM.from_arrays(model.bottom.weights, model.bottom.biases, tw, model.top.biases, model.sparse.tables)
    with pytest.raises(ConfigError, match=r"!= 31.*self-interaction"):
        DLRM.from_arrays(model.bottom.weights, model.bottom.biases, model.top.weights, model.top.biases,
                         model.sparse.tables, self_interaction=True)


def test_layer_chain_and_shapes_are_checked(model):
    bw = [model.bottom.weights[0], np.zeros((16, 32), np.float32)]
    with pytest.raises(ConfigError, match=r"layer 1 takes 32 inputs but layer 0 gives 64"):
        DLRM.from_arrays(bw, model.bottom.biases, model.top.weights, model.top.biases, model.sparse.tables)
    with pytest.raises(ConfigError, match=r"bias must have shape \(64,\)"):
        DLRM.from_arrays(model.bottom.weights, [np.zeros(3), model.bottom.biases[1]], model.top.weights,
                         model.top.biases, model.sparse.tables)
    tables = list(model.sparse.tables)
    tables[2] = np.zeros((5, 8), np.float32)
    with pytest.raises(ConfigError, match=r"same dim, got dims \[8, 16\]"):
        DLRM.from_arrays(model.bottom.weights, model.bottom.biases, model.top.weights, model.top.biases, tables)
    with pytest.raises(ConfigError, match=r"end in 1 unit"):
        DLRM.from_arrays(model.bottom.weights, model.bottom.biases, [model.top.weights[0]],
                         [model.top.biases[0]], model.sparse.tables)
    with pytest.raises(ConfigError, match=r"interaction 'sum'"):
        DLRM.from_arrays(model.bottom.weights, model.bottom.biases, model.top.weights, model.top.biases,
                         model.sparse.tables, interaction="sum")


# -- bad input to forward ----------------------------------------------------------------------

def test_forward_rejects_bad_input(model, ref):
    x, sp = ref["dense_x"], ref["sparse"]
    with pytest.raises(InvalidArgumentError, match=r"shape \(B, 13\).*\(64, 12\)"):
        model.forward(x[:, :12], sp)
    with pytest.raises(InvalidArgumentError, match=r"3 \(indices, offsets\) pairs but the model has 4"):
        model.forward(x, sp[:3])
    with pytest.raises(InvalidOffsetsError, match=r"table 'emb_0'.*32 samples.*33 entries"):
        model.forward(x[:32], sp)
    with pytest.raises(InvalidArgumentError, match=r"sequence of \(indices, offsets\)"):
        model.forward(x, "emb_0")
    bad = list(sp)
    bad[3] = (np.append(sp[3][0][:-1], 50), sp[3][1])
    with pytest.raises(IdOutOfRangeError, match=r"table 'emb_3'.*50.*50 rows"):
        model.forward(x, bad)
    bad[3] = (sp[3][0], sp[3][1][::-1].copy())
    with pytest.raises(InvalidOffsetsError):
        model.forward(x, bad)
    with pytest.raises(InvalidArgumentError, match="numeric"):
        model.forward(x.astype(str), sp)
    with pytest.raises(InvalidArgumentError, match=r"missing \['emb_3'\]"):
        model.forward(x, dict(zip(model.sparse.names[:3], sp[:3])))


def test_store_must_match_model(model, ref, tmp_path):
    other = DLRM.random(small_arch(), seed=0)
    with other.to_store(tmp_path / "other") as store:
        with pytest.raises(ConfigError, match=r"store table 'emb_0' is 30 x 8 but the model's is 1000 x 16"):
            model.forward(ref["dense_x"], ref["sparse"], embeddings=store)
    with pytest.raises(InvalidArgumentError, match="sdm.Store or None"):
        model.forward(ref["dense_x"], ref["sparse"], embeddings={"emb_0": 1})
    with pytest.raises(StoreExistsError):
        model.to_store(tmp_path / "other")


# -- presets, init, lazy tables, store building -----------------------------------------------

def test_presets_have_consistent_widths():
    assert set(PRESETS) == {"criteo-kaggle", "criteo-terabyte", "mlperf-dlrm", "dlrm-bench", "rm1", "rm2", "rm3"}
    assert [PRESETS[n].top_input for n in ("criteo-kaggle", "criteo-terabyte", "mlperf-dlrm")] == [367, 415, 479]
    assert len(PRESETS["criteo-kaggle"].table_sizes) == 26 and PRESETS["criteo-kaggle"].num_dense == 13
    for name in ("rm1", "rm2", "rm3"):
        assert PRESETS[name].interaction == "cat"
    for name, p in PRESETS.items():
        assert p.source
        m = DLRM.random(name, seed=0, materialize=False)  # huge presets allocate only the MLPs
        assert m.top.widths == p.top_widths and m.bottom.widths == p.bottom
        assert not m.sparse.materialized
        assert m.top.widths[-1] == 1


def test_unmaterialized_model_refuses_own_tables():
    m = DLRM.random("criteo-kaggle", seed=0)
    assert not m.sparse.materialized  # 2 GB of tables: not allocated by default
    rng = np.random.default_rng(0)
    dense = rng.random((2, 13), dtype=np.float32)
    sparse = [(np.zeros(1, np.int64), np.array([0, 1, 1]))] * 26
    with pytest.raises(InvalidArgumentError, match="not materialized"):
        m.forward(dense, sparse)


def test_seeded_init_statistics_and_determinism():
    p = ModelPreset("t", 16, (13, 400, 16), (300, 1), (20000, 4), 1)
    a = DLRM.random(p, seed=5)
    b = DLRM.random(p, seed=5)
    c = DLRM.random(p, seed=6)
    np.testing.assert_array_equal(a.bottom.weights[0], b.bottom.weights[0])
    assert not np.array_equal(a.bottom.weights[0], c.bottom.weights[0])
    w = a.bottom.weights[0]
    assert abs(w.std() - np.sqrt(2 / (13 + 400))) < 0.05 * np.sqrt(2 / (13 + 400))
    assert abs(a.bottom.biases[0].std() - np.sqrt(1 / 400)) < 0.15 * np.sqrt(1 / 400)
    t = a.sparse.tables[0]
    bound = np.sqrt(1 / 20000)
    assert t.dtype == np.float32 and np.abs(t).max() <= bound and t.min() < -0.9 * bound
    # lazy rows equal materialized rows, whatever the chunking
    lazy = DLRM.random(p, seed=5, materialize=False)
    np.testing.assert_array_equal(np.concatenate(list(lazy.sparse.chunks(0))), t)


def test_to_store_from_lazy_tables_streams_chunks(tmp_path):
    p = ModelPreset("t", 8, (4, 8), (3, 1), (70000, 10), 1)
    lazy = DLRM.random(p, seed=2, materialize=False)
    full = DLRM.random(p, seed=2, materialize=True)
    rng = np.random.default_rng(1)
    dense, sparse = random_batch(rng, full, 16)
    with lazy.to_store(tmp_path / "s", config="ssd") as store:
        assert not lazy.sparse.materialized
        np.testing.assert_array_equal(store.lookup("emb_0", [0, 65536, 69999]), full.sparse.tables[0][[0, 65536, 69999]])
        np.testing.assert_allclose(lazy.forward(dense, sparse, embeddings=store), full.forward(dense, sparse), atol=1e-6)


def test_npz_round_trip(tmp_path):
    m = DLRM.random(small_arch("dot", True), seed=4)
    save_npz(tmp_path / "m.npz", m, dense_x=np.zeros((2, 5), np.float32))
    back = load_npz(tmp_path / "m.npz")
    assert back.self_interaction and back.interaction == "dot"
    rng = np.random.default_rng(0)
    dense, sparse = random_batch(rng, m, 9)
    np.testing.assert_array_equal(back.forward(dense, sparse), m.forward(dense, sparse))
    with pytest.raises(InvalidArgumentError, match="may not reuse weight keys"):
        save_npz(tmp_path / "x.npz", m, emb_0=np.zeros(1))


def test_load_npz_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_npz(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip file at all")
    with pytest.raises(InvalidArgumentError, match="junk.npz"):
        load_npz(tmp_path / "junk.npz")
    np.savez(tmp_path / "partial.npz", config_json=np.array("{}"), emb_0=np.zeros((3, 4), np.float32))
    with pytest.raises((InvalidArgumentError, ConfigError), match="partial.npz"):
        load_npz(tmp_path / "partial.npz")
    np.savez(tmp_path / "obj.npz", config_json=np.array([{"a": 1}], dtype=object))
    with pytest.raises(InvalidArgumentError, match="pickle"):
        load_npz(tmp_path / "obj.npz")


# -- preprocessing ----------------------------------------------------------------------------

def test_preprocess_dense():
    raw = np.array([[0, 1, -3, 1000, 2**40]], dtype=np.int64)
    got = preprocess_dense(raw)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.log(np.array([[1, 2, 1, 1001, 2**40 + 1]], dtype=np.float64)), rtol=1e-6)
    np.testing.assert_array_equal(preprocess_dense(np.array([np.nan, -0.5, 0.0])), [0, 0, 0])
    with pytest.raises(InvalidArgumentError, match="inf"):
        preprocess_dense(np.array([1.0, np.inf]))
    with pytest.raises(InvalidArgumentError, match="numeric"):
        preprocess_dense(np.array(["a"]))


# -- profiling and overlap ---------------------------------------------------------------------

def test_profile_stages_and_overlap():
    m = DLRM.random(ModelPreset("t", 16, (64, 256, 256, 16), (64, 1), (5000,) * 4, 1), seed=0)
    rng = np.random.default_rng(0)
    dense, sparse = random_batch(rng, m, 512, max_pool=30)
    prof = Profiler()
    y_on = m.forward(dense, sparse, profile=prof, overlap=True)
    y_off = m.forward(dense, sparse, profile=prof, overlap=False)
    np.testing.assert_array_equal(y_on, y_off)
    on, off = prof.records
    assert on.overlapped and not off.overlapped
    for t in (on, off):
        for stage in ("bottom_s", "embeddings_s", "interaction_s", "top_s", "wall_s"):
            assert getattr(t, stage) > 0
        assert t.wall_s <= t.serial_s + t.wait_s + 0.05  # stages are nested in the wall time
    assert off.wall_s >= off.serial_s  # nothing overlapped: the stages add up
    assert off.overlap_s == 0.0
    total = prof.total
    assert total.batches == 2 and total.samples == 1024
    assert "interaction" in prof.summary()
    y, times = m.forward_profiled(dense, sparse)
    np.testing.assert_array_equal(y, y_on)
    d = times.as_dict()
    assert d["serial_s"] == sum(d[stage] for stage in STAGES)
    assert d["overlap_s"] == max(0.0, d["serial_s"] - d["wall_s"])


def test_overlap_runs_a_slow_lookup_beside_a_slow_bottom_mlp():
    """With overlap the lookups and the bottom MLP run at once: each stage first waits at a
    rendezvous the other must also reach (so a serial forward cannot pass it), then sleeps.
    The profile saw the time saved: more than nothing, and at most the shorter stage (two
    intervals inside the wall time overlap by no more than the shorter one). No timing
    threshold beyond that: the sleeps need no CPU, so a loaded machine only shrinks the gap."""
    m = DLRM.random(small_arch(), seed=0)
    m.table_parallel = False  # one lookup job, so a single rendezvous party
    nap = 0.5
    state = {"meet": threading.Barrier(2), "timeout": 30.0}

    class Slow:
        """``stage`` (an MLP or a bound method), called after the rendezvous and a nap."""

        def __init__(self, stage):
            self.stage = stage

        def __getattr__(self, name):
            return getattr(self.stage, name)

        def __call__(self, *args):
            state["meet"].wait(timeout=state["timeout"])
            time.sleep(nap)
            return self.stage(*args)

    m.bottom, m.sparse.pool_into = Slow(m.bottom), Slow(m.sparse.pool_into)
    dense, sparse = random_batch(np.random.default_rng(0), m, 64)
    y_on, on = m.forward_profiled(dense, sparse, overlap=True)
    assert on.overlapped and on.bottom_s >= nap and on.embeddings_s >= nap
    assert 0.0 < on.overlap_s <= min(on.bottom_s, on.embeddings_s)
    assert on.overlap_s == on.serial_s - on.wall_s  # not clamped: it really saved time
    # serially the lookups reach the rendezvous alone
    state["meet"], state["timeout"] = threading.Barrier(2), 0.2
    with pytest.raises(threading.BrokenBarrierError):
        m.forward(dense, sparse, overlap=False)
    state["meet"] = threading.Barrier(1)
    y_off, off = m.forward_profiled(dense, sparse, overlap=False)
    np.testing.assert_array_equal(y_off, y_on)
    assert off.overlap_s == 0.0 and off.wall_s >= off.serial_s >= 2 * nap
    m.close()


def test_lookup_worker_uses_callers_numba_threads():
    import numba
    m = DLRM.random(small_arch(), seed=0)
    seen = []
    orig = m.sparse.pool_into
    m.sparse.pool_into = lambda checked, out: (seen.append(numba.get_num_threads()), orig(checked, out))
    dense, sparse = random_batch(np.random.default_rng(0), m, 8)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        m.forward(dense, sparse, overlap=True)
    finally:
        numba.set_num_threads(before)
    assert seen == [1]
    m.lookup_threads = 1
    m.forward(dense, sparse, overlap=True)  # the caller has the default count, lookups one
    assert seen == [1, 1]
    m.close()
    with pytest.raises(ConfigError, match=r"lookup_threads must be an integer in \[1, \d+\], got 0"):
        DLRM(m.bottom, m.sparse, m.top, lookup_threads=0)


def test_lookup_error_in_worker_reaches_caller(model, ref, tmp_path):
    store = model.to_store(tmp_path / "s")
    store.close()
    for overlap in (True, False):
        with pytest.raises(sdm.errors.StoreError, match="closed"):
            model.forward(ref["dense_x"], ref["sparse"], embeddings=store, overlap=overlap)
    # the worker survives a failed call
    np.testing.assert_allclose(model.forward(ref["dense_x"], ref["sparse"]), ref["output"][:, 0], atol=1e-5)


def test_concurrent_forward_calls(model, ref):
    from concurrent.futures import ThreadPoolExecutor
    want = model.forward(ref["dense_x"], ref["sparse"])
    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda _: model.forward(ref["dense_x"], ref["sparse"]), range(16)))
    for y in outs:
        np.testing.assert_array_equal(y, want)


@pytest.mark.skipif(__import__("numba").config.NUMBA_NUM_THREADS < 2, reason="needs 2 Numba threads")
@pytest.mark.parametrize("overlap", [True, False])
def test_table_parallel_lookups(overlap):
    import threading

    import numba
    m = DLRM.random(small_arch(tables=(40, 3, 17, 60, 9)), seed=0)
    dense, sparse = random_batch(np.random.default_rng(2), m, 33)
    seen = []
    orig = m.sparse.pool_table
    m.sparse.pool_table = lambda k, pair, out: (seen.append((k, numba.get_num_threads(), threading.get_ident())),
                                                orig(k, pair, out))
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(2)
        y = m.forward(dense, sparse, overlap=overlap)
        assert numba.get_num_threads() == 2  # the caller's count is left as it was
    finally:
        numba.set_num_threads(before)
    assert sorted(k for k, _, _ in seen) == [0, 1, 2, 3, 4]  # each table pooled once
    assert {n for _, n, _ in seen} == {1}  # one Numba thread per table worker
    assert threading.get_ident() not in {t for _, _, t in seen}
    m.table_parallel = False
    np.testing.assert_array_equal(m.forward(dense, sparse, overlap=overlap), y)
    np.testing.assert_allclose(y, naive_forward(m, dense, sparse), atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([("dot", False), ("dot", True), ("cat", False)]),
       st.lists(st.integers(1, 40), min_size=1, max_size=5), st.integers(1, 6), st.integers(0, 20),
       st.integers(0, 2**32 - 1))
def test_random_models_match_naive(op, tables, dim, batch, seed):
    interaction, itself = op
    bottom_out = dim if interaction == "dot" else 1 + seed % 7
    arch = ModelPreset("h", dim, (3, 5, bottom_out), (4, 1), tuple(tables), 2, interaction, itself)
    m = DLRM.random(arch, seed=seed % 1000)
    dense, sparse = random_batch(np.random.default_rng(seed), m, batch, empty_share=0.4)
    for overlap in (True, False):
        np.testing.assert_allclose(m.forward(dense, sparse, overlap=overlap), naive_forward(m, dense, sparse),
                                   rtol=0, atol=1e-5)


@pytest.mark.parametrize("stmt", ["import sdm.model", "from sdm.model import load_npz, PRESETS",
                                  "from sdm import model; model.DLRM"])
def test_imports_without_cycles(stmt):
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", stmt], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr

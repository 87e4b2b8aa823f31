"""The store against a numpy reference: every format, both presets, reopen, write rules."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sdm
from helpers import rows_of

FORMATS = sdm.ROW_FORMATS
PRESETS = ("dram", "ssd")
SPECS = [
    sdm.TableSpec("t_fp32", 1000, 16, "fp32"),
    sdm.TableSpec("t_fp16", 700, 8, "fp16"),
    sdm.TableSpec("t_int8", 1500, 64, "int8"),
    sdm.TableSpec("t_wide", 40, 1100, "fp32"),  # one row wider than an LMDB block
]


def decoded(spec, rows):
    """What the store must return: rows after a round trip through the table's format."""
    return sdm.dequantize_rows(sdm.quantize_rows(rows, spec.fmt), spec.fmt, spec.dim)


def pooled_reference(table, indices, offsets, mode="sum", weights=None):
    out = np.zeros((len(offsets) - 1, table.shape[1]), dtype=np.float64)
    for b in range(len(offsets) - 1):
        for k in range(offsets[b], offsets[b + 1]):
            out[b] += (1.0 if weights is None else weights[k]) * table[indices[k]]
        if mode == "mean" and offsets[b + 1] > offsets[b]:
            out[b] /= offsets[b + 1] - offsets[b]
    return out


@pytest.fixture(scope="module")
def store_path(make_store):
    return make_store(SPECS)


@pytest.fixture(scope="module", params=PRESETS)
def store(request, store_path):
    with sdm.Store.open(store_path, config=request.param) as s:
        yield s


@st.composite
def bags(draw, num_rows):
    sizes = draw(st.lists(st.integers(0, 12), min_size=1, max_size=20))
    nnz = sum(sizes)
    ids = draw(st.lists(st.integers(0, num_rows - 1), min_size=nnz, max_size=nnz))
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    dtype = draw(st.sampled_from([np.int32, np.int64]))
    return np.array(ids, dtype=dtype), offsets


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@settings(max_examples=25)
@given(data=st.data())
def test_bags_equal_numpy_reference(store, spec, data):
    indices, offsets = data.draw(bags(spec.num_rows))
    mode = data.draw(st.sampled_from(["sum", "mean"]))
    weighted = data.draw(st.booleans())
    weights = np.linspace(-1, 2, len(indices)).astype(np.float32) if weighted else None
    table = decoded(spec, rows_of(spec))
    got = store.embedding_bag(spec.name, indices, offsets, mode=mode, per_sample_weights=weights)
    want = pooled_reference(table, indices, offsets, mode, weights)
    assert got.shape == (len(offsets) - 1, spec.dim) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@settings(max_examples=25)
@given(data=st.data())
def test_lookup_equals_reference(store, spec, data):
    ids = np.array(data.draw(st.lists(st.integers(0, spec.num_rows - 1), max_size=60)), dtype=np.int64)
    got = store.lookup(spec.name, ids)
    np.testing.assert_array_equal(got, decoded(spec, rows_of(spec))[ids])


def test_embedding_bags_matches_single_table_calls(store):
    rng = np.random.default_rng(1)
    requests = {}
    for spec in SPECS:
        indices = rng.integers(0, spec.num_rows, 50)
        requests[spec.name] = (indices, np.array([0, 10, 10, 50]))
    got = store.embedding_bags(requests)
    assert list(got) == list(requests)
    for name, (indices, offsets) in requests.items():
        np.testing.assert_array_equal(got[name], store.embedding_bag(name, indices, offsets))


def test_reopen_returns_the_same_bytes(store_path):
    ids = np.arange(0, 40, 3)
    first = {}
    with sdm.Store.open(store_path, config="ssd") as s:
        for spec in SPECS:
            first[spec.name] = s.lookup(spec.name, ids % spec.num_rows)
    for preset in PRESETS:
        with sdm.Store.open(store_path, config=preset) as s:
            assert s.tables == {spec.name: spec for spec in SPECS}
            for spec in SPECS:
                assert s.lookup(spec.name, ids % spec.num_rows).tobytes() == first[spec.name].tobytes()


def test_stats_count_lookups_and_tier_reads(store_path):
    with sdm.Store.open(store_path, config="ssd") as s:
        s.lookup("t_fp32", np.array([0, 1, 1, 999]))
        stats = s.stats()
    assert stats["lookups"] == 4
    (tier,) = stats["tiers"]
    assert tier["name"] == "lmdb"
    assert tier["reads"] >= 2 and tier["bytes_read"] == tier["reads"] * 4096  # rows 0-1 and 999 in two blocks


def test_write_from_chunks_memmap_and_rewrite(tmp_path):
    spec = sdm.TableSpec("t", 1234, 12, "int8")
    rows = rows_of(spec)
    mm = np.lib.format.open_memmap(tmp_path / "rows.npy", mode="w+", dtype=np.float32, shape=rows.shape)
    mm[:] = rows
    mm.flush()
    with sdm.Store.create(tmp_path / "s", [spec]) as store:
        store.write_table("t", (rows[i:i + 100] for i in range(0, len(rows), 100)))
        from_chunks = store.lookup("t", np.arange(spec.num_rows))
        store.write_table("t", np.load(tmp_path / "rows.npy", mmap_mode="r"))
        np.testing.assert_array_equal(store.lookup("t", np.arange(spec.num_rows)), from_chunks)
        store.write_table("t", rows * 2)  # a new generation replaces the old one
        np.testing.assert_allclose(store.lookup("t", np.arange(5)), 2 * from_chunks[:5], rtol=1e-2, atol=1e-2)
    with sdm.Store.open(tmp_path / "s", config="ssd") as store:
        np.testing.assert_allclose(store.lookup("t", np.arange(5)), 2 * from_chunks[:5], rtol=1e-2, atol=1e-2)
    # superseded generations are deleted: the database holds one generation of blocks
    import lmdb
    env = lmdb.open(str(tmp_path / "s" / "rows.lmdb"), readonly=True, lock=False)
    with env.begin() as txn:
        assert txn.stat()["entries"] == -(-spec.num_rows // (4076 // spec.row_bytes))
    env.close()


def test_constant_and_extreme_rows_round_trip(tmp_path):
    spec = sdm.TableSpec("c", 3, 5, "int8")
    rows = np.array([[7.5] * 5, [-3.0] * 5, [0.0, 1e6, -1e6, 2.0, 3.0]], dtype=np.float32)
    with sdm.Store.create(tmp_path / "s", [spec]) as store:
        store.write_table("c", rows)
        got = store.lookup("c", [0, 1])
    np.testing.assert_array_equal(got, rows[:2])

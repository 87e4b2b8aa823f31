"""The trace file: round trip, lazy reads, and typed errors on malformed files."""

import json
import zipfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sdm
from sdm.errors import InvalidArgumentError
from sdm.trace import Batch, TraceFormatError, TraceNotFoundError, TraceWriter, load, save


def _random_batch(rng, sizes, bsz, dense=False):
    ind, off = [], []
    for n in sizes:
        lengths = rng.integers(0, 4, size=bsz)
        o = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        ind.append(rng.integers(0, n, size=int(o[-1])))
        off.append(o)
    extra = {}
    if dense:
        extra = dict(dense=rng.random((bsz, 3), dtype=np.float32),
                     request_ids=np.arange(bsz, dtype=np.int64) // 2,
                     labels=(rng.random(bsz) < 0.5).astype(np.float32))
    return Batch(ind, off, **extra)


def _same(a: Batch, b: Batch):
    assert a.num_tables == b.num_tables
    for t in range(a.num_tables):
        np.testing.assert_array_equal(a.indices[t], b.indices[t])
        np.testing.assert_array_equal(a.offsets[t], b.offsets[t])
    for name in ("dense", "request_ids", "labels"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None)
        if x is not None:
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("compress", [False, True])
def test_round_trip(tmp_path, compress):
    rng = np.random.default_rng(1)
    sizes = [5, 100, 3_000_000_000]  # the last forces int64 ids on disk
    batches = [_random_batch(rng, sizes, bsz, dense=bool(i % 2)) for i, bsz in enumerate([4, 1, 7])]
    path = save(tmp_path / "t.npz", iter(batches), sizes, compress=compress, generator="test",
                params={"a": 1})
    with sdm.trace.load(path) as tr:
        assert len(tr) == 3
        np.testing.assert_array_equal(tr.table_sizes, sizes)
        assert tr.metadata == {"generator": "test", "params": {"a": 1}}
        for a, b in zip(batches, tr):
            _same(a, b)
        _same(batches[-1], tr[-1])
        assert all(o.dtype == np.int64 for o in tr[0].offsets)
        assert tr.num_lookups == sum(b.lookups for b in batches)


def test_pairs_dicts_and_int32_storage(tmp_path):
    ind = [np.array([0, 1], dtype=np.int64)]
    off = [np.array([0, 1, 2])]
    save(tmp_path / "t.npz", [(ind, off), {"indices": ind, "offsets": off}], [2])
    tr = load(tmp_path / "t.npz")
    assert len(tr) == 2 and tr[1].indices[0].dtype == np.int64
    with np.load(tmp_path / "t.npz") as z:  # narrow on disk
        assert z["b00000000_indices"].dtype == np.int32 and z["b00000000_offsets"].dtype == np.int32
    ids, offs = tr.fbgemm(0)
    np.testing.assert_array_equal(ids, [0, 1])
    np.testing.assert_array_equal(offs, [0, 1, 2])
    keys = list(tr.keys())
    np.testing.assert_array_equal(keys[0], [0, 1])


def test_fbgemm_layout_round_trip():
    rng = np.random.default_rng(2)
    b = _random_batch(rng, [10, 20, 30], 5)
    ids, offs = b.to_fbgemm()
    assert offs.shape == (3 * 5 + 1,)
    _same(b, Batch.from_fbgemm(ids, offs, 3))


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), min_size=1, max_size=5),
       st.integers(0, 2**31))
def test_round_trip_property(tmp_path_factory, shape, seed):
    rng = np.random.default_rng(seed)
    sizes = [7, 1]
    batches = [_random_batch(rng, sizes, bsz) for _, bsz in shape]
    path = tmp_path_factory.mktemp("p") / "t.npz"
    save(path, batches, sizes)
    with load(path) as tr:
        for a, b in zip(batches, tr, strict=True):
            _same(a, b)


def test_writer_infers_table_sizes(tmp_path):
    with TraceWriter(tmp_path / "t.npz") as w:
        w.add(([np.array([3, 9])], [np.array([0, 2])]))
    assert load(tmp_path / "t.npz").table_sizes.tolist() == [10]


def test_writer_removes_partial_file(tmp_path):
    with pytest.raises(RuntimeError):
        with TraceWriter(tmp_path / "t.npz", [4]) as w:
            w.add(([np.array([1])], [np.array([0, 1])]))
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("batch, field", [
    (([np.array([1, 2])], [np.array([0, 1])]), "batch 0.offsets[0]"),          # nnz mismatch
    (([np.array([1, 2])], [np.array([1, 2])]), "batch 0.offsets[0]"),          # offsets[0] != 0
    (([np.array([1, 2])], [np.array([0, 2, 1, 2])]), "batch 0.offsets[0]"),    # decreasing
    (([np.array([1, 9])], [np.array([0, 2])]), "batch 0.indices[0]"),          # id >= size
    (([np.array([-1])], [np.array([0, 1])]), "batch 0.indices[0]"),            # negative id
    (([np.array([1.0])], [np.array([0, 1])]), "batch 0.indices[0]"),           # float ids
])
def test_save_rejects_bad_batches(tmp_path, batch, field):
    with pytest.raises(TraceFormatError) as info:
        save(tmp_path / "t.npz", [batch], [5])
    assert info.value.field == field and field in str(info.value)
    assert not (tmp_path / "t.npz").exists()


def test_save_rejects_mismatched_batch_sizes_and_tables(tmp_path):
    two = ([np.array([1]), np.array([1, 2])], [np.array([0, 1]), np.array([0, 1, 2])])
    with pytest.raises(TraceFormatError, match=r"offsets\[1\].*B = 2"):
        save(tmp_path / "t.npz", [two], [5, 5])
    with pytest.raises(TraceFormatError, match="3 tables"):
        save(tmp_path / "t.npz", [two], [5, 5, 5])
    with pytest.raises(TraceFormatError, match=r"table_sizes\[0\] = 0"):
        save(tmp_path / "t.npz", [], [0])
    with pytest.raises(InvalidArgumentError, match="JSON"):
        save(tmp_path / "t.npz", [], [1], thing=object())


def _good(tmp_path):
    path = tmp_path / "good.npz"
    rng = np.random.default_rng(0)
    save(path, [_random_batch(rng, [50, 60], 8) for _ in range(3)], [50, 60])
    return path


def _rewrite(src, dst, change):
    """Copy a trace archive, replacing or dropping members (change: name -> array or None)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            name = info.filename[:-4]
            if name in change:
                if change[name] is None:
                    continue
                with zout.open(info.filename, "w") as fh:
                    np.lib.format.write_array(fh, np.asarray(change[name]))
            else:
                zout.writestr(info, zin.read(info))


def test_missing_file(tmp_path):
    with pytest.raises(TraceNotFoundError, match="no trace"):
        load(tmp_path / "nope.npz")


def test_truncated_file(tmp_path):
    path = _good(tmp_path)
    data = path.read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError) as info:
        load(cut)
    assert info.value.field == "file" and "cut.npz" in str(info.value)


def test_not_a_zip(tmp_path):
    p = tmp_path / "x.npz"
    p.write_text("hello")
    with pytest.raises(TraceFormatError, match="not a readable trace"):
        load(p)


def test_unknown_schema_version(tmp_path):
    path = _good(tmp_path)
    _rewrite(path, tmp_path / "v.npz", {"schema_version": np.array(99)})
    with pytest.raises(TraceFormatError, match="schema_version 99 is not supported") as info:
        load(tmp_path / "v.npz")
    assert info.value.field == "schema_version"


@pytest.mark.parametrize("member", ["table_sizes", "metadata", "schema_version", "batch_sizes",
                                    "batch_lookups"])
def test_missing_header_member(tmp_path, member):
    _rewrite(_good(tmp_path), tmp_path / "m.npz", {member: None})
    with pytest.raises(TraceFormatError, match=member) as info:
        load(tmp_path / "m.npz")
    assert info.value.field == member


def test_missing_batch_member(tmp_path):
    _rewrite(_good(tmp_path), tmp_path / "m.npz", {"b00000002_offsets": None})
    with pytest.raises(TraceFormatError, match="batch 2 has no offsets"):
        load(tmp_path / "m.npz")


def test_bad_members_found_when_read(tmp_path):
    path = _good(tmp_path)
    tr = load(path)
    ids, offs = tr.fbgemm(1)
    bad_offs = offs.copy()
    bad_offs[-1] += 1  # offsets that do not match indices
    _rewrite(path, tmp_path / "o.npz", {"b00000001_offsets": bad_offs})
    tr2 = load(tmp_path / "o.npz")
    tr2[0]
    with pytest.raises(TraceFormatError, match="b00000001_offsets") as info:  # offsets vs indices
        tr2[1]
    assert info.value.field == "b00000001_offsets"
    _rewrite(path, tmp_path / "s.npz", {"b00000001_offsets": offs[:-3]})
    with pytest.raises(TraceFormatError, match="T \\* B \\+ 1"):
        load(tmp_path / "s.npz")[1]
    _rewrite(path, tmp_path / "n.npz", {"b00000001_indices": ids[:-1]})
    with pytest.raises(TraceFormatError, match="header says batch 1"):
        load(tmp_path / "n.npz")[1]
    big = ids.copy()
    big[0] = 10_000
    _rewrite(path, tmp_path / "i.npz", {"b00000001_indices": big})
    with pytest.raises(TraceFormatError, match="outside"):
        load(tmp_path / "i.npz")[1]
    _rewrite(path, tmp_path / "j.npz", {"metadata": np.array("{nope")})
    with pytest.raises(TraceFormatError, match="metadata is not valid JSON"):
        load(tmp_path / "j.npz")
    _rewrite(path, tmp_path / "k.npz", {"table_sizes": np.array([50, -1])})
    with pytest.raises(TraceFormatError, match=r"table_sizes\[1\] = -1"):
        load(tmp_path / "k.npz")


def test_object_arrays_are_never_unpickled(tmp_path):
    path = _good(tmp_path)
    evil = np.array([{"a": 1}], dtype=object)
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(tmp_path / "e.npz", "w") as zout:
        for info in zin.infolist():
            if info.filename == "metadata.npy":
                with zout.open(info.filename, "w") as fh:
                    np.lib.format.write_array(fh, evil, allow_pickle=True)
            else:
                zout.writestr(info, zin.read(info))
    with pytest.raises(TraceFormatError, match="metadata"):
        load(tmp_path / "e.npz")


def test_index_errors(tmp_path):
    tr = load(_good(tmp_path))
    with pytest.raises(IndexError):
        tr[3]
    assert json.loads(json.dumps(tr.metadata)) == {}

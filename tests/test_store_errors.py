"""Every bad input to the store gets its typed error, naming the value and the limit, and
changes nothing on disk."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

import sdm
from sdm import errors

SPEC = sdm.TableSpec("emb", 100, 8, "fp32")


def tree_digest(path) -> str:
    """A digest of every file's name and bytes under ``path`` except LMDB's lock file."""
    h = hashlib.sha256()
    for root, _, files in sorted(os.walk(path)):
        for name in sorted(files):
            if name == "lock.mdb":
                continue
            full = os.path.join(root, name)
            h.update(full.encode())
            with open(full, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


@pytest.fixture
def store(tmp_path):
    s = sdm.Store.create(tmp_path / "s", [SPEC, sdm.TableSpec("unwritten", 10, 8)])
    s.write_table("emb", np.arange(800, dtype=np.float32).reshape(100, 8))
    yield s
    s.close()


@pytest.mark.parametrize("ids, err, words", [
    ([100], errors.IdOutOfRangeError, ["100", "[0, 100)"]),
    ([-1], errors.IdOutOfRangeError, ["-1", "negative"]),
    ([0.5], errors.InvalidArgumentError, ["integer", "float64"]),
    ([[1, 2]], errors.InvalidArgumentError, ["1-D", "(1, 2)"]),
    ([True], errors.InvalidArgumentError, ["integer", "bool"]),
    (np.array([2**63], dtype=np.uint64), errors.IdOutOfRangeError, [str(2**63)]),
])
def test_bad_ids(store, ids, err, words):
    with pytest.raises(err) as info:
        store.lookup("emb", ids)
    for word in words:
        assert word in str(info.value)
    with pytest.raises(err):
        store.embedding_bag("emb", ids, [0, np.asarray(ids).size] if np.asarray(ids).ndim == 1 else [0, 2])


@pytest.mark.parametrize("offsets, words", [
    ([0, 2], ["offsets[-1]", "3"]),          # mis-sized: does not end at nnz
    ([1, 3], ["offsets[0]", "1"]),
    ([0, 3, 1, 3], ["non-decreasing", "offsets[2] = 1"]),
    ([], ["B + 1"]),
    ([[0, 3]], ["1-D"]),
    ([0.0, 3.0], ["integer"]),
])
def test_bad_offsets(store, offsets, words):
    with pytest.raises(errors.InvalidOffsetsError) as info:
        store.embedding_bag("emb", [1, 2, 3], offsets)
    for word in words:
        assert word in str(info.value)


def test_bad_weights_mode_and_requests(store):
    with pytest.raises(errors.InvalidArgumentError, match=r"\(3,\)"):
        store.embedding_bag("emb", [1, 2, 3], [0, 3], per_sample_weights=[1.0, 2.0])
    with pytest.raises(errors.InvalidArgumentError, match="floating"):
        store.embedding_bag("emb", [1, 2, 3], [0, 3], per_sample_weights=[1, 2, 3])
    with pytest.raises(errors.InvalidArgumentError, match="'max'"):
        store.embedding_bag("emb", [1], [0, 1], mode="max")
    with pytest.raises(errors.InvalidArgumentError, match="mapping"):
        store.embedding_bags([("emb", ([1], [0, 1]))])
    with pytest.raises(errors.InvalidArgumentError, match="emb"):
        store.embedding_bags({"emb": ([1],)})
    # a bad request anywhere in a batch rejects the whole batch before anything is served
    before = store.stats()["lookups"]
    with pytest.raises(errors.StoreError, match="no rows yet"):
        store.embedding_bags({"emb": ([1], [0, 1]), "unwritten": ([0], [0, 1])})
    with pytest.raises(errors.IdOutOfRangeError):
        store.embedding_bags({"emb": ([1, 999], [0, 2])})
    assert store.stats()["lookups"] == before


def test_unknown_and_unwritten_tables(store):
    with pytest.raises(errors.UnknownTableError) as info:
        store.lookup("nope", [0])
    assert "nope" in str(info.value) and "emb" in str(info.value)
    assert isinstance(info.value, KeyError)
    with pytest.raises(errors.StoreError, match="no rows yet"):
        store.lookup("unwritten", [0])
    with pytest.raises(errors.UnknownTableError):
        store.write_table("nope", np.zeros((1, 8), np.float32))


@pytest.mark.parametrize("rows, words", [
    (np.zeros((99, 8), np.float32), ["100 rows", "(99, 8)"]),
    (np.zeros((100, 9), np.float32), ["(k, 8)", "(100, 9)"]),
    (np.zeros(800, np.float32), ["(k, 8)", "(800,)"]),
    (np.full((100, 8), np.nan, np.float32), ["finite"]),
    (np.zeros((100, 8), dtype=object), ["numeric", "object"]),
    (iter([np.zeros((60, 8), np.float32), np.zeros((60, 8), np.float32)]), ["100 rows", "120"]),
    (iter([np.zeros((60, 8), np.float32)]), ["100 rows", "supplied 60"]),
    (iter([np.zeros((60, 8), np.float32), np.zeros((40, 7), np.float32)]), ["chunk 1", "(40, 7)"]),
    (42, ["iterable"]),
])
def test_rejected_writes_change_nothing(store, rows, words):
    before = tree_digest(store.path)
    old = store.lookup("emb", np.arange(100))
    with pytest.raises(errors.InvalidArgumentError) as info:
        store.write_table("emb", rows)
    for word in words:
        assert word in str(info.value)
    assert tree_digest(store.path) == before
    np.testing.assert_array_equal(store.lookup("emb", np.arange(100)), old)


def test_create_and_open_errors(tmp_path):
    with pytest.raises(errors.StoreNotFoundError, match="no sdm store"):
        sdm.Store.open(tmp_path / "missing")
    with pytest.raises(errors.InvalidArgumentError, match="at least one table"):
        sdm.Store.create(tmp_path / "a", [])
    with pytest.raises(errors.InvalidArgumentError, match="repeated"):
        sdm.Store.create(tmp_path / "a", [SPEC, SPEC])
    with pytest.raises(errors.InvalidArgumentError, match="TableSpec"):
        sdm.Store.create(tmp_path / "a", [("emb", 10, 8)])
    assert not os.path.exists(tmp_path / "a")
    sdm.Store.create(tmp_path / "a", [SPEC]).close()
    with pytest.raises(errors.StoreExistsError, match="already exists"):
        sdm.Store.create(tmp_path / "a", [SPEC])
    with pytest.raises(errors.ConfigError, match="'nvme-magic'"):
        sdm.Store.open(tmp_path / "a", config="nvme-magic")
    assert sorted(os.listdir(tmp_path)) == ["a"]  # no temporary directories left behind


@pytest.mark.parametrize("kwargs, words", [
    (dict(name="", num_rows=1, dim=1), ["name"]),
    (dict(name="a/b", num_rows=1, dim=1), ["name", "a/b"]),
    (dict(name="a", num_rows=0, dim=1), ["num_rows", "0"]),
    (dict(name="a", num_rows=1, dim=-4), ["dim", "-4"]),
    (dict(name="a", num_rows=1.5, dim=4), ["num_rows", "1.5"]),
    (dict(name="a", num_rows=1, dim=4, fmt="int4"), ["int4", "fp32"]),
])
def test_bad_table_specs(kwargs, words):
    with pytest.raises(errors.InvalidArgumentError) as info:
        sdm.TableSpec(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_readonly_and_closed(tmp_path, store):
    store.close()
    with pytest.raises(errors.StoreError, match="closed"):
        store.lookup("emb", [0])
    with sdm.Store.open(store.path, readonly=True) as ro:
        np.testing.assert_array_equal(ro.lookup("emb", [1]), [np.arange(8, 16, dtype=np.float32)])
        with pytest.raises(errors.ReadOnlyError, match="read-only"):
            ro.write_table("emb", np.zeros((100, 8), np.float32))


def test_errors_subclass_the_builtins():
    assert issubclass(errors.IdOutOfRangeError, IndexError)
    assert issubclass(errors.InvalidOffsetsError, ValueError)
    assert issubclass(errors.UnknownTableError, KeyError)
    assert issubclass(errors.CorruptStoreError, OSError)
    assert issubclass(errors.StoreNotFoundError, FileNotFoundError)

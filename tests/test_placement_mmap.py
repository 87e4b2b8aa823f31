"""The SCM row file in a placement's row order: same rows as identity order (mmap and O_DIRECT
reads), offsets where the rows really are, rebuilds when the order changes, bad orders refused."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sdm
import sdm.tiers.rowfile as rowfile_mod
from helpers import rows_of, write_store
from sdm.devices import count_blocks
from sdm.errors import ConfigError
from sdm.tiers.manifest import Manifest
from sdm.replay.planner import plan
from sdm.tiers import MmapTier
from sdm.tiers.lmdb import RowDB
from sdm.tiers.rowfile import HEADER_BYTES, order_digest, rowfile_path

SPECS = [sdm.TableSpec("i8", 1500, 64, "int8"), sdm.TableSpec("f32", 600, 16, "fp32")]


@pytest.fixture(scope="module")
def store_dir(make_store):
    return str(make_store(SPECS))


@pytest.fixture(scope="module")
def raw():
    return {s.name: sdm.quantize_rows(rows_of(s), s.fmt) for s in SPECS}


@pytest.fixture(scope="module")
def layouts(store_dir):
    return {t.name: t for t in Manifest.read(store_dir).tables}


@pytest.fixture(scope="module")
def orders():
    rng = np.random.default_rng(5)
    return {"i8": rng.permutation(1500).astype(np.int64)}  # f32 keeps identity order


@pytest.fixture(scope="module")
def ordered(store_dir, orders):
    # its own copy of the store directory's SCM files: other tests build identity files
    db = RowDB(store_dir)
    tier = MmapTier(db, store_dir, row_order=orders)
    yield tier
    tier.close()
    db.close()


def read(tier, layout, ids, direct=False):
    out = np.empty((len(ids), layout.spec.row_bytes), dtype=np.uint8)
    if direct:
        tier.read_rows_direct(layout, ids, out, queue_depth=3)
    else:
        tier.read_rows(layout, ids, out)
    return out


@settings(max_examples=40)
@given(data=st.data())
def test_ordered_reads_return_the_stored_rows(ordered, layouts, raw, orders, data):
    name = data.draw(st.sampled_from(["i8", "f32"]))
    layout = layouts[name]
    n = layout.spec.num_rows
    ids = np.array(sorted(set(data.draw(st.lists(st.integers(0, n - 1), max_size=80)))), dtype=np.int64)
    direct = data.draw(st.booleans())
    np.testing.assert_array_equal(read(ordered, layout, ids, direct), raw[name][ids])
    offsets = ordered.row_offsets(layout, ids)
    assert offsets.dtype == np.int64 and offsets.shape == ids.shape
    pos = np.argsort(orders[name]) if name in orders else np.arange(n)
    np.testing.assert_array_equal(offsets, HEADER_BYTES + pos[ids] * layout.spec.row_bytes)


def test_whole_table_and_file_contents_follow_the_order(ordered, layouts, raw, orders, store_dir):
    layout = layouts["i8"]
    ids = np.arange(1500, dtype=np.int64)
    np.testing.assert_array_equal(read(ordered, layout, ids), raw["i8"])
    np.testing.assert_array_equal(read(ordered, layout, ids, direct=True), raw["i8"])
    width = layout.spec.row_bytes
    with open(ordered.path_of(layout), "rb") as f:
        f.seek(HEADER_BYTES)
        data = np.frombuffer(f.read(1500 * width), dtype=np.uint8).reshape(1500, width)
    np.testing.assert_array_equal(data, raw["i8"][orders["i8"]])


def test_offsets_follow_ids_so_co_located_rows_share_blocks(ordered, layouts, orders):
    layout = layouts["i8"]
    width = layout.spec.row_bytes
    together = np.sort(orders["i8"][:50])  # the first 50 positions: 3600 B, one 4 KiB page
    assert count_blocks(ordered.row_offsets(layout, together) - HEADER_BYTES, width, 4096) == 1
    assert count_blocks(together * width, width, 4096) > 10  # scattered in identity order


def test_a_file_built_for_another_order_is_rebuilt(tmp_path, layouts, raw):
    spec = SPECS[0]
    path = tmp_path / "s"
    write_store(path, [spec])
    directory = str(path)
    layout = Manifest.read(directory).tables[0]
    ids = np.array([0, 7, 300, 1499], dtype=np.int64)
    rng = np.random.default_rng(1)
    first, second = rng.permutation(1500), rng.permutation(1500)

    def session(order):
        db = RowDB(directory)
        tier = MmapTier(db, directory, row_order=None if order is None else {spec.name: order})
        try:
            got = read(tier, layout, ids), read(tier, layout, ids, direct=True)
            with open(tier.path_of(layout), "rb") as f:
                head = f.read(HEADER_BYTES)
            return got, tier.stats()["rebuilds"], head
        finally:
            tier.close()
            db.close()

    # each order has its own file: coming back to one is not a rebuild
    for order, rebuilds in ((None, 1), (None, 0), (first, 1), (first, 0), (second, 1), (None, 0), (first, 0)):
        (plain, direct), got, head = session(order)
        assert got == rebuilds, (order is None, got)
        np.testing.assert_array_equal(plain, raw[spec.name][ids])
        np.testing.assert_array_equal(direct, raw[spec.name][ids])
        assert order_digest(order) in head
    assert order_digest(None) == bytes(32) and order_digest(first) != order_digest(second)


def test_permuted_build_streams_in_chunks(tmp_path, monkeypatch, raw):
    monkeypatch.setattr(rowfile_mod, "_BUILD_CHUNK_BYTES", 1000)  # 13 rows of 72 B a chunk
    spec = SPECS[0]
    path = tmp_path / "s"
    write_store(path, [spec])
    db = RowDB(str(path))
    order = np.random.default_rng(2).permutation(1500)
    tier = MmapTier(db, str(path), row_order={spec.name: order})
    try:
        layout = Manifest.read(str(path)).tables[0]
        ids = np.arange(1500, dtype=np.int64)
        np.testing.assert_array_equal(read(tier, layout, ids), raw[spec.name])
    finally:
        tier.close()
        db.close()


@pytest.mark.parametrize("order, words", [
    (np.arange(10), ["(1500,)", "shape (10,)"]),
    (np.r_[np.arange(1499), 1499.0], ["integer permutation", "float64"]),
    (np.r_[np.arange(1499), 1500], ["outside [0, 1500)"]),
    (np.r_[np.arange(1499), 3], ["not a permutation", "row 1499"]),
])
def test_bad_orders_raise_config_error(store_dir, layouts, order, words):
    db = RowDB(store_dir)
    tier = MmapTier(db, store_dir, row_order={"i8": order})
    try:
        with pytest.raises(ConfigError) as err:
            read(tier, layouts["i8"], np.array([1], dtype=np.int64))
        for w in words:
            assert w in str(err.value)
        assert "'i8'" in str(err.value)
        # other tables are unaffected
        np.testing.assert_array_equal(read(tier, layouts["f32"], np.array([2], dtype=np.int64)),
                                      sdm.quantize_rows(rows_of(SPECS[1]), "fp32")[[2]])
    finally:
        tier.close()
        db.close()


def test_a_planned_order_serves_the_same_rows_and_reads_fewer_blocks(tmp_path):
    """End to end: plan on a skewed trace, build the row file in the planned order, and the
    device blocks the tier's offsets imply drop by the planned figure."""
    trace = sdm.trace.generate("zipf", seed=3, tables=1, table_size="20000", batches=12, batch_size=64,
                               pooling="8", alpha="1.1")
    spec = sdm.TableSpec("t0", 20000, 32, "fp16")
    path = tmp_path / "s"
    write_store(path, [spec])
    p = plan(trace, {"t0": spec}, dram_bytes=0)
    assert p.info["blocks_per_lookup"]["reduction"] > 1.4
    db = RowDB(str(path))
    plain, placed = MmapTier(db, str(path)), MmapTier(db, str(path), row_order=p.row_order)
    try:
        layout = Manifest.read(str(path)).tables[0]
        blocks = {"plain": 0, "placed": 0}
        for i in range(6, 12):  # the held-out half
            ids = np.unique(trace.batch(i).indices[0])
            a = read(plain, layout, ids)
            np.testing.assert_array_equal(read(placed, layout, ids), a)
            for key, tier in (("plain", plain), ("placed", placed)):
                blocks[key] += count_blocks(tier.row_offsets(layout, ids) - HEADER_BYTES, spec.row_bytes, 4096)
        after = p.info["blocks_per_lookup"]["after"]["total"]["blocks"]
        before = p.info["blocks_per_lookup"]["before"]["total"]["blocks"]
        assert (blocks["plain"], blocks["placed"]) == (before, after)
    finally:
        plain.close()
        placed.close()
        db.close()
    assert os.path.exists(rowfile_path(str(path), layout))


def test_files_of_older_generations_are_dropped_other_orders_kept(tmp_path):
    spec = SPECS[0]
    path = tmp_path / "s"
    write_store(path, [spec])
    directory = str(path)
    order = np.random.default_rng(3).permutation(spec.num_rows)

    def touch(order):
        db = RowDB(directory)
        tier = MmapTier(db, directory, row_order=None if order is None else {spec.name: order})
        try:
            layout = Manifest.read(directory).tables[0]
            read(tier, layout, np.array([0, 5], dtype=np.int64))
            return os.path.basename(tier.path_of(layout))
        finally:
            tier.close()
            db.close()

    plain, ordered_name = touch(None), touch(order)
    assert plain == "t0.rows" and re.fullmatch(r"t0-[0-9a-f]{12}\.rows", ordered_name)
    assert sorted(os.listdir(path / "scm")) == sorted([plain, ordered_name])  # both current: kept
    with sdm.Store.open(path) as store:  # a new generation of the table
        store.write_table(spec.name, rows_of(spec) + 1)
    assert touch(None) == plain
    assert os.listdir(path / "scm") == [plain]  # the ordered file of the old generation is gone

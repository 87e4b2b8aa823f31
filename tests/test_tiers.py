"""One conformance suite run against every tier (bare and metered, every IO mode, the DRAM
cache alone and chained); the SCM row file's rebuild rules. The DRAM cache's policy
behaviour is tested against the simulator in ``test_dram_cache.py``."""

from __future__ import annotations

import os

import numpy as np
import pytest

import sdm
from sdm.clock import SimClock
from sdm.manifest import Manifest, TableLayout
from sdm.tiers import DramTier, LmdbTier, DramCacheTier, Metered, MmapTier, Tier
from sdm.tiers.lmdb import RowDB
from sdm.tiers.mmap import HEADER_BYTES, rowfile_path

SPECS = [sdm.TableSpec("f32", 900, 16, "fp32"), sdm.TableSpec("i8", 1500, 64, "int8"),
         sdm.TableSpec("f16", 700, 8, "fp16"), sdm.TableSpec("wide", 30, 1100, "fp32")]


def rows_of(spec, seed=0):
    return np.random.default_rng(seed + spec.num_rows).standard_normal((spec.num_rows, spec.dim)).astype(np.float32)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiers") / "s"
    with sdm.Store.create(path, SPECS) as store:
        for spec in SPECS:
            store.write_table(spec.name, rows_of(spec))
    return str(path)


@pytest.fixture(scope="module")
def raw(store_dir):
    return {s.name: sdm.quantize_rows(rows_of(s), s.fmt) for s in SPECS}


class DirectTier(Tier):
    """An MmapTier read only through its O_DIRECT path, at queue depth 4."""

    name = "direct"

    def __init__(self, inner):
        self.inner = inner

    def read_rows(self, layout, ids, out):
        self.inner.read_rows_direct(layout, ids, out, queue_depth=4)

    def row_offsets(self, layout, ids):
        return self.inner.row_offsets(layout, ids)

    def close(self):
        self.inner.close()


def make_tier(kind, db, directory):
    if kind == "lmdb":
        return LmdbTier(db)
    if kind == "dram":
        return DramTier(LmdbTier(db))
    if kind == "mmap":
        return MmapTier(db, directory)
    if kind == "mmap-direct":
        return DirectTier(MmapTier(db, directory))
    if kind == "cache":  # a small cache, so batches both hit and evict
        return DramCacheTier(Metered(MmapTier(db, directory), "optane-p4800x-512"), 64, 4400)
    if kind == "cache-chain":
        clock = SimClock()
        lower = DramCacheTier(Metered(LmdbTier(db), "nand-p4500", clock), 200, 4400, name="cache2")
        return DramCacheTier(Metered(lower, "optane-p4800x-512", clock), 50, 4400)
    kind, mode = kind.split(":")
    return Metered(make_tier(kind, db, directory), "nand-p4500", io_mode=mode, queue_depth=4)


KINDS = ["lmdb", "dram", "mmap", "mmap-direct", "cache", "cache-chain", "lmdb:modeled", "mmap:paced",
         "mmap:direct", "cache:modeled", "dram:paced"]


class TestTierConformance:
    """Every tier returns the stored bytes for any sorted unique ids, reports offsets that do
    not overlap, survives invalidation, and counts what it served."""

    @pytest.fixture(params=KINDS)
    def tier(self, request, store_dir):
        db = RowDB(store_dir)
        tier = make_tier(request.param, db, store_dir)
        yield tier
        tier.close()
        db.close()

    @pytest.fixture
    def layouts(self, store_dir):
        return {t.name: t for t in Manifest.read(store_dir).tables}

    def read(self, tier, layout, ids):
        out = np.empty((len(ids), layout.spec.row_bytes), dtype=np.uint8)
        served = tier.read_rows(layout, ids, out)
        assert served is None or (served.dtype == np.bool_ and served.shape == ids.shape)
        return out

    @pytest.mark.parametrize("name", [s.name for s in SPECS])
    def test_reads_return_the_stored_bytes(self, tier, layouts, raw, name):
        layout = layouts[name]
        rng = np.random.default_rng(1)
        for size in (1, 5, 40, layout.spec.num_rows):
            ids = np.unique(rng.integers(0, layout.spec.num_rows, size)).astype(np.int64)
            np.testing.assert_array_equal(self.read(tier, layout, ids), raw[name][ids])
        tier.invalidate(layout)
        ids = np.array([0, layout.spec.num_rows - 1], dtype=np.int64)
        np.testing.assert_array_equal(self.read(tier, layout, ids), raw[name][ids])

    def test_empty_reads(self, tier, layouts):
        self.read(tier, layouts["i8"], np.empty(0, dtype=np.int64))

    def test_offsets_are_int64_and_rows_do_not_overlap(self, tier, layouts):
        if not tier.holds_all_rows:
            pytest.skip("a cache places only the rows it holds")
        for layout in layouts.values():
            ids = np.arange(layout.spec.num_rows, dtype=np.int64)
            offsets = tier.row_offsets(layout, ids)
            assert offsets.dtype == np.int64 and offsets.shape == ids.shape
            assert np.all(np.diff(offsets) >= layout.spec.row_bytes)

    def test_stats_count_rows_served(self, tier, layouts):
        self.read(tier, layouts["f32"], np.arange(10, dtype=np.int64))
        stats = tier.stats()
        assert isinstance(stats, dict)
        if stats:
            assert stats["hits"] + stats.get("misses", 0) >= 10


# -- the SCM row file ---------------------------------------------------------------------------

@pytest.fixture
def small_store(tmp_path):
    spec = sdm.TableSpec("t", 2000, 64, "int8")
    path = tmp_path / "s"
    with sdm.Store.create(path, [spec]) as store:
        store.write_table("t", rows_of(spec))
    return str(path), spec


def mmap_read(directory, ids):
    db = RowDB(directory)
    tier = MmapTier(db, directory)
    try:
        layout = Manifest.read(directory).tables[0]
        out = np.empty((len(ids), layout.spec.row_bytes), dtype=np.uint8)
        tier.read_rows(layout, np.asarray(ids, dtype=np.int64), out)
        return out, tier.stats()["rebuilds"], rowfile_path(directory, layout)
    finally:
        tier.close()
        db.close()


def test_row_file_is_page_aligned_and_reused(small_store):
    directory, spec = small_store
    out, rebuilds, path = mmap_read(directory, [0, 1999])
    assert rebuilds == 1
    data_pages = -(-spec.num_rows * spec.row_bytes // 4096)
    crc_pages = -(-data_pages * 4 // 4096)  # a CRC32 per data page
    assert os.path.getsize(path) == HEADER_BYTES + (data_pages + crc_pages) * 4096
    want = sdm.quantize_rows(rows_of(spec), "int8")
    np.testing.assert_array_equal(out, want[[0, 1999]])
    with open(path, "rb") as f:
        f.seek(HEADER_BYTES)
        assert f.read(spec.row_bytes) == want[0].tobytes()
    assert mmap_read(directory, [5])[1] == 0  # current: opened, not rebuilt
    assert not [n for n in os.listdir(os.path.dirname(path)) if ".tmp" in n]


def test_row_file_is_rebuilt_when_deleted(small_store):
    directory, spec = small_store
    _, _, path = mmap_read(directory, [3])
    os.unlink(path)
    out, rebuilds, _ = mmap_read(directory, [3])
    assert rebuilds == 1 and os.path.exists(path)
    np.testing.assert_array_equal(out, sdm.quantize_rows(rows_of(spec), "int8")[[3]])


def test_row_file_is_rebuilt_when_stale(small_store):
    directory, spec = small_store
    _, _, path = mmap_read(directory, [3])
    with open(path, "rb") as f:
        old = f.read()
    with sdm.Store.open(directory, config="sdm-nand") as store:
        store.lookup("t", [3])
        store.write_table("t", rows_of(spec, seed=7))  # a new generation
        np.testing.assert_allclose(store.lookup("t", [3]), sdm.dequantize_rows(
            sdm.quantize_rows(rows_of(spec, seed=7)[[3]], "int8"), "int8", 64))
    with open(path, "wb") as f:  # the previous generation's file put back: stale
        f.write(old)
    out, rebuilds, _ = mmap_read(directory, [3])
    assert rebuilds == 1
    np.testing.assert_array_equal(out, sdm.quantize_rows(rows_of(spec, seed=7), "int8")[[3]])


@pytest.mark.parametrize("where", ["header", "data", "truncate"])
def test_damaged_row_file_is_rebuilt_never_served(small_store, where):
    directory, spec = small_store
    _, _, path = mmap_read(directory, [3])
    with open(path, "r+b") as f:
        if where == "truncate":
            f.truncate(HEADER_BYTES + 100)
        else:
            f.seek(12 if where == "header" else HEADER_BYTES + 3 * spec.row_bytes + 5)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
    out, rebuilds, _ = mmap_read(directory, [3])
    assert rebuilds == 1
    np.testing.assert_array_equal(out, sdm.quantize_rows(rows_of(spec), "int8")[[3]])

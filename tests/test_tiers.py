"""One conformance suite run against every tier a hierarchy builds (bare and metered, every IO
mode, the DRAM cache alone and chained, pinned tables, the patched SCM tier); the SCM row
file's rebuild rules. The DRAM cache's policy
behaviour is tested against the simulator in ``test_dram_cache.py``."""

from __future__ import annotations

import os

import numpy as np
import pytest

import sdm
from sdm.tiers.clock import SimClock
from sdm.tiers.manifest import Manifest
from sdm.errors import ConfigError
from sdm.tiers import DramTier, LmdbTier, DramCacheTier, Metered, MmapTier
from sdm.tiers.base import CacheTier
from sdm.tiers.lmdb import RowDB
from sdm.tiers.metered import metered
from sdm.tiers.patched import PatchedTier
from sdm.tiers.rowfile import HEADER_BYTES, rowfile_path

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


def make_tier(kind, db, directory):
    """Every tier a hierarchy builds, bare, plus the DRAM cache alone and chained; ``kind:mode``
    is the same behind a device model in that IO mode (``metered``, as the hierarchy wraps)."""
    if ":" in kind:
        kind, mode = kind.split(":")
        return metered(make_tier(kind, db, directory), "nand-p4500", io_mode=mode, queue_depth=4)
    if kind == "lmdb":
        return LmdbTier(db)
    if kind == "dram":
        return DramTier(LmdbTier(db))
    if kind == "pinned":  # a placement's tables pinned whole: serves those tables only
        return DramTier(LmdbTier(db), frozenset(PINNED_IDS), name="pinned")
    if kind == "mmap":
        return MmapTier(db, directory)
    if kind == "patched":  # the SCM tier as hierarchies build it, some rows "updated"
        mapped = MmapTier(db, directory)
        tier = PatchedTier(mapped, db, rowfile=mapped.path_of)
        for layout in Manifest.read(directory).tables:
            # A first read maps the file and starts its patch set; rows_changed extends it.
            tier.read_rows(layout, np.zeros(1, np.int64), np.empty((1, layout.spec.row_bytes), np.uint8))
            tier.rows_changed(layout, np.arange(0, layout.spec.num_rows, 50, dtype=np.int64))
        if tier.stats()["updated_rows"] == 0:
            raise AssertionError("the patched fixture patches no row")
        return tier
    if kind == "cache":  # a small cache, so batches both hit and evict
        return DramCacheTier(metered(MmapTier(db, directory), "optane-p4800x-512"), 64, 4400)
    if kind == "cache-chain":
        clock = SimClock()
        lower = DramCacheTier(metered(LmdbTier(db), "nand-p4500", clock), 200, 4400, name="cache2")
        return DramCacheTier(metered(lower, "optane-p4800x-512", clock), 50, 4400)
    raise AssertionError(kind)


PINNED_IDS = (0, 2)  # table ids of f32 and f16
KINDS = ["lmdb", "dram", "pinned", "mmap", "patched", "cache", "cache-chain", "lmdb:modeled",
         "mmap:paced", "mmap:direct", "patched:direct", "cache:modeled", "cache-chain:paced",
         "dram:paced", "pinned:modeled"]


class TestTierConformance:
    """Every tier returns the stored bytes for any sorted unique ids of the tables it serves,
    reports offsets that do not overlap, survives invalidation, counts what it served, and a
    device model around it charges every block the rows cover."""

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
        assert (served is None) == tier.holds_all_rows  # only a cache reports what it served
        return out

    def served(self, tier, layouts):
        return [layout for layout in layouts.values() if tier.serves(layout)]

    def test_serves_the_tables_it_should(self, tier, layouts):
        want = [layouts[n] for n in ("f32", "f16")] if tier.name == "pinned" else list(layouts.values())
        assert self.served(tier, layouts) == want

    @pytest.mark.parametrize("name", [s.name for s in SPECS])
    def test_reads_return_the_stored_bytes(self, tier, layouts, raw, name):
        layout = layouts[name]
        if not tier.serves(layout):
            return  # covered by test_serves_the_tables_it_should
        rng = np.random.default_rng(1)
        for size in (1, 5, 40, layout.spec.num_rows):
            ids = np.unique(rng.integers(0, layout.spec.num_rows, size)).astype(np.int64)
            np.testing.assert_array_equal(self.read(tier, layout, ids), raw[name][ids])
        tier.invalidate(layout)
        ids = np.array([0, layout.spec.num_rows - 1], dtype=np.int64)
        np.testing.assert_array_equal(self.read(tier, layout, ids), raw[name][ids])

    def test_empty_reads(self, tier, layouts):
        layout = self.served(tier, layouts)[0]
        assert self.read(tier, layout, np.empty(0, dtype=np.int64)).shape == (0, layout.spec.row_bytes)

    def test_offsets_are_int64_and_rows_do_not_overlap(self, tier, layouts):
        for layout in self.served(tier, layouts):
            ids = np.arange(layout.spec.num_rows, dtype=np.int64)
            if not tier.holds_all_rows:  # a cache places the rows it holds, in its slots
                self.read(tier, layout, ids[:40])
                ids = ids[:40]
            offsets = tier.row_offsets(layout, ids)
            assert offsets.dtype == np.int64 and offsets.shape == ids.shape
            assert len(np.unique(offsets)) == len(ids) if not tier.holds_all_rows else \
                np.all(np.diff(offsets) >= layout.spec.row_bytes)

    def test_resident_tables_are_the_stored_bytes(self, tier, layouts, raw):
        for layout in self.served(tier, layouts):
            table = tier.resident(layout)
            assert (table is not None) == (tier.kind == "dram")
            if table is not None:
                np.testing.assert_array_equal(table, raw[layout.name])

    def test_stats_count_rows_served(self, tier, layouts):
        layout = self.served(tier, layouts)[0]
        ids = np.arange(10, dtype=np.int64)
        if not tier.holds_all_rows:  # a cache's device charges its own hits only: warm it
            self.read(tier, layout, ids)
        before = tier.stats()
        self.read(tier, layout, ids)
        stats = tier.stats()
        assert stats["hits"] + stats["misses"] - before["hits"] - before["misses"] >= 10
        if isinstance(tier, Metered):  # the device charged every block of the rows it served
            assert stats["reads"] > before["reads"] and stats["modeled_ns"] > before["modeled_ns"]
            assert stats["useful_bytes"] - before["useful_bytes"] <= 10 * layout.spec.row_bytes
            assert stats["io_mode"] == tier.io_mode and stats["device"] == "nand-p4500"

    def test_medium_is_the_tier_without_its_device(self, tier):
        medium = tier.medium
        assert not isinstance(medium, Metered)
        assert medium is (tier.inner.medium if isinstance(tier, Metered) else tier)

    def test_a_wrapper_keeps_every_ability(self, tier):
        assert isinstance(tier, CacheTier) == (not tier.holds_all_rows)
        if isinstance(tier, Metered):
            for flag in ("holds_all_rows", "supports_direct_io", "supports_load_table", "kind"):
                assert getattr(tier, flag) == getattr(tier.inner, flag)

    def test_load_table_only_where_supported(self, tier, layouts, raw):
        layout = self.served(tier, layouts)[0]
        if tier.supports_load_table:
            np.testing.assert_array_equal(tier.load_table(layout), raw[layout.name])
        else:
            with pytest.raises(NotImplementedError):
                tier.load_table(layout)


def test_a_dram_tier_needs_a_source_that_loads_tables(store_dir):
    db = RowDB(store_dir)
    try:
        with pytest.raises(ConfigError, match="loads whole tables"):
            DramTier(MmapTier(db, store_dir))
    finally:
        db.close()


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

"""A damaged SCM row file is rebuilt from LMDB and its damage recorded in the tier's stats;
a stale one (another generation, order or format version) is rebuilt without a record."""

from __future__ import annotations

import os
import struct
import zlib

import numpy as np
import pytest

import sdm
from helpers import rows_from
from sdm import errors
from sdm.tiers.manifest import Manifest
from sdm.tiers import MmapTier
from sdm.tiers.lmdb import RowDB
from sdm.tiers.mmap import DAMAGE_LOG
from sdm.tiers.patched import PatchedTier
from sdm.tiers.rowfile import HEADER_BYTES, rowfile_path

SPEC = sdm.TableSpec("t", 2000, 20, "int8")  # 28 B rows: 56000 data bytes in 14 pages, 1344 of padding
ROWS = rows_from(SPEC, 0)


@pytest.fixture
def store(make_store):
    return str(make_store([SPEC], lambda spec: ROWS))


class Session:
    """An MmapTier over the store at ``directory``, closed by :meth:`close`."""

    def __init__(self, directory):
        self.db = RowDB(directory)
        self.tier = MmapTier(self.db, directory)
        self.layout = Manifest.read(directory).tables[0]
        self.path = rowfile_path(directory, self.layout)
        self.want = sdm.quantize_rows(ROWS, SPEC.fmt)

    def read(self, ids, direct=False):
        ids = np.asarray(ids, dtype=np.int64)
        out = np.empty((len(ids), SPEC.row_bytes), dtype=np.uint8)
        if direct:
            self.tier.read_rows_direct(self.layout, ids, out, queue_depth=2)
        else:
            self.tier.read_rows(self.layout, ids, out)
        np.testing.assert_array_equal(out, self.want[ids])
        return self.tier.stats()

    def close(self):
        self.tier.close()
        self.db.close()


def read_once(directory, ids=(0, 5, 1999)):
    s = Session(directory)
    try:
        return s.read(ids), s.path
    finally:
        s.close()


def damage(path, where):
    size = os.path.getsize(path)
    data_end = HEADER_BYTES + SPEC.num_rows * SPEC.row_bytes
    with open(path, "r+b") as f:
        if where == "truncated":
            f.truncate(size - 4096)
        elif where == "short-header":
            f.truncate(100)
        elif where == "extended":
            f.seek(size)
            f.write(b"x")
        else:
            at = {"magic": 0, "generation": 16, "header-crc": 76, "header-tail": 2000,
                  "data": HEADER_BYTES + 7 * SPEC.row_bytes + 3, "padding": data_end + 100,
                  "last-byte": size - 1}[where]
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0x5A]))


WHAT = {"magic": "header fails its CRC32", "generation": "header fails its CRC32",
        "header-crc": "header fails its CRC32", "header-tail": "header fails its CRC32",
        "data": "data page 0 fails its CRC32", "padding": "data page 13 fails its CRC32",
        "last-byte": "page-checksum table fails its CRC32", "truncated": "truncated", "extended": "extended",
        "short-header": "truncated"}


@pytest.mark.parametrize("where", sorted(WHAT))
def test_damage_anywhere_in_the_file_is_rebuilt_and_recorded(store, where):
    stats, path = read_once(store)
    assert stats["rebuilds"] == 1 and stats["damage_events"] == 0 and stats["damage"] == []  # missing: built
    damage(path, where)
    stats, _ = read_once(store)
    assert stats["rebuilds"] == 1 and stats["damage_events"] == 1
    (record,) = stats["damage"]
    assert record["file"] == path and record["table"] == "t" and record["action"] == "rebuilt"
    assert record["what"].startswith(WHAT[where]), record
    stats, _ = read_once(store)  # rebuilt file is intact: opened as is
    assert stats["rebuilds"] == 0 and stats["damage"] == []


def test_stale_file_is_rebuilt_without_a_damage_record(store):
    _, path = read_once(store)
    old = open(path, "rb").read()
    with sdm.Store.open(store) as s:
        s.write_table("t", ROWS)  # same rows, a new generation
    with open(path, "wb") as f:
        f.write(old)
    stats, _ = read_once(store)
    assert stats["rebuilds"] == 1 and stats["damage_events"] == 0


def old_header(version, generation):
    """An intact header page of format ``version`` (2-4: no database version); 2: a CRC over
    its fields only, 3-4: a CRC over the rest of the page too."""
    head = struct.pack("<8sIIQQQQI32s", b"SDMROWS\x00", version, 0, generation, SPEC.num_rows,
                       SPEC.row_bytes, SPEC.num_rows * SPEC.row_bytes, 0, bytes(32))
    rest = bytes(HEADER_BYTES - len(head) - 4)
    if version == 2:
        return head + struct.pack("<I", zlib.crc32(head)) + rest
    return head + struct.pack("<I", zlib.crc32(rest, zlib.crc32(head))) + rest


@pytest.mark.parametrize("version", [2, 4])
def test_older_format_version_is_stale_not_damage(store, version):
    _, path = read_once(store)
    layout = Manifest.read(store).tables[0]
    with open(path, "r+b") as f:
        f.write(old_header(version, layout.generation))
    stats, _ = read_once(store)
    assert stats["rebuilds"] == 1 and stats["damage_events"] == 0


@pytest.mark.parametrize("version", [2, 4])
def test_older_format_files_of_older_generations_are_dropped(store, version):
    _, path = read_once(store)
    generation = Manifest.read(store).tables[0].generation
    ordered = path[:-len(".rows")] + "-0123456789ab.rows"  # another row order's file, never reopened
    with open(ordered, "wb") as f:
        f.write(old_header(version, generation))
    with sdm.Store.open(store) as s:
        s.write_table("t", ROWS)  # a new generation: the next build drops the older ones
    read_once(store)
    assert not os.path.exists(ordered) and os.path.exists(path)


def test_truncated_while_open_is_caught_before_the_read_faults(store):
    s = Session(store)
    try:
        s.read([1, 2])
        os.truncate(s.path, HEADER_BYTES)  # in place: the open mapping now ends early
        stats = s.read([1999, 3])
        assert stats["damage_events"] == 1 and stats["damage"][0]["what"].startswith("truncated while open")
        assert stats["rebuilds"] == 2
    finally:
        s.close()


def test_short_direct_read_is_damage_rebuilt_and_read_again(store):
    s = Session(store)
    try:
        s.read([1, 2], direct=True)
        os.truncate(s.path, HEADER_BYTES)
        stats = s.read([1999, 3], direct=True)
        assert stats["damage_events"] == 1 and "short O_DIRECT read" in stats["damage"][0]["what"]
        assert stats["damage"][0]["action"] == "rebuilt"
    finally:
        s.close()


def test_damage_log_is_bounded(store):
    s = Session(store)
    try:
        s.read([0])
        for _ in range(DAMAGE_LOG + 5):
            damage(s.path, "data")
            s.tier.invalidate(s.layout)
            stats = s.read([0])
        assert stats["damage_events"] == DAMAGE_LOG + 5 and len(stats["damage"]) == DAMAGE_LOG
    finally:
        s.close()


def test_rebuild_from_damaged_lmdb_raises_and_is_recorded(store):
    _, path = read_once(store)
    damage(path, "data")
    data = os.path.join(store, "rows.lmdb", "data.mdb")
    raw = open(data, "rb").read()
    at = raw.find(sdm.quantize_rows(ROWS, SPEC.fmt)[0].tobytes())
    assert at > 0
    with open(data, "r+b") as f:
        f.seek(at + 3)
        f.write(bytes([raw[at + 3] ^ 1]))
    s = Session(store)
    try:
        with pytest.raises(errors.CorruptStoreError) as info:
            s.read([5])
        assert info.value.path == data and info.value.table == "t"
        (record,) = s.tier.stats()["damage"]
        assert record["file"] == path and record["action"].startswith("rebuild failed")
    finally:
        s.close()


def test_store_stats_show_the_damage_under_sdm_nand(store):
    _, path = read_once(store)
    damage(path, "data")
    with sdm.Store.open(store, config="sdm-nand") as s:
        np.testing.assert_array_equal(s.lookup("t", [7]), sdm.dequantize_rows(
            sdm.quantize_rows(ROWS[[7]], SPEC.fmt), SPEC.fmt, SPEC.dim))
        stats = s.stats()
    (mmap_row,) = [t for t in stats["tiers"] if t["kind"] == "mmap"]
    assert mmap_row["damage_events"] == 1 and mmap_row["damage"][0]["file"] == path
    (record,) = stats["damage"]  # the store's own summary of what it worked around
    assert record["file"] == path and record["table"] == "t" and record["action"] == "rebuilt"


def test_store_stats_show_no_damage_for_an_intact_store(store):
    read_once(store)
    with sdm.Store.open(store, config="sdm-nand") as s:
        s.lookup("t", [7])
        assert s.stats()["damage"] == []


def test_pages_are_checked_when_first_read_not_at_open(store):
    _, path = read_once(store)
    damage(path, "padding")  # the last data page, which ids 0 and 5 do not touch
    s = Session(store)
    try:
        stats = s.read([0, 5])
        assert stats["damage_events"] == 0 and stats["rebuilds"] == 0
        rf = s.tier._file(s.layout)
        assert rf.checked.sum() == 1 and rf.unchecked == 13  # page 0 only
        stats = s.read([1999])  # the damaged page: found, rebuilt, served from the new file
        assert stats["damage_events"] == 1 and stats["damage"][0]["what"] == "data page 13 fails its CRC32"
    finally:
        s.close()


def test_damaged_page_found_by_a_direct_read_is_rebuilt_and_read_again(store):
    _, path = read_once(store)
    damage(path, "data")
    s = Session(store)
    try:
        stats = s.read([3, 7, 1999], direct=True)
        assert stats["damage_events"] == 1 and stats["damage"][0]["what"] == "data page 0 fails its CRC32"
        assert stats["damage"][0]["action"] == "rebuilt"
        rf = s.tier._file(s.layout)
        assert rf.checked[[0, 13]].all()  # the new file's pages, checked as read
    finally:
        s.close()


def test_retired_files_release_their_descriptors(store):
    _, path = read_once(store)
    s = Session(store)
    try:
        s.read([1000], direct=True)  # page 6
        baseline = len(os.listdir("/proc/self/fd"))
        for i in range(5):  # damage found by a read: the file is retired, rebuilt, reopened;
            # alternate pages, as the rebuilt file's retry read checks the page it reads
            where, row = (("data", 0), ("padding", 1999))[i % 2]
            damage(path, where)
            s.read([row], direct=True)
        assert s.tier.stats()["damage_events"] == 5
        assert len(os.listdir("/proc/self/fd")) == baseline
    finally:
        s.close()


def test_direct_reads_use_the_mapped_file_even_after_another_process_rebuilt_its_path(store):
    """A reader's O_DIRECT descriptor is opened on the file it mapped, not on the path, which
    may name a newer generation's file by the time of its first direct read."""
    reader = Session(store)
    try:
        reader.read([0])  # maps the generation-1 file
        with sdm.Store.open(store, config="sdm-nand") as writer:  # publishes generation 2 and
            writer.write_table("t", rows_from(SPEC, 1))            # rebuilds the file at the path
            writer.lookup("t", [0])
        stats = reader.read([5, 1999], direct=True)  # generation-1 rows, checked against gen-1 CRCs
        assert stats["damage_events"] == 0 and stats["damage"] == []
    finally:
        reader.close()


@pytest.mark.parametrize("direct", [False, True])
def test_a_damaged_file_replaced_by_another_version_mid_read_serves_the_batch_version(store, direct):
    """A batch patched for the file it mapped (built after an update, nothing to patch) finds it damaged;
    by the time the rebuilt file is opened, another process has put at the path one it built
    before the update. The batch still serves the updated rows: the file it is served from is
    of another version than the one it was patched for, so those rows come from LMDB."""
    db = RowDB(store)
    mapped = MmapTier(db, store)
    tier = PatchedTier(mapped, db, rowfile=mapped.path_of)
    layout = Manifest.read(store).tables[0]
    path = rowfile_path(store, layout)
    want = sdm.quantize_rows(ROWS, SPEC.fmt)
    every = np.arange(SPEC.num_rows, dtype=np.int64)

    def read_all():
        out = np.empty((SPEC.num_rows, SPEC.row_bytes), dtype=np.uint8)
        if direct:
            tier.read_rows_direct(layout, every, out, queue_depth=2)
        else:
            tier.read_rows(layout, every, out)
        return out

    try:
        np.testing.assert_array_equal(read_all(), want)  # builds and maps the version-0 file
        v0 = mapped.built_version(layout)
        with open(path, "rb") as f:
            version_0_file = f.read()
        ids = np.arange(0, SPEC.num_rows, 50, dtype=np.int64)  # 2%: a version-0 file is close enough
        want[ids] = sdm.quantize_rows(rows_from(SPEC, 1)[ids], SPEC.fmt)
        v1 = db.update_rows(layout, ids, want[ids])
        os.unlink(path)  # the file rebuilt at version 1, as after a larger update
        tier.invalidate(layout)
        np.testing.assert_array_equal(read_all(), want)
        assert mapped.built_version(layout) == v1 > v0

        rebuild = mapped._rebuild

        def rebuild_then_another_process_replaces(*args):
            rebuild(*args)
            with open(path + ".other", "wb") as f:
                f.write(version_0_file)
            os.replace(path + ".other", path)

        mapped._rebuild = rebuild_then_another_process_replaces
        os.truncate(path, HEADER_BYTES)  # damage: found by the next read
        np.testing.assert_array_equal(read_all(), want)
        assert mapped.built_version(layout) == v0 and mapped.stats()["damage_events"] == 1
        np.testing.assert_array_equal(read_all(), want)  # the next batch patches the version-0 file
    finally:
        tier.close()
        db.close()

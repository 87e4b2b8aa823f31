"""The IO engine of ``direct`` mode: one device's reads, bounded, shared by every request.

Pages read through it equal plain ``os.pread`` of the same pages (the reference), for any
page list and job count; many requests at once never have more than ``depth`` jobs at the
device, and do overlap; a short read is reported, a failed read raised, and no caller waits
for ever (every wait here has a timeout).
"""

from __future__ import annotations

import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sdm
from sdm.errors import ConfigError
from sdm.tiers import io_engine
from sdm.tiers.io_engine import IOEngine

PAGE = 4096
PAGES = 64
TIMEOUT = 30


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("engine") / "pages.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, PAGES * PAGE, dtype=np.uint8).tobytes())
    return str(path)


@pytest.fixture(scope="module")
def engine():
    e = IOEngine("test", 4)
    yield e
    e.close()


def reference(fd, pages):
    return b"".join(os.pread(fd, PAGE, p * PAGE) for p in pages)


@settings(max_examples=60, deadline=None)
@given(pages=st.lists(st.integers(0, PAGES - 1), max_size=40), jobs=st.integers(1, 12))
def test_pages_equal_plain_preads(data_file, engine, pages, jobs):
    fd = os.open(data_file, os.O_RDONLY)
    try:
        buf = bytearray(len(pages) * PAGE)
        assert engine.read_pages(fd, pages, memoryview(buf), PAGE, jobs) == []
        assert bytes(buf) == reference(fd, pages)
    finally:
        os.close(fd)


def test_direct_reads_into_an_aligned_buffer(data_file):
    try:
        fd = os.open(data_file, os.O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        pytest.skip(f"no O_DIRECT here: {exc}")
    engine = IOEngine("direct", 3)
    buf = mmap.mmap(-1, 5 * PAGE)  # page aligned, as O_DIRECT needs
    try:
        pages = [7, 0, 63, 12, 7]
        assert engine.read_pages(fd, pages, memoryview(buf), PAGE, 3) == []
        plain = os.open(data_file, os.O_RDONLY)
        assert bytes(buf) == reference(plain, pages)
        os.close(plain)
    finally:
        engine.close()
        os.close(fd)


def test_many_requests_share_a_bounded_depth(data_file):
    engine = IOEngine("bounded", 3)
    fd = os.open(data_file, os.O_RDONLY)
    try:
        def request(seed):
            pages = np.random.default_rng(seed).integers(0, PAGES, 32).tolist()
            buf = bytearray(len(pages) * PAGE)
            engine.read_pages(fd, pages, memoryview(buf), PAGE, 8)
            return bytes(buf) == reference(fd, pages)

        with ThreadPoolExecutor(8) as pool:
            assert all(f.result(TIMEOUT) for f in [pool.submit(request, s) for s in range(40)])
        stats = engine.stats()
        assert stats["reads"] == 40 * 32
        assert stats["peak_in_flight"] <= 3  # never more than the device's depth
        assert len([t for t in threading.enumerate() if t.name.startswith("sdm-io-bounded")]) == 3
    finally:
        engine.close()
        os.close(fd)
    assert not [t for t in threading.enumerate() if t.name.startswith("sdm-io-bounded")]


def test_short_reads_are_reported_and_errors_raised(data_file):
    engine = IOEngine("short", 2)
    fd = os.open(data_file, os.O_RDONLY)
    try:
        buf = bytearray(3 * PAGE)
        assert engine.read_pages(fd, [0, PAGES, PAGES + 5], memoryview(buf), PAGE, 2) == [1, 2]
        closed = os.open(data_file, os.O_RDONLY)
        os.close(closed)
        with pytest.raises(OSError):
            engine.read_pages(closed, [0, 1, 2], memoryview(buf), PAGE, 2)
        # the engine still serves after a failure
        assert engine.read_pages(fd, [1], memoryview(buf), PAGE, 1) == []
    finally:
        engine.close()
        os.close(fd)


def test_a_read_that_fails_once_and_then_succeeds_is_whole(data_file, monkeypatch):
    """A transient failure of the nogil loop (say EINTR) is read again, and that page is
    neither short nor an error."""
    real = io_engine.pread_pages

    def flaky(fd, pages, first, stride, base, page_bytes, got):
        real(fd, pages, first, stride, base, page_bytes, got)
        got[first] = -1  # every job's first page "failed"

    monkeypatch.setattr(io_engine, "pread_pages", flaky)
    engine = IOEngine("flaky", 2)
    fd = os.open(data_file, os.O_RDONLY)
    try:
        pages = [5, 9, 1, 40]
        buf = bytearray(len(pages) * PAGE)
        assert engine.read_pages(fd, pages, memoryview(buf), PAGE, 2) == []
        assert bytes(buf) == reference(fd, pages)
    finally:
        engine.close()
        os.close(fd)


def test_bad_depth_is_refused():
    for depth in (0, -1, 10_000, 2.5, True):
        with pytest.raises(ConfigError, match="depth"):
            IOEngine("bad", depth)


def test_a_direct_store_reads_through_one_engine_per_device(tmp_path):
    spec = sdm.TableSpec("t", 20_000, 32, "fp32")
    rows = np.random.default_rng(1).standard_normal((spec.num_rows, spec.dim)).astype(np.float32)
    with sdm.Store.create(tmp_path / "s", [spec]) as store:
        store.write_table("t", rows)
    with sdm.Store.open(tmp_path / "s", config=sdm.store.config.with_io_mode("sdm-nand", "direct")) as store:
        rng = np.random.default_rng(2)
        batches = [{"t": (rng.integers(0, spec.num_rows, 64), np.arange(0, 65, 8))} for _ in range(24)]
        store.embedding_bags(batches[0])  # compiles the kernels (a cold cache takes minutes)
        with ThreadPoolExecutor(6) as pool:
            results = [f.result(TIMEOUT) for f in [pool.submit(store.embedding_bags, b) for b in batches]]
        devices = store.stats()["devices"]
    for batch, got in zip(batches, results):
        ids, offsets = batch["t"]
        np.testing.assert_allclose(got["t"], sdm.embedding_bag(rows, ids, offsets), rtol=1e-6, atol=1e-5)
    engine = devices["nand-p4500"]["engine"]
    assert engine["reads"] > 0 and 1 <= engine["peak_in_flight"] <= engine["depth"]

"""The IO engine of ``direct`` mode: one device's reads, bounded, shared by every request.

For both ways of submitting (kernel AIO from the caller, reader threads): pages read through
it equal plain ``os.pread`` of the same pages (the reference), for any page list and queue
depth; many requests at once never have more than ``depth`` reads (jobs) at the device, and
do overlap; a short read is reported, a failed read raised, and no caller waits for ever
(every wait here has a timeout).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sdm
from sdm.errors import ConfigError
from sdm.tiers import aio, io_engine
from sdm.tiers.io_engine import SUBMISSIONS, IOEngine

PAGE = 4096
PAGES = 64
TIMEOUT = 30
# Kernel AIO is tested wherever the machine has it (x86-64 Linux); the CI machines do.
KINDS = [pytest.param(k, marks=pytest.mark.skipif(k == "aio" and not aio.aio_supported(), reason="no kernel AIO"))
         for k in SUBMISSIONS]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("engine") / "pages.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, PAGES * PAGE, dtype=np.uint8).tobytes())
    return str(path)


@pytest.fixture(scope="module", params=KINDS)
def engine(request):
    e = IOEngine("test", 4, request.param)
    yield e
    e.close()


@contextlib.contextmanager
def serving(data_file, name, depth, submission):
    """``(engine, fd)``: an IO engine and the data file open to read, both closed after."""
    engine = IOEngine(name, depth, submission)
    fd = os.open(data_file, os.O_RDONLY)
    try:
        yield engine, fd
    finally:
        engine.close()
        os.close(fd)


def until(predicate) -> None:
    """Wait for ``predicate()`` to hold, failing after TIMEOUT seconds rather than hanging."""
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


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


@pytest.mark.parametrize("submission", KINDS)
def test_direct_reads_into_an_aligned_buffer(data_file, submission):
    try:
        fd = os.open(data_file, os.O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        pytest.skip(f"no O_DIRECT here: {exc}")
    engine = IOEngine("direct", 3, submission)
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


@pytest.mark.parametrize("submission", KINDS)
def test_many_requests_share_a_bounded_depth(data_file, submission):
    with serving(data_file, "bounded", 3, submission) as (engine, fd):
        def request(seed):
            pages = np.random.default_rng(seed).integers(0, PAGES, 32).tolist()
            buf = bytearray(len(pages) * PAGE)
            engine.read_pages(fd, pages, memoryview(buf), PAGE, 8)
            return bytes(buf) == reference(fd, pages)

        with ThreadPoolExecutor(8) as pool:
            assert all(f.result(TIMEOUT) for f in [pool.submit(request, s) for s in range(40)])
        stats = engine.stats()
        assert stats["reads"] == 40 * 32 and stats["read_cpu_ns"] > 0
        assert 1 <= stats["peak_in_flight"] <= 3  # never more than the device's depth
        readers = len([t for t in threading.enumerate() if t.name.startswith("sdm-io-bounded")])
        assert readers == (3 if submission == "threads" else 0)  # aio: the callers read
    assert not [t for t in threading.enumerate() if t.name.startswith("sdm-io-bounded")]


@pytest.mark.parametrize("submission", KINDS)
def test_short_reads_are_reported_and_errors_raised(data_file, submission):
    with serving(data_file, "short", 2, submission) as (engine, fd):
        buf = bytearray(3 * PAGE)
        assert engine.read_pages(fd, [0, PAGES, PAGES + 5], memoryview(buf), PAGE, 2) == [1, 2]
        closed = os.open(data_file, os.O_RDONLY)
        os.close(closed)
        with pytest.raises(OSError) as failed:
            engine.read_pages(closed, [0, 1, 2], memoryview(buf), PAGE, 2)
        assert failed.value.errno == 9  # EBADF
        # the engine still serves after a failure
        assert engine.read_pages(fd, [1], memoryview(buf), PAGE, 1) == []


@pytest.mark.parametrize("submission", KINDS)
def test_a_read_that_fails_once_and_then_succeeds_is_whole(data_file, monkeypatch, submission):
    """A transient failure of the nogil loop (say EINTR) is read again, and that page is
    neither short nor an error."""
    if submission == "threads":
        real = io_engine.pread_pages

        def flaky(fd, pages, first, stride, base, page_bytes, got):
            real(fd, pages, first, stride, base, page_bytes, got)
            got[first] = -1  # every job's first page "failed"

        monkeypatch.setattr(io_engine, "pread_pages", flaky)
    else:
        real = aio.AioContext.read

        def flaky(self, fd, pages, base, page_bytes, depth, got):
            real(self, fd, pages, base, page_bytes, depth, got)
            got[::2] = -4  # EINTR

        monkeypatch.setattr(aio.AioContext, "read", flaky)
    with serving(data_file, "flaky", 2, submission) as (engine, fd):
        pages = [5, 9, 1, 40]
        buf = bytearray(len(pages) * PAGE)
        assert engine.read_pages(fd, pages, memoryview(buf), PAGE, 2) == []
        assert bytes(buf) == reference(fd, pages)


def test_bad_depth_and_submission_are_refused(monkeypatch):
    for depth in (0, -1, 10_000, 2.5, True):
        with pytest.raises(ConfigError, match="depth"):
            IOEngine("bad", depth)
    for submission in ("uring", "", 1):
        with pytest.raises(ConfigError, match="submission"):
            IOEngine("bad", 2, submission)
    monkeypatch.setattr(io_engine, "aio_supported", lambda: False)
    with pytest.raises(ConfigError, match="no kernel AIO"):
        IOEngine("bad", 2, "aio")
    assert IOEngine("fallback", 2).submission == "threads"


@pytest.mark.skipif(not aio.aio_supported(), reason="no kernel AIO")
@settings(max_examples=40, deadline=None)
@given(pages=st.lists(st.integers(0, PAGES + 3), min_size=1, max_size=60), depth=st.integers(1, 9))
def test_the_aio_loop_equals_plain_preads_at_any_depth(data_file, pages, depth):
    """The loop itself, with a context larger than the depth it is given: every page lands
    at its position, past the end of the file reads 0 bytes, and the context is reusable."""
    fd = os.open(data_file, os.O_RDONLY)
    ctx = aio.AioContext(12)
    try:
        buf = np.zeros(len(pages) * PAGE, dtype=np.uint8)
        got = np.full(len(pages), -99, dtype=np.int64)
        for _ in range(2):
            ctx.read(fd, np.array(pages, dtype=np.int64), buf.ctypes.data, PAGE, depth, got)
            assert got.tolist() == [PAGE if p < PAGES else 0 for p in pages]
            assert buf.tobytes() == b"".join(os.pread(fd, PAGE, p * PAGE).ljust(PAGE, b"\0") for p in pages)
    finally:
        ctx.close()
        os.close(fd)
    assert ctx.closed


@pytest.mark.skipif(not aio.aio_supported(), reason="no kernel AIO")
@pytest.mark.parametrize("depth", [1, 3, 16])
def test_the_aio_loop_reads_o_direct_pages_in_flight_together(data_file, depth):
    """O_DIRECT, so the reads really are in flight at once and complete in any order (a
    buffered file is read inside io_submit): 300 pages, repeats included, each where it
    belongs; a depth below 1 is refused."""
    try:
        fd = os.open(data_file, os.O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        pytest.skip(f"no O_DIRECT here: {exc}")
    plain = os.open(data_file, os.O_RDONLY)
    pages = np.random.default_rng(depth).integers(0, PAGES, 300)
    buf = mmap.mmap(-1, len(pages) * PAGE)  # page aligned, as O_DIRECT needs
    view = np.frombuffer(buf, dtype=np.uint8)
    ctx = aio.AioContext(16)
    try:
        got = np.zeros(len(pages), dtype=np.int64)
        ctx.read(fd, pages, view.ctypes.data, PAGE, depth, got)
        assert (got == PAGE).all()
        assert view.tobytes() == reference(plain, pages.tolist())
        with pytest.raises(ValueError, match="depth >= 1"):
            ctx.read(fd, pages, view.ctypes.data, PAGE, 0, got)
    finally:
        ctx.close()
        del view
        buf.close()
        os.close(fd)
        os.close(plain)


@pytest.mark.skipif(not aio.aio_supported(), reason="no kernel AIO")
def test_closing_an_aio_engine_waits_for_its_readers_and_refuses_more(data_file):
    """Callers queued for room when the engine closes get a clear error, not a hang; the
    reads already running finish first."""
    engine = IOEngine("closing", 2, "aio")
    fd = os.open(data_file, os.O_RDONLY)
    started, release = threading.Event(), threading.Event()
    real = aio.AioContext.read

    def slow(self, *args):
        started.set()
        release.wait(TIMEOUT)
        real(self, *args)

    try:
        aio.AioContext.read = slow
        with ThreadPoolExecutor(3) as pool:
            first = pool.submit(engine.read_pages, fd, [1, 2], memoryview(bytearray(2 * PAGE)), PAGE, 2)
            assert started.wait(TIMEOUT)
            queued = pool.submit(engine.read_pages, fd, [3], memoryview(bytearray(PAGE)), PAGE, 1)
            until(lambda: len(engine._waiting) == 1)  # in line for room when the engine closes
            closing = pool.submit(engine.close)
            with pytest.raises(ConfigError, match="closed"):
                queued.result(TIMEOUT)
            until(lambda: engine._closed)
            assert not closing.done()  # the first caller still reads
            release.set()
            assert first.result(TIMEOUT) == []
            closing.result(TIMEOUT)
        with pytest.raises(ConfigError, match="closed"):
            engine.read_pages(fd, [1], memoryview(bytearray(PAGE)), PAGE, 1)
    finally:
        aio.AioContext.read = real
        release.set()
        os.close(fd)


@pytest.mark.parametrize("submission", KINDS)
def test_a_direct_store_reads_through_one_engine_per_device(tmp_path, submission):
    spec = sdm.TableSpec("t", 20_000, 32, "fp32")
    rows = np.random.default_rng(1).standard_normal((spec.num_rows, spec.dim)).astype(np.float32)
    with sdm.Store.create(tmp_path / "s", [spec]) as store:
        store.write_table("t", rows)
    config = sdm.store.config.with_options("sdm-nand", io_mode="direct", io_submission=submission)
    with sdm.Store.open(tmp_path / "s", config=config) as store:
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
    assert engine["submission"] == submission and engine["read_cpu_ns"] > 0
    assert engine["reads"] > 0 and 1 <= engine["peak_in_flight"] <= engine["depth"]


@pytest.mark.skipif(not aio.aio_supported(), reason="no kernel AIO")
def test_a_context_the_kernel_refuses_is_a_clear_error(monkeypatch):
    """When the system's AIO events are all taken, io_setup's EAGAIN names the limit and the
    way out, and no context is left behind."""
    real = aio._syscall

    def full(number, *args):
        if number == aio._IO_SETUP:
            ctypes.set_errno(11)
            return -1
        return real(number, *args)

    monkeypatch.setattr(aio, "_syscall", full)
    with pytest.raises(OSError, match="fs.aio-max-nr.*io_submission = 'threads'") as refused:
        aio.AioContext(4)
    assert refused.value.errno == 11


@pytest.mark.skipif(not aio.aio_supported(), reason="no kernel AIO")
def test_aio_room_is_granted_first_come_first_served(data_file, monkeypatch):
    """A caller that asked for room first reads first, even when a later, smaller one would
    fit sooner: the device's queue is FIFO, as the reader threads' job queue is, and a
    request is never overtaken for ever (a random wake-up order would stretch the tail)."""
    engine = IOEngine("fifo", 4, "aio")
    fd = os.open(data_file, os.O_RDONLY)
    order, gates = [], {n: threading.Event() for n in (3, 4, 1)}
    real = aio.AioContext.read

    def gated(self, fd, pages, base, page_bytes, depth, got):
        order.append(len(pages))
        assert gates[len(pages)].wait(TIMEOUT)
        real(self, fd, pages, base, page_bytes, depth, got)

    monkeypatch.setattr(aio.AioContext, "read", gated)

    def read(n):
        return engine.read_pages(fd, list(range(n)), memoryview(bytearray(n * PAGE)), PAGE, n)

    try:
        with ThreadPoolExecutor(3) as pool:
            holder = pool.submit(read, 3)  # holds 3 of the 4
            until(lambda: order == [3])
            big = pool.submit(read, 4)  # needs all 4: waits for the holder
            until(lambda: len(engine._waiting) == 1)
            small = pool.submit(read, 1)  # 1 is free, but the big one asked first
            until(lambda: len(engine._waiting) == 2)
            assert order == [3]
            gates[3].set()
            gates[4].set()
            gates[1].set()
            assert [f.result(TIMEOUT) for f in (holder, big, small)] == [[], [], []]
        assert order == [3, 4, 1]
        assert engine.stats()["peak_in_flight"] == 4
    finally:
        for g in gates.values():
            g.set()
        engine.close()
        os.close(fd)


@pytest.mark.parametrize("submission", KINDS)
def test_a_closed_engine_refuses_reads(data_file, submission):
    """Reads after close() get a clear error: none is queued where no reader would take it."""
    with serving(data_file, "closed", 2, submission) as (engine, fd):
        assert engine.read_pages(fd, [1, 2], memoryview(bytearray(2 * PAGE)), PAGE, 2) == []
        engine.close()
        with pytest.raises(ConfigError, match="closed"):
            engine.read_pages(fd, [1], memoryview(bytearray(PAGE)), PAGE, 1)

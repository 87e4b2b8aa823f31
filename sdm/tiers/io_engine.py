"""One device's real reads in flight, shared by every request: the IO engine of ``direct`` mode.

A serving host keeps many requests' reads at a device at once, up to a bound the device is
driven at (an NVMe queue's depth). :class:`IOEngine` is that bound for one device: ``depth``
reader threads, started once, take read jobs first come first served from one queue, so at
most ``depth`` reads are outstanding on the device whatever the number of requests, and no
request starts threads of its own. A job's reads run in one Numba loop over libc's ``pread``
with the GIL released (:func:`pread_pages`), so the readers wait on the device in parallel
while requests run Python, and a read costs no Python: per 4 KiB O_DIRECT read on the AMD EPYC
VM (Zen 4), 7.6-9.1 us of CPU (mostly the kernel's) against 10-16 us with an ``os.preadv``
call per read under the GIL, and 60-77K reads/s against 44-64K at 16 jobs (bench/RESULTS.md).

A request splits its pages into at most its own queue depth of jobs (the tier's
``queue_depth``: how many reads one request may have outstanding) and waits for all of them.
"""

from __future__ import annotations

import ctypes
import os
import queue
import threading

import numpy as np

from sdm.errors import ConfigError
from sdm.kernels.jit import jit
from sdm.validate import check_int
from sdm.tiers.slots import give_up

__all__ = ["IOEngine", "MAX_ENGINE_DEPTH", "pread_pages"]

#: The most reads one engine keeps in flight (reader threads it starts): a tier's largest
#: queue depth.
MAX_ENGINE_DEPTH = 1024

_libc = ctypes.CDLL(None, use_errno=True)
_pread = _libc.pread
_pread.restype = ctypes.c_ssize_t
# The buffer goes as an address (an integer): Numba passes integers to ctypes functions, and
# on every ABI sdm runs on an address is passed as a size_t is.
_pread.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int64]


# Not cached: Numba cannot cache a function that calls through a ctypes pointer. It compiles in
# about 0.2 s, once per process, at the first direct read.
@jit(cache=False)
def pread_pages(fd, pages, first, stride, base, page_bytes, got):
    """``got[j]`` = what ``pread`` returned reading page ``pages[j]`` of ``fd`` into address
    ``base + j * page_bytes``, for ``j`` in ``first, first + stride, ...`` (``pages``, ``got``:
    ``(n,)`` int64): ``page_bytes``, fewer at the end of the file, or -1 on an error (the
    caller reads that page again to learn which)."""
    for j in range(first, pages.shape[0], stride):
        got[j] = _pread(fd, base + j * page_bytes, page_bytes, pages[j] * page_bytes)


class IOEngine:
    """``depth`` reads at a time on one device, shared by every caller (thread-safe).

    Args:
        name: the device's name (threads are named after it).
        depth: reads outstanding at most, in ``[1, MAX_ENGINE_DEPTH]``.
    """

    def __init__(self, name: str, depth: int):
        self.name = name
        self.depth = check_int(depth, f"IO engine {name!r} depth", lo=1, hi=MAX_ENGINE_DEPTH, error=ConfigError)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._reads = 0
        self._in_flight = 0
        self._peak = 0
        self._closed = False

    def read_pages(self, fd: int, pages: list[int], view: memoryview, page_bytes: int, jobs: int) -> list[int]:
        """Read page ``pages[j]`` of ``fd`` (``page_bytes`` each, at ``pages[j] * page_bytes``)
        into ``view[j * page_bytes:][:page_bytes]`` for every ``j``, as at most ``jobs``
        concurrent jobs; returns when all are done.

        Returns:
            The positions ``j`` whose read came back short (the file ends before them).

        Raises:
            OSError: a read failed (the first error of the jobs, raised once all finished).
        """
        n = len(pages)
        if not n:
            return []
        pages = np.ascontiguousarray(pages, dtype=np.int64)
        buffer = np.frombuffer(view, dtype=np.uint8)  # holds the caller's buffer until the jobs end
        if buffer.shape[0] < n * page_bytes or not buffer.flags.writeable:
            raise ValueError(f"read_pages needs a writable buffer of {n * page_bytes} bytes, "
                             f"got {buffer.shape[0]}")
        jobs = max(1, min(jobs, n))
        batch = _Batch(jobs)
        got = np.empty(n, dtype=np.int64)
        self._start()
        for first in range(jobs):  # strided: each job's pages spread over the whole batch
            self._jobs.put((fd, pages, first, jobs, buffer, page_bytes, got, batch))
        return batch.wait()

    def _start(self) -> None:
        if self._threads:
            return
        with self._lock:
            if self._closed:
                raise ConfigError(f"IO engine {self.name!r} is closed")
            while len(self._threads) < self.depth:
                t = threading.Thread(target=self._serve, name=f"sdm-io-{self.name}-{len(self._threads)}",
                                     daemon=True)
                t.start()
                self._threads.append(t)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            batch, short, error = job[-1], [], None
            with self._lock:
                self._in_flight += 1
                self._peak = max(self._peak, self._in_flight)
            try:
                short, error = self._run(*job[:-1])
            finally:  # a job always finishes, so no caller waits for ever
                del job  # its views of the caller's buffer go first: the caller may close it
                with self._lock:
                    self._in_flight -= 1
            batch.finish(short, error)

    def _run(self, fd, pages, first, stride, buffer, page_bytes, got) -> tuple[list[int], Exception | None]:
        """One job's reads: (positions read short, the first error or None)."""
        pread_pages(fd, pages, first, stride, buffer.ctypes.data, page_bytes, got)
        mine = got[first::stride]  # a view: the re-reads below update it
        with self._lock:
            self._reads += mine.shape[0]
        error = None
        for k in np.flatnonzero(mine < 0).tolist():  # read again to raise the error with its errno
            j = first + k * stride
            try:
                got[j] = os.preadv(fd, [memoryview(buffer[j * page_bytes:(j + 1) * page_bytes])],
                                   int(pages[j]) * page_bytes)
            except Exception as exc:  # noqa: BLE001 - handed to the caller, never lost
                error = exc
                break
        if error is not None:
            return [], error
        return (first + np.flatnonzero(mine != page_bytes) * stride).tolist(), None

    def stats(self) -> dict:
        """``depth``, ``reads`` (pages read so far) and ``peak_in_flight`` (most jobs at once)."""
        with self._lock:
            return {"depth": self.depth, "reads": self._reads, "peak_in_flight": self._peak}

    def close(self) -> None:
        """Stop the reader threads once the jobs queued before are done."""
        with self._lock:
            self._closed = True
            threads, self._threads = self._threads, []
        for _ in threads:
            self._jobs.put(None)
        for t in threads:
            t.join()


class _Batch:
    """One caller's jobs: counts them down; the caller waits for the last."""

    __slots__ = ("_left", "_done", "_short", "_error", "_lock")

    def __init__(self, jobs: int):
        self._left = jobs
        self._done = threading.Event()
        self._short: list[int] = []
        self._error: Exception | None = None
        self._lock = threading.Lock()

    def finish(self, short: list[int], error: Exception | None) -> None:
        with self._lock:
            self._short += short
            if error is not None and self._error is None:
                self._error = error
            self._left -= 1
            last = self._left == 0
        if last:
            self._done.set()

    def wait(self) -> list[int]:
        if not self._done.is_set():
            give_up()  # the request waits for the disk: its core is free for others
        self._done.wait()
        if self._error is not None:
            raise self._error
        return sorted(self._short)

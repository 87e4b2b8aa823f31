"""One device's real reads in flight, shared by every request: the IO engine of ``direct`` mode.

A serving host keeps many requests' reads at a device at once, up to a bound the device is
driven at (an NVMe queue's depth). :class:`IOEngine` is that bound for one device: ``depth``
reader threads, started once, take read jobs first come first served from one queue, so at
most ``depth`` reads are outstanding on the device whatever the number of requests, and no
request starts threads of its own. ``os.preadv`` releases the GIL, so the readers wait on
the device in parallel while requests run Python.

A request splits its pages into at most its own queue depth of jobs (the tier's
``queue_depth``: how many reads one request may have outstanding) and waits for all of them.
"""

from __future__ import annotations

import os
import queue
import threading

from sdm.errors import ConfigError
from sdm.validate import check_int

__all__ = ["IOEngine", "MAX_ENGINE_DEPTH"]

#: The most reads one engine keeps in flight (reader threads it starts): a tier's largest
#: queue depth.
MAX_ENGINE_DEPTH = 1024


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
        jobs = max(1, min(jobs, n))
        batch = _Batch(jobs)
        self._start()
        for first in range(jobs):  # strided: each job's pages spread over the whole batch
            self._jobs.put((fd, pages, first, jobs, view, page_bytes, batch))
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

    def _run(self, fd, pages, first, stride, view, page_bytes) -> tuple[list[int], Exception | None]:
        """One job's reads: (positions read short, the error that stopped it or None)."""
        short: list[int] = []
        try:
            for j in range(first, len(pages), stride):
                got = os.preadv(fd, [view[j * page_bytes:(j + 1) * page_bytes]], pages[j] * page_bytes)
                if got != page_bytes:
                    short.append(j)
                with self._lock:
                    self._reads += 1
        except Exception as exc:  # noqa: BLE001 - handed to the caller, never lost
            return short, exc
        return short, None

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
        self._done.wait()
        if self._error is not None:
            raise self._error
        return sorted(self._short)

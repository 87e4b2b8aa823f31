"""One device's real reads in flight, shared by every request: the IO engine of ``direct`` mode.

A serving host keeps many requests' reads at a device at once, up to a bound the device is
driven at (an NVMe queue's depth). :class:`IOEngine` is that bound for one device: at most
``depth`` reads are outstanding on the device whatever the number of requests, and no
request starts threads of its own. A request reads its pages with at most its own queue
depth in flight (the tier's ``queue_depth``) and returns when all are done. Two ways to
submit them:

* ``aio`` (the default where the machine has it, :func:`sdm.tiers.aio.aio_supported`): the
  request's own thread submits its reads and reaps their completions in batches through
  kernel AIO, in one Numba loop with the GIL released. Per 4 KiB O_DIRECT read on the AMD
  EPYC VM (Zen 4): 2.8-8.0 us of CPU at queue depth 4-55, 0.35-0.60x reader threads', at
  the same reads per second (``bench/bench_io_engine.py``, bench/RESULTS.md).
* ``threads``: ``depth`` reader threads, started once, take read jobs first come first
  served from one queue; a request splits its pages into at most its queue depth of jobs,
  and a job's reads run in one Numba loop over libc's ``pread`` with the GIL released
  (:func:`pread_pages`). Per read on the same VM: 7.6-9.1 us of CPU at 16 jobs in a bare
  loop, 10-18 us with the hand-overs and wake-ups of serving.

Either way the engine counts its reads and the CPU they cost the threads that ran them
(:meth:`IOEngine.stats`), which is what the host model charges a direct read.
"""

from __future__ import annotations

import collections
import ctypes
import os
import queue
import threading
import time
import weakref

import numpy as np

from sdm.errors import ConfigError
from sdm.kernels.jit import jit
from sdm.tiers.aio import AioContext, aio_supported
from sdm.tiers.slots import give_up
from sdm.validate import check_choice, check_int

__all__ = ["IOEngine", "MAX_ENGINE_DEPTH", "SUBMISSIONS", "default_submission", "pread_pages"]

#: How an engine submits reads: ``aio`` (kernel AIO, from the requesting thread) or
#: ``threads`` (reader threads, each a blocking ``pread`` at a time).
SUBMISSIONS = ("aio", "threads")


def default_submission() -> str:
    """``aio`` where this machine supports it, else ``threads``."""
    return "aio" if aio_supported() else "threads"

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
        submission: one of :data:`SUBMISSIONS`; None: :func:`default_submission`. ``aio``
            where the machine has no kernel AIO raises ConfigError.
    """

    def __init__(self, name: str, depth: int, submission: str | None = None):
        self.name = name
        self.depth = check_int(depth, f"IO engine {name!r} depth", lo=1, hi=MAX_ENGINE_DEPTH, error=ConfigError)
        if submission is None:
            submission = default_submission()
        self.submission = check_choice(submission, f"IO engine {name!r} submission", SUBMISSIONS, error=ConfigError)
        if submission == "aio" and not aio_supported():
            raise ConfigError(f"IO engine {name!r}: this machine has no kernel AIO for sdm "
                              f"(x86-64 Linux with io_setup allowed); use submission 'threads'")
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        # aio: room for reads, granted first come first served (as the reader threads' job
        # queue serves), so a request never waits behind later ones
        self._free = self.depth
        self._waiting: collections.deque[_Turn] = collections.deque()
        self._idle = threading.Condition(self._lock)  # close() waits on it for running reads
        self._local = threading.local()  # aio: each calling thread's context
        self._contexts: weakref.WeakSet = weakref.WeakSet()
        self._reads = 0
        self._read_cpu_ns = 0
        self._in_flight = 0
        self._peak = 0
        self._closed = False

    def read_pages(self, fd: int, pages: list[int], view: memoryview, page_bytes: int, jobs: int) -> list[int]:
        """Read page ``pages[j]`` of ``fd`` (``page_bytes`` each, at ``pages[j] * page_bytes``)
        into ``view[j * page_bytes:][:page_bytes]`` for every ``j``, at most ``jobs`` reads
        (``aio``) or jobs (``threads``) at once; returns when all are done.

        Returns:
            The positions ``j`` whose read came back short (the file ends before them).

        Raises:
            OSError: a read failed (the first error, raised once no read is in flight).
        """
        n = len(pages)
        if not n:
            return []
        pages = np.ascontiguousarray(pages, dtype=np.int64)
        buffer = np.frombuffer(view, dtype=np.uint8)  # holds the caller's buffer until the reads end
        if buffer.shape[0] < n * page_bytes or not buffer.flags.writeable:
            raise ValueError(f"read_pages needs a writable buffer of {n * page_bytes} bytes, "
                             f"got {buffer.shape[0]}")
        jobs = max(1, min(jobs, n, self.depth))
        got = np.empty(n, dtype=np.int64)
        if self.submission == "aio":
            return self._read_aio(fd, pages, buffer, page_bytes, jobs, got)
        batch = _Batch(jobs)
        # Queued under the lock close() takes first: the jobs go ahead of its stop sentinels,
        # or the engine is found closed, never behind them where no reader would take them.
        with self._lock:
            self._check_open()
            self._start()
            for first in range(jobs):  # strided: each job's pages spread over the whole batch
                self._jobs.put((fd, pages, first, jobs, buffer, page_bytes, got, batch))
        return batch.wait()

    def _read_aio(self, fd, pages, buffer, page_bytes, depth, got) -> list[int]:
        give_up()  # the request waits for the disk: its core is free for others
        ctx = self._context()  # a new thread's context is set up before it holds room
        taken, cpu, done = 0, 0, False
        try:
            self._take(depth)
            taken = depth
            t0 = time.thread_time_ns()
            try:
                ctx.read(fd, pages, buffer.ctypes.data, page_bytes, depth, got)
                done = True
            finally:
                cpu = time.thread_time_ns() - t0
        finally:  # the reads' room goes back however they ended
            with self._lock:
                self._reads += pages.shape[0] if done else 0
                self._read_cpu_ns += cpu
                if taken:
                    self._give(taken)
        # pages a failed io_submit left unread (-1) and reads that failed, read again
        error = _read_again(fd, pages, buffer, page_bytes, got, np.flatnonzero(got < 0))
        if error is not None:
            raise error
        return np.flatnonzero(got != page_bytes).tolist()

    def _take(self, n: int) -> None:
        """Room for ``n`` reads, after every caller that asked before (ConfigError if the
        engine closes first)."""
        with self._lock:
            self._check_open()
            if not self._waiting and self._free >= n:
                self._free -= n
                self._peak = max(self._peak, self.depth - self._free)
                return
            turn = _Turn(n)
            self._waiting.append(turn)
        try:
            turn.event.wait()
        except BaseException:  # interrupted: leave the queue, or hand back what was granted
            with self._lock:
                if turn in self._waiting:
                    self._waiting.remove(turn)
                    self._give(0)  # the next in line may fit now
                elif turn.granted:
                    self._give(n)
            raise
        if not turn.granted:
            raise ConfigError(f"IO engine {self.name!r} is closed")

    def _give(self, n: int) -> None:
        """Return room for ``n`` reads and grant the callers in line that now fit, in order
        (the lock held)."""
        self._free += n
        while self._waiting and self._free >= self._waiting[0].n:
            turn = self._waiting.popleft()
            self._free -= turn.n
            turn.granted = True
            turn.event.set()
        self._peak = max(self._peak, self.depth - self._free)
        if self._free == self.depth:
            self._idle.notify_all()

    def _context(self) -> AioContext:
        self._check_open()
        ctx = getattr(self._local, "ctx", None)
        if ctx is None or ctx.closed:
            ctx = AioContext(self.depth)
            self._local.ctx = ctx  # destroyed with its thread, or by close()
            with self._lock:
                self._contexts.add(ctx)
        return ctx

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError(f"IO engine {self.name!r} is closed")

    def _start(self) -> None:
        """Start the reader threads if they are not running (the lock held)."""
        while len(self._threads) < self.depth:
            t = threading.Thread(target=self._serve, name=f"sdm-io-{self.name}-{len(self._threads)}", daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self) -> None:
        cpu = time.thread_time_ns()  # a job's CPU includes this thread's wake-up for it
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
                now = time.thread_time_ns()
                with self._lock:
                    self._in_flight -= 1
                    self._read_cpu_ns += now - cpu
                cpu = now
            batch.finish(short, error)

    def _run(self, fd, pages, first, stride, buffer, page_bytes, got) -> tuple[list[int], Exception | None]:
        """One job's reads: (positions read short, the first error or None)."""
        pread_pages(fd, pages, first, stride, buffer.ctypes.data, page_bytes, got)
        mine = got[first::stride]  # a view: the re-reads below update it
        with self._lock:
            self._reads += mine.shape[0]
        error = _read_again(fd, pages, buffer, page_bytes, got, first + np.flatnonzero(mine < 0) * stride)
        if error is not None:
            return [], error
        return (first + np.flatnonzero(mine != page_bytes) * stride).tolist(), None

    def stats(self) -> dict:
        """``depth``, ``submission``, ``reads`` (pages read so far), ``read_cpu_ns`` (the CPU
        time the threads that read them spent on it: the requests' own with ``aio``, the
        reader threads' with ``threads``) and ``peak_in_flight`` (most reads at once with
        ``aio``, most jobs with ``threads``)."""
        with self._lock:
            return {"depth": self.depth, "submission": self.submission, "reads": self._reads,
                    "read_cpu_ns": self._read_cpu_ns, "peak_in_flight": self._peak}

    def close(self) -> None:
        """Stop taking reads; return once the reads started before are done."""
        with self._lock:
            self._closed = True
            for turn in self._waiting:  # callers in line: refused (granted stays False)
                turn.event.set()
            self._waiting.clear()
            while self._free < self.depth:  # aio reads still running
                self._idle.wait()
            threads, self._threads = self._threads, []
            contexts = list(self._contexts)
        for _ in threads:
            self._jobs.put(None)
        for t in threads:
            t.join()
        for ctx in contexts:
            ctx.close()


def _read_again(fd, pages, buffer, page_bytes, got, positions) -> Exception | None:
    """Read the failed ``positions`` again with ``os.preadv`` (updating ``got``): None if all
    succeed this time (a transient failure), else the first error, with its errno."""
    for j in positions.tolist():
        try:
            got[j] = os.preadv(fd, [memoryview(buffer[j * page_bytes:(j + 1) * page_bytes])],
                               int(pages[j]) * page_bytes)
        except Exception as exc:  # noqa: BLE001 - handed to the caller, never lost
            return exc
    return None


class _Turn:
    """A caller in line for room for ``n`` reads."""

    __slots__ = ("n", "event", "granted")

    def __init__(self, n: int):
        self.n = n
        self.event = threading.Event()
        self.granted = False


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

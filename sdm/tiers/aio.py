"""Linux kernel AIO: a request's direct reads submitted and reaped in batches by its own thread.

With reader threads (the IO engine's ``threads`` submission), every 4 KiB O_DIRECT read is a
``pread`` system call on a thread that must then be woken when the device answers, and a
request's reads pass through queues and hand-overs on the way. Kernel AIO (``io_submit`` /
``io_getevents``) submits many reads in one system call and reaps every read that has
completed in one more, so the calling thread keeps its queue depth of reads at the device
with a few system calls per batch of completions and no other thread at all. Measured on the
AMD EPYC VM (Zen 4) by ``bench/bench_io_engine.py``, random 4 KiB reads at queue depth 4-55:
2.8-8.0 us of CPU per read, 0.35-0.60x reader threads', at the same reads per second
(bench/RESULTS.md).

The loop (:func:`aio_read_pages`) is one Numba function with the GIL released, calling the
system calls through libc's ``syscall``. Only x86-64 Linux is supported (its system call
numbers and the ``struct iocb`` layout below); elsewhere, or where the kernel refuses
``io_setup`` (a sandbox's seccomp filter, the system's ``fs.aio-max-nr`` reached),
:func:`aio_supported` is False and the IO engine reads with threads.

Kernel AIO is asynchronous only for O_DIRECT files; on a buffered file ``io_submit`` reads
before it returns, which is still correct.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import sys
import threading

import numpy as np

from sdm.kernels.jit import jit

__all__ = ["AioContext", "aio_read_pages", "aio_supported"]

# x86-64 system call numbers (arch/x86/entry/syscalls/syscall_64.tbl).
_IO_SETUP, _IO_DESTROY, _IO_GETEVENTS, _IO_SUBMIT = 206, 207, 208, 209
_EINTR, _EAGAIN = 4, 11
#: Added to a failed ``io_getevents``'s errno in :func:`aio_read_pages`'s return (errnos are
#: below 4096), to tell it from a failed ``io_submit``.
GETEVENTS_FAILED = 4096
#: Bytes of one ``struct iocb`` (linux/aio_abi.h); it is held as 8 little-endian int64 words:
#: 0 aio_data (the read's position), 1 key and rw_flags (0), 2 opcode (0: IOCB_CMD_PREAD) and
#: reqprio (0) in the low half and aio_fildes in the high half, 3 aio_buf, 4 aio_nbytes,
#: 5 aio_offset, 6 reserved (0), 7 flags and resfd (0).
IOCB_BYTES = 64
#: A ``struct io_event`` as 4 int64 words: data (our position), obj (the iocb's address),
#: res (bytes read, or -errno), res2.
_EVENT_WORDS = 4

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
# glibc's syscall() passes its arguments on in registers whatever their count, so it may be
# called with a fixed five after the number; addresses go as integers, as in pread_pages.
_syscall.argtypes = [ctypes.c_long] * 6
_errno = _libc.__errno_location
_errno.restype = ctypes.POINTER(ctypes.c_int)
_errno.argtypes = []


# Not cached: Numba cannot cache a function that calls through a ctypes pointer (about 0.3 s
# to compile, once per process, at the first direct read).
@jit(cache=False)
def aio_read_pages(ctx, fd, pages, base, page_bytes, depth, got, iocbs, ptrs, events, free):
    """Read page ``pages[j]`` of ``fd`` into address ``base + j * page_bytes`` for every ``j``,
    at most ``depth`` reads in flight on AIO context ``ctx``; ``got[j]`` = the read's result
    (``page_bytes``, fewer at the end of the file, or -errno).

    ``iocbs`` ``(>= depth, 8)`` int64, ``ptrs`` ``(>= depth,)`` int64, ``events``
    ``(>= depth, 4)`` int64 and ``free`` ``(>= depth,)`` int64 are the context's scratch.

    Returns 0; or -errno of a failed ``io_submit`` (nothing more is submitted, and every read
    in flight is reaped before returning, so none lands in ``base`` later; the pages not
    submitted keep their ``got``); or
    ``-GETEVENTS_FAILED - errno`` of a failed ``io_getevents``, returned at once with reads in
    flight: the caller must destroy the context (which waits for them) before it reuses
    their buffer.
    """
    n = pages.shape[0]
    iocb0 = iocbs.ctypes.data
    for s in range(depth):
        free[s] = s
    n_free = depth
    submitted = 0
    done = 0
    in_flight = 0
    error = 0
    while done < submitted or (submitted < n and error == 0):
        k = 0
        while error == 0 and n_free > 0 and submitted + k < n:
            n_free -= 1
            s = free[n_free]
            j = submitted + k
            iocbs[s, 0] = j
            iocbs[s, 1] = 0
            iocbs[s, 2] = fd << 32
            iocbs[s, 3] = base + j * page_bytes
            iocbs[s, 4] = page_bytes
            iocbs[s, 5] = pages[j] * page_bytes
            iocbs[s, 6] = 0
            iocbs[s, 7] = 0
            ptrs[k] = iocb0 + s * IOCB_BYTES
            k += 1
        if k > 0:
            r = _syscall(_IO_SUBMIT, ctx, k, ptrs.ctypes.data, 0, 0)
            if r <= 0:  # none taken: an error, or (never seen) 0, taken as EAGAIN
                err = _errno()[0] if r < 0 else _EAGAIN
                r = 0
                if in_flight == 0 or (err != _EAGAIN and err != _EINTR):
                    error = -err  # EAGAIN with nothing in flight would never clear
            for i in range(r, k):  # the iocbs not taken go back, to be submitted again
                free[n_free] = (ptrs[i] - iocb0) // IOCB_BYTES
                n_free += 1
            submitted += r
            in_flight += r
        if in_flight == 0:
            continue
        r = _syscall(_IO_GETEVENTS, ctx, 1, depth, events.ctypes.data, 0)
        if r < 0:
            err = _errno()[0]
            if err == _EINTR:
                continue
            return -GETEVENTS_FAILED - err
        for e in range(r):
            got[events[e, 0]] = events[e, 2]
            free[n_free] = (events[e, 1] - iocb0) // IOCB_BYTES
            n_free += 1
        in_flight -= r
        done += r
    return error


@functools.cache
def aio_supported() -> bool:
    """Whether this machine runs kernel AIO for sdm: x86-64 Linux, and ``io_setup`` works."""
    if (platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64")
            or sys.maxsize <= 2**32):  # a 32-bit Python on x86-64 has the i386 system calls
        return False
    try:
        AioContext(1).close()
    except OSError:
        return False
    return True


class AioContext:
    """One kernel AIO context of ``depth`` reads, and the scratch :func:`aio_read_pages` needs.

    Used by one thread at a time. :meth:`close` (or garbage collection) destroys it, waiting
    for any read still in flight. Destroying a context waits for the kernel (an RCU grace
    period: milliseconds), so a serving thread keeps its context for its life.
    """

    def __init__(self, depth: int):
        self.id = 0  # set first: a context io_setup refused is still collected cleanly
        self._lock = threading.Lock()
        # kept: at interpreter exit the module's globals may be gone before this is collected
        self._destroy = functools.partial(_syscall, _IO_DESTROY)
        ctx = ctypes.c_ulong(0)
        if _syscall(_IO_SETUP, depth, ctypes.addressof(ctx), 0, 0, 0) < 0:
            err = ctypes.get_errno()
            why = (" (the system's AIO events, sysctl fs.aio-max-nr, are taken: raise it, or set "
                   "the hierarchy's io_submission = 'threads')" if err == _EAGAIN else "")
            raise OSError(err, f"io_setup({depth}): {os.strerror(err)}{why}")
        self.id = ctx.value
        self.depth = depth
        self.iocbs = np.zeros((depth, IOCB_BYTES // 8), dtype=np.int64)
        self.ptrs = np.zeros(depth, dtype=np.int64)
        self.events = np.zeros((depth, _EVENT_WORDS), dtype=np.int64)
        self.free = np.zeros(depth, dtype=np.int64)
        # Compile the loop (once a process) now, with nothing to read, not in a read's time.
        none = np.zeros(0, dtype=np.int64)
        aio_read_pages(self.id, -1, none, 0, 1, 1, none, self.iocbs, self.ptrs, self.events, self.free)

    def read(self, fd: int, pages: np.ndarray, base: int, page_bytes: int, depth: int, got: np.ndarray) -> None:
        """:func:`aio_read_pages` on this context, at most ``depth`` (in ``[1, its own]``)
        in flight. ``got[j]`` ends as the read's result, or -1 for a page a failed
        ``io_submit`` left unread (the caller reads those another way, to learn why).

        Raises:
            ValueError: ``depth`` below 1, or ``got`` not as long as ``pages``.
            OSError: ``io_getevents`` failed; the context is then closed.
        """
        if depth < 1 or got.shape != pages.shape:
            raise ValueError(f"AIO read of {pages.shape[0]} pages needs depth >= 1 and as many results, "
                             f"got depth {depth} and {got.shape[0]}")
        got[:] = -1
        rc = aio_read_pages(self.id, fd, pages, base, page_bytes, min(depth, self.depth), got,
                            self.iocbs, self.ptrs, self.events, self.free)
        if rc <= -GETEVENTS_FAILED:  # reads may still be in flight: destroying waits for them
            self.close()
            err = -rc - GETEVENTS_FAILED
            raise OSError(err, f"io_getevents: {os.strerror(err)}")

    def close(self) -> None:
        with self._lock:
            ctx, self.id = self.id, 0
        if ctx:
            self._destroy(ctx, 0, 0, 0, 0)

    @property
    def closed(self) -> bool:
        return self.id == 0

    def __del__(self):
        self.close()

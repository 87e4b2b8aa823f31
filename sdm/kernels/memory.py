"""Arrays in transparent huge pages, for the DRAM data lookups touch at random.

A lookup reads a random row of a table, a cache slot or a directory entry, in arrays far
larger than what the TLB maps with 4 KiB pages (Zen 4's 3,072 second-level entries map
12 MiB), so besides its cache lines it pays for a page walk. With 2 MiB pages the same
entries map 6 GiB. Measured on a Zen 4 EPYC (bench/RESULTS.md, "Huge pages"): the pooled
gather of a 1M x 64 fp32 table 12-18% faster, the live all-hit path 9-11% faster, the CPU
per request of the ``dram`` hierarchy 18% lower.

Linux backs an anonymous mapping with huge pages where it is ``madvise(MADV_HUGEPAGE)``'d
and transparent huge pages are ``always`` or ``madvise`` (the usual default). numpy's own
allocations were not backed by them on the machines measured, so the arrays sdm owns and
reads at random (a DRAM tier's tables, the DRAM cache's slots, the cache directory and
policy state) are allocated here. Elsewhere, or with THP off, they are plain arrays: same
contents, same results, only the speed differs. ``SDM_HUGE_PAGES=0`` in the environment
turns it off (read at each allocation): a huge page's first touch takes 2 MiB of RAM where a
4 KiB page would take 4 KiB, which a process with many sparse, mostly untouched arrays may
not want.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

__all__ = ["HUGE_PAGE_BYTES", "huge_pages_wanted", "huge_empty", "huge_full", "huge_zeros"]

HUGE_PAGE_BYTES = 2 << 20
# Arrays below one huge page gain nothing: their pages could never be huge.
_MIN_BYTES = HUGE_PAGE_BYTES


def huge_pages_wanted() -> bool:
    """False when ``SDM_HUGE_PAGES=0`` or the platform cannot advise huge pages."""
    return os.environ.get("SDM_HUGE_PAGES", "1") != "0" and hasattr(mmap, "MADV_HUGEPAGE")


def huge_zeros(shape, dtype) -> np.ndarray:
    """A zeroed C-contiguous array of ``shape`` and ``dtype``, in huge pages when it is at
    least one huge page long and they are wanted (:func:`huge_pages_wanted`); else
    ``np.zeros``. Its pages take RAM when first touched, as ``np.zeros``'s do."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dtype.itemsize
    if nbytes < _MIN_BYTES or not huge_pages_wanted():
        return np.zeros(shape, dtype=dtype)
    # anonymous and private: zero-filled on first touch, copy-on-write in a forked worker
    buf = mmap.mmap(-1, -(-nbytes // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES,
                    flags=mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0))
    try:
        buf.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # THP compiled out or refused: a plain mapping serves as well, slower
        pass
    # the array holds the mapping (its base) and unmaps it when the last view goes
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)


def huge_empty(shape, dtype) -> np.ndarray:
    """:func:`huge_zeros` where the caller overwrites what it reads (``np.empty``'s
    contract; the memory happens to be zeros)."""
    return huge_zeros(shape, dtype)


def huge_full(shape, fill, dtype) -> np.ndarray:
    """:func:`huge_zeros` filled with ``fill``."""
    out = huge_zeros(shape, dtype)
    if fill != 0:
        out.fill(fill)
    return out

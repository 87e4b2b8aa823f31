"""Row gather for a tier's batch reads: ``out[i] = table[pos[i]]`` with the rows prefetched.

A cache's misses are read from the tier below as one batch of rows at scattered positions of
a table far larger than the CPU's caches (the mmap tier's SCM row file), each row a DRAM miss
and, outside huge pages, a TLB miss. ``np.take`` reads them one after the other; this loop
fetches the row ``_AHEAD`` positions ahead (each line of a row up to 256 bytes, as the pooled
gather's ``every_line`` variant does) while it copies the current one. Measured on the Zen 4
VM (a ``/tmp`` harness, 4,500 ascending positions of a 500K x 256-byte page-cached row file,
alternated, medians of 40): ``np.take`` 60-84 ns a row, this 36-47 (8, 16 and 32 ahead; 16
the best).
"""

from __future__ import annotations

import numpy as np

from sdm.kernels.bag import _prefetch_bag_row
from sdm.kernels.jit import jit

__all__ = ["take_rows"]

_AHEAD = 16


@jit(_nrt=False)
def _take(table, pos, out):
    n = pos.shape[0]
    rows = table.shape[0]
    nbytes = table.shape[1] * table.itemsize
    for i in range(n):
        if i + _AHEAD < n and 0 <= pos[i + _AHEAD] < rows:
            _prefetch_bag_row(table, pos[i + _AHEAD], nbytes, True)
        p = pos[i]
        if p < 0 or p >= rows:
            return i
        src = table[p]
        dst = out[i]
        for b in range(src.shape[0]):
            dst[b] = src[b]
    return -1


def take_rows(table: np.ndarray, pos: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = table[pos[i]]``, as ``np.take(table, pos, axis=0, out=out)``.

    Args:
        table: ``(n, w)`` array (an mmap'd file's rows included).
        pos: ``(k,)`` int64 row positions.
        out: ``(k, w)`` array of ``table``'s dtype.

    Raises:
        ValueError: ``out`` is not ``(k, w)`` of ``table``'s dtype (the kernel writes unchecked).
        IndexError: a position outside ``[0, n)``, naming it (the rows before it are copied).
    """
    if out.shape != (pos.shape[0], table.shape[1]) or out.dtype != table.dtype:
        raise ValueError(f"out must be {(pos.shape[0], table.shape[1])} {table.dtype}, "
                         f"got {out.shape} {out.dtype}")
    bad = _take(table, pos, out)
    if bad >= 0:
        raise IndexError(f"row position {int(pos[bad])} is out of range for {table.shape[0]} rows")

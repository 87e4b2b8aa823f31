"""How many threads numpy's BLAS uses: one while the host model times a request's MLPs, a
core's share while ``sdm load`` serves requests.

The host simulation runs a request's MLP task on one core, so its cost must be what one core
takes. numpy's OpenBLAS runs a matrix product on every core by default; on a machine whose
cores other jobs share, its threads then wait for each other and a 32 x 512 x 1024 product
took 7.4 ms instead of 0.6 ms on one thread (this 2-core machine, measured while two other
jobs ran). :func:`one_blas_thread` asks numpy's bundled OpenBLAS for one thread (through its
``*_set_num_threads`` entry point, as bench/bench_dlrm.py does) and gives the old count back
afterwards; where that entry point cannot be found it changes nothing and says so.
:func:`blas_threads` sets any count the same way.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import os

import numpy as np

__all__ = ["one_blas_thread", "blas_threads", "blas_threads_settable"]


@functools.lru_cache(maxsize=1)
def _openblas():
    """``(set, get)`` of numpy's bundled OpenBLAS thread count, or None."""
    here = os.path.dirname(np.__file__)
    for path in glob.glob(os.path.join(here, "..", "numpy.libs", "*openblas*.so*")):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("scipy_openblas_{}_num_threads64_", "scipy_openblas_{}_num_threads",
                     "openblas_{}_num_threads64_", "openblas_{}_num_threads"):
            try:
                return getattr(lib, name.format("set")), getattr(lib, name.format("get"))
            except AttributeError:
                continue
    return None


def blas_threads_settable() -> bool:
    """Whether :func:`one_blas_thread` can set numpy's BLAS threads here."""
    return _openblas() is not None


@contextlib.contextmanager
def blas_threads(count: int):
    """Within the block numpy's OpenBLAS uses ``count`` (>= 1) threads; yields whether it
    could be set (see the module)."""
    found = _openblas()
    if found is None:
        yield False
        return
    set_fn, get_fn = found
    before = int(get_fn())
    set_fn(ctypes.c_int(max(1, int(count))))
    try:
        yield True
    finally:
        set_fn(ctypes.c_int(before))


def one_blas_thread():
    """Within the block numpy's OpenBLAS uses one thread (when it can be set; see the module)."""
    return blas_threads(1)

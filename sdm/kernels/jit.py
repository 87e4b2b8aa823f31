"""The one JIT decorator of sdm.

Every kernel is compiled through :func:`jit` so the flags live in one place:

* ``cache=True``: compiled code is kept on disk beside the module (``__pycache__``), so a
  fresh process pays only loading, not compiling. Numba stamps a cache entry with its own
  source file only, so a kernel that inlines a helper from another file (the DRAM cache's
  probe runs the policy kernels and the hash map) would be served stale after an edit to
  that file. sdm's kernels are therefore stamped with a digest of *every* source file of the
  package (:func:`source_digest`, installed as a cache locator for files under ``sdm/``):
  any edit anywhere in sdm, this module's flags included, recompiles every kernel once.
* ``nogil=True``: kernels release the GIL, so a second Python thread runs while one works.
* ``fastmath`` is off by default: sums must match the reference summation order closely.
  Kernels that reassociate on purpose (vectorized pooling) ask for it explicitly.

Threads: parallel kernels run on Numba's OpenMP layer. libgomp's threads spin-wait between
parallel regions by default; on a machine whose cores are shared with other jobs both threads
of a call can land on one core and the call then waits for scheduler ticks (several ms per
call; bench/RESULTS.md has the measurement). Importing sdm therefore
sets ``OMP_WAIT_POLICY=passive`` unless the environment already sets it; it takes effect when
the OpenMP runtime loads (Numba's, at the first parallel call), so set it yourself, to
``active`` on a dedicated machine, before importing sdm to choose otherwise.

Kernels stay valid plain Python, so ``NUMBA_DISABLE_JIT=1`` runs them interpreted (for
coverage and debugging).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before numba loads libgomp; see above

import functools  # noqa: E402
import hashlib  # noqa: E402
from pathlib import Path  # noqa: E402

import numba  # noqa: E402
from numba.core import caching  # noqa: E402

__all__ = ["jit", "pjit", "prange", "source_digest"]

prange = numba.prange
_PACKAGE = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=None)
def source_digest() -> bytes:
    """SHA-256 over the path and bytes of every ``.py`` file of the sdm package (read once
    per process)."""
    h = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        h.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.digest()


def _package_stamped(base):
    """``base`` (a Numba cache locator) for sdm's own files, stamped with the package digest."""

    class Locator(base):
        def get_source_stamp(self):
            return source_digest()

        @classmethod
        def from_function(cls, py_func, py_file):
            if not Path(py_file).resolve().is_relative_to(_PACKAGE):
                return None  # other packages' kernels keep Numba's own rule
            return super().from_function(py_func, py_file)

    Locator.__name__ = Locator.__qualname__ = f"SdmPackage{base.__name__}"
    return Locator


def _numba(name: str):
    # Numba 0.61 dropped the leading underscore of these names.
    return getattr(caching, name, None) or getattr(caching, "_" + name)


# Tried in Numba's own order (NUMBA_CACHE_DIR, then __pycache__, then the user-wide cache).
_numba("CacheImpl")._locator_classes[:0] = [
    _package_stamped(_numba(base)) for base in ("UserProvidedCacheLocator", "InTreeCacheLocator",
                                                "UserWideCacheLocator")]


def jit(fn=None, **flags):
    """``numba.njit`` with sdm's flags (cache, nogil); keyword flags override."""
    options = {"cache": True, "nogil": True, **flags}
    if fn is None:
        return lambda f: numba.njit(**options)(f)
    return numba.njit(**options)(fn)


def pjit(fn=None, **flags):
    """:func:`jit` with ``parallel=True`` for kernels that split work over cores with ``prange``."""
    return jit(fn, parallel=True, **flags)

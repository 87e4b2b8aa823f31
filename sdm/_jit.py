"""The one JIT decorator of sdm.

Every kernel is compiled through :func:`jit` so the flags live in one place:

* ``cache=True``: compiled code is kept on disk beside the module (``__pycache__``), so a
  fresh process pays only loading, not compiling. Numba keys the cache on the source file's
  timestamp, the function's bytecode and the argument types, so an edited kernel is
  recompiled, never served stale. It does not see edits to *other* files: a jitted helper
  imported from another module, or the flags below. Keep a kernel's helpers in its own file,
  and after changing flags here delete the ``*.nbi``/``*.nbc`` files under ``sdm/``.
* ``nogil=True``: kernels release the GIL, so a second Python thread runs while one works.
* ``fastmath`` is off by default: sums must match the reference summation order closely.
  Kernels that reassociate on purpose (vectorized pooling) ask for it explicitly.

Threads: parallel kernels run on Numba's OpenMP layer. libgomp's threads spin-wait between
parallel regions by default; on a machine whose cores are shared with other jobs both threads
of a call can land on one core and the call then waits for scheduler ticks (measured on the
2-core dev VM: ~8 ms per call, 195 ns per pooled row instead of ~35). Importing sdm therefore
sets ``OMP_WAIT_POLICY=passive`` unless the environment already sets it; it takes effect when
the OpenMP runtime loads (Numba's, at the first parallel call), so set it yourself, to
``active`` on a dedicated machine, before importing sdm to choose otherwise.

Kernels stay valid plain Python, so ``NUMBA_DISABLE_JIT=1`` runs them interpreted (for
coverage and debugging).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before numba loads libgomp; see above

import numba  # noqa: E402

__all__ = ["jit", "pjit", "prange"]

prange = numba.prange


def jit(fn=None, **flags):
    """``numba.njit`` with sdm's flags (cache, nogil); keyword flags override."""
    options = {"cache": True, "nogil": True, **flags}
    if fn is None:
        return lambda f: numba.njit(**options)(f)
    return numba.njit(**options)(fn)


def pjit(fn=None, **flags):
    """:func:`jit` with ``parallel=True`` for kernels that split work over cores with ``prange``."""
    return jit(fn, parallel=True, **flags)

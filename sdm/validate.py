"""Validators for values that cross sdm's boundary: the one place a check is written.

Every public entry point validates what it is given with these and hands typed, trusted
values inward; internal classes and kernels do not check again. Each validator returns the
value in its canonical type (``int``, ``float``, a contiguous ``int64`` array ...) and
raises ``error`` (an :mod:`sdm.errors` class, :class:`~sdm.errors.InvalidArgumentError` by
default) with a one-line message naming the value, what it is called, and the limit it
broke: ``queue_depth must be an integer in [1, 1024], got 0``. Booleans are never numbers
here: ``True`` is not a count of 1.
"""

from __future__ import annotations

import math
import os
from numbers import Integral, Real

import numpy as np

from sdm.errors import IdOutOfRangeError, InvalidArgumentError

__all__ = ["check_int", "check_number", "check_choice", "as_array", "as_int_array", "check_id_array",
           "check_permutation", "memory_bytes", "check_fits_memory", "INT64_MAX"]

#: The largest int64, the bound of every id and byte count a kernel holds.
INT64_MAX = int(np.iinfo(np.int64).max)


def _bound(x) -> str:
    return "2**63 - 1" if x == INT64_MAX else str(x)


def _limit(lo, hi, lo_open: bool = False, hi_open: bool = False) -> str:
    """`` in [lo, hi]``, `` >= lo``, `` < hi`` ... ("" when unbounded)."""
    if lo is not None and hi is not None:
        return f" in {'(' if lo_open else '['}{_bound(lo)}, {_bound(hi)}{')' if hi_open else ']'}"
    if lo is not None:
        return f" {'>' if lo_open else '>='} {_bound(lo)}"
    if hi is not None:
        return f" {'<' if hi_open else '<='} {_bound(hi)}"
    return ""


def _is_bool(value) -> bool:
    return isinstance(value, (bool, np.bool_))


def _given(value) -> str:
    """A value of the wrong type, with its type: ``'4' (str)``, ``True (bool)``."""
    return "None" if value is None else f"{value!r} ({type(value).__name__})"


def check_int(value, name: str, *, lo: int | None = None, hi: int | None = None,
              error=InvalidArgumentError) -> int:
    """``value`` as an ``int`` in ``[lo, hi]`` (either bound may be None: unbounded).

    Accepts Python and numpy integers; refuses bools, floats (even integral ones), strings.
    The message reads ``{name} must be an integer in [lo, hi], got {value}`` (``>= lo`` with
    no upper bound; ``a positive integer (>= 1)`` for ``lo=1``).
    """
    if lo == 1 and hi is None:
        kind = "a positive integer (>= 1)"
    else:
        kind = "an integer" + _limit(lo, hi)
    if _is_bool(value) or not isinstance(value, Integral):
        raise error(f"{name} must be {kind}, got {_given(value)}")
    v = int(value)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise error(f"{name} must be {kind}, got {v}")
    return v


def check_number(value, name: str, *, lo: float | None = None, hi: float | None = None,
                 lo_open: bool = False, hi_open: bool = False, finite: bool = True,
                 error=InvalidArgumentError) -> float:
    """``value`` as a ``float`` within the bounds (``lo_open``/``hi_open`` exclude them).

    Accepts ints and floats (Python or numpy); refuses bools, strings and NaN; infinities
    too unless ``finite`` is False. The message reads ``{name} must be a finite number in
    (lo, hi], got {value}``.
    """
    kind = ("a finite number" if finite else "a number") + _limit(lo, hi, lo_open, hi_open)
    if _is_bool(value) or not isinstance(value, Real):
        raise error(f"{name} must be {kind}, got {_given(value)}")
    shown = int(value) if isinstance(value, Integral) else float(value)
    v = float(value)
    below = lo is not None and (v <= lo if lo_open else v < lo)
    above = hi is not None and (v >= hi if hi_open else v > hi)
    if math.isnan(v) or (finite and math.isinf(v)) or below or above:
        raise error(f"{name} must be {kind}, got {shown!r}")
    return v


def check_choice(value, name: str, choices, *, error=InvalidArgumentError):
    """``value`` if it is one of ``choices`` (compared by equality; strings exactly, so a
    number never matches a name). The message lists the choices."""
    if _is_bool(value) or not isinstance(value, (str, int)) or value not in choices:
        raise error(f"{name} {value!r} is not one of {tuple(choices)}")
    return value


def as_array(values, name: str, *, error=InvalidArgumentError) -> np.ndarray:
    """``np.asarray(values)``, with ragged nested lists refused as ``error`` naming ``name``."""
    try:
        return np.asarray(values)
    except (ValueError, TypeError) as exc:
        raise error(f"{name} must be an array, got a ragged {type(values).__name__}: {exc}") from None


def _integers(values, name: str, error) -> np.ndarray:
    """A 1-D integer array of ``values`` as given (an empty list becomes empty int64)."""
    ids = as_array(values, name, error=error)
    if ids.ndim != 1:
        raise error(f"{name} must be 1-D, got shape {ids.shape}")
    if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
        if ids.size == 0 and ids.dtype == np.float64:  # np.asarray([]) is float64
            return np.empty(0, dtype=np.int64)
        raise error(f"{name} must have an integer dtype, got {ids.dtype}")
    return ids


def _contiguous(ids: np.ndarray, keep_int32: bool) -> np.ndarray:
    keep = keep_int32 and ids.dtype == np.int32
    return np.ascontiguousarray(ids, dtype=np.int32 if keep else np.int64)


def _uint64_max(ids: np.ndarray) -> int | None:
    """The largest value of a uint64 array when it does not fit int64, else None."""
    if ids.dtype == np.uint64 and ids.size:
        top = int(ids.max())
        if top > INT64_MAX:
            return top
    return None


def as_int_array(values, name: str, *, keep_int32: bool = False, error=InvalidArgumentError) -> np.ndarray:
    """A 1-D integer array (any sign) as contiguous ``int64`` (a view when it already is
    one), or ``int32`` when ``keep_int32`` and the input is int32. An empty list is an empty
    array; floats and bools are refused, never truncated; uint64 values beyond int64 too."""
    ids = _integers(values, name, error)
    top = _uint64_max(ids)
    if top is not None:
        raise error(f"{name} holds {top}, which does not fit int64 (at most {INT64_MAX})")
    return _contiguous(ids, keep_int32)


def check_id_array(values, name: str, *, upper: int | None = None, domain: str | None = None,
                   keep_int32: bool = False, error=InvalidArgumentError, range_error=None,
                   sign: bool = True) -> np.ndarray:
    """A 1-D integer array of ids, every one in ``[0, upper)`` (``upper`` None: ``[0, 2**63)``).

    Returns what :func:`as_int_array` returns. Shape and dtype problems raise ``error``; an
    id out of range raises ``range_error`` (default :class:`~sdm.errors.IdOutOfRangeError`
    when ``upper`` is given, else ``error``), naming the id, the range and what it indexes
    (``domain``, default ``a table of {upper} rows``). ``sign`` False with ``upper`` None
    leaves negative ids to a caller that checks them as it reads them (no pass here).
    """
    if range_error is None:
        range_error = IdOutOfRangeError if upper is not None else error
    valid = f"[0, {upper})" if upper is not None else ">= 0"
    ids = _integers(values, name, error)
    top = _uint64_max(ids)  # a uint64 id beyond int64 is out of every range
    if top is None:
        ids = _contiguous(ids, keep_int32)
        if not ids.size or (upper is None and not sign):
            return ids
        low = int(ids.min())
        if low < 0:
            raise range_error(f"{name} {low} is negative (valid: {valid})")
        if upper is None:  # an int64 holds nothing above the bound: no second pass
            return ids
        top = int(ids.max())
        if top < upper:
            return ids
    if upper is None:
        raise range_error(f"{name} {top} is out of range: above the largest id {INT64_MAX}")
    where = domain if domain is not None else f"a table of {upper} rows"
    raise range_error(f"{name} {top} is out of range for {where} (valid: {valid})")


def check_permutation(order, n: int, name: str, *, error=InvalidArgumentError) -> np.ndarray:
    """``order`` as a contiguous ``(n,) int64`` permutation of ``range(n)``; ``error``
    naming ``name`` for a wrong shape or dtype, a row outside ``[0, n)``, or a row missing
    (so another appears twice)."""
    a = as_array(order, name, error=error)
    if a.shape == (0,) and a.dtype == np.float64:  # np.asarray([])
        a = np.empty(0, dtype=np.int64)
    if a.ndim != 1 or a.shape[0] != n or a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer):
        raise error(f"{name} must be a ({n},) integer permutation, got shape {a.shape} dtype {a.dtype}")
    if n == 0:
        return np.empty(0, dtype=np.int64)
    lo, hi = int(a.min()), int(a.max())
    if lo < 0 or hi >= n:
        raise error(f"{name} holds row {lo if lo < 0 else hi}, outside [0, {n})")
    a = np.ascontiguousarray(a, dtype=np.int64)
    seen = np.zeros(n, dtype=np.bool_)
    seen[a] = True
    if not seen.all():
        raise error(f"{name} is not a permutation of range({n}): row {int(np.argmin(seen))} is "
                    f"missing (another appears twice)")
    return a


def memory_bytes() -> int:
    """This host's physical memory in bytes (0 when the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def check_fits_memory(nbytes: int, name: str, value, what: str, *, error=InvalidArgumentError) -> None:
    """``error`` unless ``nbytes``, what ``name`` = ``value`` makes sdm allocate (``what``:
    "cache slots", ...), fits this host's physical memory; checked before allocating, so a
    size never runs the host out of memory. The message names all three and the limit."""
    def size(n):
        return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n:,} bytes"

    limit = memory_bytes()
    if limit and nbytes > limit:
        raise error(f"{name} {value} needs {what}, {size(nbytes)}, more than this host's "
                    f"{size(limit)} of memory")

"""Public pooled-gather API (``sdm.embedding_bag``) and the validation shared by every
caller that takes CSR bags: ids, offsets, per-sample weights."""

from __future__ import annotations

import os

import numba
import numpy as np

from sdm.errors import IdOutOfRangeError, InvalidArgumentError, InvalidOffsetsError
from sdm.formats import INT8_TAIL_BYTES, check_format, row_bytes
from sdm.validate import as_array, check_choice, check_id_array, check_int
from sdm.kernels.bag import (_fp16_range, _fp32_range, _int8_range, bag_fp16, bag_fp32, bag_int8,
                             bags_valid, offsets_valid)
from sdm.kernels.cpu import gather_variant, host_cpu
from sdm.kernels.jit import jit

__all__ = ["embedding_bag", "check_bags", "check_ids", "check_offsets", "check_weights", "POOLING_MODES"]

POOLING_MODES = ("sum", "mean")


def check_ids(ids, num_rows: int, *, what: str = "index") -> np.ndarray:
    """Validate row ids: a 1-D integer array, every value in ``[0, num_rows)``.

    Returns the ids as a contiguous int32 or int64 array (other integer dtypes are widened
    to int64; floats and bools are rejected rather than silently truncated).
    """
    return check_id_array(ids, what, upper=num_rows, keep_int32=True)


def check_bags(indices, offsets, num_rows: int, *, what: str = "index") -> tuple[np.ndarray, np.ndarray]:
    """:func:`check_ids` and :func:`check_offsets` together: ``(indices, offsets)`` as the
    kernels take them. Arrays already in the kernels' dtypes are checked in one pass
    (:func:`~sdm.kernels.bag.bags_valid`); the full checks run only to convert the others or
    to name what is wrong."""
    if (_plain(indices, _INDEX_DTYPES) and _plain(offsets, _OFFSET_DTYPES)
            and bags_valid(indices, offsets, num_rows)):
        return indices, offsets
    indices = check_ids(indices, num_rows, what=what)
    return indices, check_offsets(offsets, indices.shape[0])


def check_offsets(offsets, nnz: int) -> np.ndarray:
    """Validate CSR offsets for ``nnz`` indices: 1-D integer, ``B + 1 >= 1`` entries,
    ``offsets[0] == 0``, non-decreasing, ``offsets[-1] == nnz``. Returns contiguous int64."""
    offsets = as_array(offsets, "offsets", error=InvalidOffsetsError)
    if offsets.ndim != 1:
        raise InvalidOffsetsError(f"offsets must be 1-D, got shape {offsets.shape}")
    if offsets.size == 0:
        raise InvalidOffsetsError(
            "offsets must have B + 1 >= 1 entries (CSR with a trailing total), got 0"
        )
    if offsets.dtype == np.bool_ or not np.issubdtype(offsets.dtype, np.integer):
        raise InvalidOffsetsError(f"offsets must have an integer dtype, got {offsets.dtype}")
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    if offsets[0] != 0:
        raise InvalidOffsetsError(f"offsets[0] must be 0, got {int(offsets[0])}")
    if offsets[-1] != nnz:
        raise InvalidOffsetsError(
            f"offsets[-1] must equal len(indices) = {nnz}, got {int(offsets[-1])} "
            f"(offsets need B + 1 entries, the last one the total)"
        )
    at = _first_decrease(offsets)  # one pass (every batch of every table validates them)
    if at >= 0:
        raise InvalidOffsetsError(
            f"offsets must be non-decreasing; offsets[{at + 1}] = {int(offsets[at + 1])} "
            f"< offsets[{at}] = {int(offsets[at])}"
        )
    return offsets


@jit
def _first_decrease(offsets):
    """The first ``i`` with ``offsets[i + 1] < offsets[i]``, or -1."""
    for i in range(offsets.shape[0] - 1):
        if offsets[i + 1] < offsets[i]:
            return i
    return -1


def check_weights(per_sample_weights, nnz: int) -> np.ndarray | None:
    """Validate per-sample weights: ``None`` or a 1-D float array of ``nnz`` entries."""
    if per_sample_weights is None:
        return None
    w = as_array(per_sample_weights, "per_sample_weights")
    if w.ndim != 1 or w.shape[0] != nnz:
        raise InvalidArgumentError(
            f"per_sample_weights must have shape ({nnz},) like indices, got {w.shape}"
        )
    if not np.issubdtype(w.dtype, np.floating):
        raise InvalidArgumentError(f"per_sample_weights must be floating, got {w.dtype}")
    with np.errstate(over="ignore"):  # a weight beyond float32 becomes inf, refused below
        w = np.ascontiguousarray(w, dtype=np.float32)
    bad = np.flatnonzero(~np.isfinite(w))
    if bad.size:  # refused as update_rows refuses non-finite rows: one rule for every float input
        i = int(bad[0])
        raise InvalidArgumentError(f"per_sample_weights must be finite float32 values, got "
                                   f"{float(w[i])} at {i}")
    return w


def check_mode(mode) -> bool:
    """Return True for ``mean``, False for ``sum``; raise for anything else."""
    return check_choice(mode, "mode", POOLING_MODES) == "mean"


def _check_table(table, fmt: str, dim):
    if dim is not None:
        dim = check_int(dim, "dim")
    table = as_array(table, "table")
    if table.ndim != 2:
        raise InvalidArgumentError(f"table must be 2-D, got shape {table.shape}")
    if fmt == "int8":
        if table.dtype != np.uint8:
            raise InvalidArgumentError(f"an int8 table must be (n, dim + 8) uint8 rows, got {table.dtype}")
        width = table.shape[1] - INT8_TAIL_BYTES
        if dim is None:
            dim = width
        if dim < 1 or table.shape[1] != row_bytes("int8", dim):
            raise InvalidArgumentError(
                f"an int8 table of dim {dim} must have {dim + INT8_TAIL_BYTES} bytes per row, "
                f"got {table.shape[1]}"
            )
    else:
        want = np.float32 if fmt == "fp32" else np.float16
        if table.dtype != want:
            raise InvalidArgumentError(f"a {fmt} table must have dtype {np.dtype(want)}, got {table.dtype}")
        if dim is not None and dim != table.shape[1]:
            raise InvalidArgumentError(f"dim {dim} does not match the table's {table.shape[1]} columns")
        dim = table.shape[1]
        if dim < 1:
            raise InvalidArgumentError("table must have dim >= 1, got 0 columns")
    return np.ascontiguousarray(table), int(dim)


def embedding_bag(table, indices, offsets, *, fmt="fp32", dim=None, mode="sum",
                  per_sample_weights=None, out=None) -> np.ndarray:
    """Sum- or mean-pool rows of ``table`` per bag (SparseLengthsSum).

    Args:
        table: ``(n, dim)`` float32 (``fp32``) or float16 (``fp16``) rows, or
            ``(n, dim + 8)`` uint8 fused row-wise rows (``int8``).
        indices: ``(nnz,)`` int32 or int64 row ids in ``[0, n)``.
        offsets: ``(B + 1,)`` int64 CSR bag boundaries: ``offsets[0] == 0``, non-decreasing,
            ``offsets[B] == nnz``. Bag ``b`` is ``indices[offsets[b]:offsets[b + 1]]``.
        fmt: the table's row format, one of ``sdm.ROW_FORMATS``.
        dim: values per row; inferred from the table when None.
        mode: ``"sum"`` or ``"mean"`` (an empty bag pools to zeros in both).
        per_sample_weights: optional ``(nnz,)`` float weights, one per index.
        out: optional ``(B, dim)`` float32 C-contiguous array to write into.

    Returns:
        ``(B, dim)`` float32 pooled rows.

    Raises:
        IdOutOfRangeError: an index outside ``[0, n)`` (the message names it).
        InvalidOffsetsError, InvalidArgumentError: malformed offsets, dtypes or shapes.
    """
    fmt = check_format(fmt)
    mean = check_mode(mode)
    table, dim = _check_table(table, fmt, dim)
    if (_plain(indices, _INDEX_DTYPES) and _plain(offsets, _OFFSET_DTYPES)
            and offsets_valid(offsets, indices.shape[0])):
        check = True  # the kernel checks each id before it reads the row (see sdm.kernels.bag)
    else:
        indices, offsets = check_bags(indices, offsets, table.shape[0])
        check = False
    weights = check_weights(per_sample_weights, indices.shape[0])
    nbags = offsets.shape[0] - 1
    if out is None:
        out = np.empty((nbags, dim), dtype=np.float32)
    elif (not isinstance(out, np.ndarray) or out.shape != (nbags, dim)
          or out.dtype != np.float32 or not out.flags.c_contiguous):
        raise InvalidArgumentError(f"out must be a C-contiguous ({nbags}, {dim}) float32 array")
    return pool(table, indices, offsets, weights, mean, fmt, out, check=check)


_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
_OFFSET_DTYPES = (np.dtype(np.int64),)


def _plain(a, dtypes) -> bool:
    """An array the kernels take as it is: 1-D, C-contiguous, one of ``dtypes``."""
    return (isinstance(a, np.ndarray) and a.ndim == 1 and a.dtype in dtypes
            and a.flags.c_contiguous)


_NO_WEIGHTS = np.empty(0, dtype=np.float32)
# fmt -> (serial core over bags [b0, b1), parallel driver)
_KERNELS = {"fp32": (_fp32_range, bag_fp32), "fp16": (_fp16_range, bag_fp16),
            "int8": (_int8_range, bag_int8)}
# Below this many lookups one thread finishes before a parallel region would have started (a
# lookup costs 5-50 ns). What a launch costs depends on how OpenMP's threads wait between regions
# (sdm.kernels.jit): spinning (OMP_WAIT_POLICY=active) ~0.1 us, so 2 threads break even at 1K
# lookups; asleep (passive, sdm's default) each launch wakes them by futex, ~50 us on this
# project's 2-core VMs, so 2 threads break even only at 32K lookups back to back, and a serving
# store's 4K-lookup tables pooled in parallel took 1.65x the time (bench/RESULTS.md).
SERIAL_BELOW_LOOKUPS = 1024 if os.environ.get("OMP_WAIT_POLICY", "").strip().lower() == "active" else 1 << 15
# The kernels' tuned variant for this CPU (sdm.kernels.cpu.gather_variant), passed to them as
# arguments: prefetch every line of each row, or its first and last line.
PREFETCH_EVERY_LINE = gather_variant(host_cpu())["prefetch_every_line"]


def pool(table, indices, offsets, weights, mean, fmt, out, *, every_line=None, check=False):
    """Dispatch to the kernel for ``fmt`` on already-validated arrays (internal fast path).

    Same arrays as :func:`embedding_bag` after validation (``indices`` int32/int64,
    ``offsets`` int64, ``weights`` float32 or None, ``out`` ``(B, dim)`` float32 C-contiguous);
    returns ``out``. Runs on ``numba.get_num_threads()`` threads, or serially for small batches.
    ``every_line`` overrides this CPU's prefetch variant (:data:`PREFETCH_EVERY_LINE`; tests
    run both); the pooled values are the same bits either way. With ``check`` the ids need
    not have been range-checked: the kernel compares each with the table's row count before
    reading its row, and an id out of range raises :class:`~sdm.errors.IdOutOfRangeError`
    naming it (``out`` then holds no meaningful values).
    """
    if every_line is None:
        every_line = PREFETCH_EVERY_LINE
    if check and table.shape[0] == 0:  # no row 0 to read in place of a bad id
        check_ids(indices, 0)
    weighted = weights is not None
    w = weights if weighted else _NO_WEIGHTS
    if fmt == "fp16":  # Numba has no float16 arrays: the kernel widens the raw bits itself
        table = table.view(np.uint16)
    core, driver = _KERNELS[fmt]
    if indices.shape[0] < SERIAL_BELOW_LOOKUPS:  # first: get_num_threads costs a few us
        bad = core(table, indices, offsets, w, weighted, mean, out, 0, out.shape[0], every_line, check)
    else:
        nthreads = numba.get_num_threads()
        if nthreads == 1:
            bad = core(table, indices, offsets, w, weighted, mean, out, 0, out.shape[0], every_line, check)
        else:
            bad = driver(table, indices, offsets, w, weighted, mean, out, every_line, check, nthreads)
    if bad:
        check_ids(indices, table.shape[0])  # names the first id out of range
        raise IdOutOfRangeError(f"an index is outside [0, {table.shape[0]})")  # not reached
    return out

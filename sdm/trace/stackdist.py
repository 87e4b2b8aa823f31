"""LRU stack distances: profiling a key stream, the reference DLRM's 3-line distribution file,
and generating a key stream from such a distribution (after Hassan et al. 2007, as the reference
DLRM's synthetic-trace generator does).

Definitions (the reference DLRM's): the stack distance of an access is 0 for the first access of
a key ("a new reference"), else 1 + the number of distinct other keys accessed since the previous
access of the same key (so an immediate repeat has distance 1). The distribution file has three
comma-separated lines: the unique keys in first-touch order, the sorted distinct stack distances,
and their cumulative probabilities.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from sdm.kernels.jit import jit
from sdm.errors import InvalidArgumentError
from sdm.trace.format import TraceFormatError, input_file

__all__ = [
    "StackDistanceDistribution",
    "stack_distances",
    "fit_stack_distance",
    "read_dist_file",
    "write_dist_file",
    "generate_stack_distance_keys",
]


@jit
def _fen_add(tree, i, v):
    n = tree.shape[0] - 1
    while i <= n:
        tree[i] += v
        i += i & (-i)


@jit
def _fen_prefix(tree, i):
    s = 0
    while i > 0:
        s += tree[i]
        i -= i & (-i)
    return s


@jit
def _fen_kth(tree, k, log):
    """Smallest 1-based position whose prefix sum reaches k (k >= 1, <= total)."""
    pos = 0
    step = log
    n = tree.shape[0] - 1
    while step > 0:
        nxt = pos + step
        if nxt <= n and tree[nxt] < k:
            pos = nxt
            k -= tree[nxt]
        step >>= 1
    return pos + 1


@jit
def _stack_distance_kernel(dense, n_unique, out):
    # A marker sits at the latest access time of each key; the markers after a key's previous
    # access count the distinct keys touched since.
    n = dense.shape[0]
    tree = np.zeros(n + 1, dtype=np.int64)
    last = np.full(n_unique, -1, dtype=np.int64)
    total = 0
    for i in range(n):
        k = dense[i]
        p = last[k]
        if p < 0:
            out[i] = 0
        else:
            out[i] = total - _fen_prefix(tree, p + 1) + 1
            _fen_add(tree, p + 1, -1)
            total -= 1
        _fen_add(tree, i + 1, 1)
        total += 1
        last[k] = i


def stack_distances(keys) -> tuple[np.ndarray, np.ndarray]:
    """LRU stack distance of every access of ``keys``.

    Args:
        keys: ``(n,)`` integer key stream.

    Returns:
        ``(distances, unique_accesses)``: ``(n,)`` int64 distances (0 = first access), and the
        ``(U,)`` int64 distinct keys in first-touch order.
    """
    keys = np.asarray(keys)
    if keys.ndim != 1 or not np.issubdtype(keys.dtype, np.integer):
        raise InvalidArgumentError(f"keys must be a 1-D integer array, got shape {keys.shape} "
                                   f"dtype {keys.dtype}")
    uniq, first, dense = np.unique(keys, return_index=True, return_inverse=True)
    out = np.empty(keys.shape[0], dtype=np.int64)
    _stack_distance_kernel(dense.astype(np.int64).ravel(), uniq.shape[0], out)
    return out, uniq[np.argsort(first, kind="stable")].astype(np.int64)


@dataclass(frozen=True)
class StackDistanceDistribution:
    """The reference DLRM's stack-distance distribution.

    Attributes:
        unique_accesses: ``(U,)`` int64 keys in first-touch order.
        distances: ``(K,)`` int64 sorted distinct stack distances (0 = new reference).
        cumulative: ``(K,)`` float64 cumulative probabilities, non-decreasing, last = 1.
    """

    unique_accesses: np.ndarray
    distances: np.ndarray
    cumulative: np.ndarray

    def cdf(self, d) -> np.ndarray:
        """P(stack distance <= d) for each value of ``d``."""
        idx = np.searchsorted(self.distances, np.asarray(d), side="right") - 1
        return np.where(idx >= 0, self.cumulative[np.maximum(idx, 0)], 0.0)


def fit_stack_distance(keys) -> StackDistanceDistribution:
    """Profile a key stream into its stack-distance distribution (the inverse of
    :func:`generate_stack_distance_keys`)."""
    d, uniq = stack_distances(keys)
    vals, counts = np.unique(d, return_counts=True)
    cum = np.cumsum(counts) / max(int(d.shape[0]), 1)
    return StackDistanceDistribution(uniq, vals.astype(np.int64), cum.astype(np.float64))


def _parse_line(text: str, lineno: int, path: str, conv, what: str):
    parts = [p.strip() for p in text.split(",")]
    if parts == [""]:
        raise TraceFormatError(f"{path}: line {lineno} ({what}) is empty", field=f"line {lineno}",
                               path=path)
    vals = []
    for col, p in enumerate(parts, 1):
        try:
            v = conv(p)
        except ValueError:
            raise TraceFormatError(f"{path}: line {lineno}, item {col}: {p!r} is not a valid "
                                   f"{what} value", field=f"line {lineno}", path=path) from None
        if conv is int and not -2**63 <= v < 2**63:
            raise TraceFormatError(f"{path}: line {lineno}, item {col}: {p!r} does not fit a 64-bit "
                                   f"integer (at most 2**63 - 1)", field=f"line {lineno}", path=path)
        if conv is float and not math.isfinite(v):
            raise TraceFormatError(f"{path}: line {lineno}, item {col}: {p!r} is not a finite {what}",
                                   field=f"line {lineno}", path=path)
        vals.append(v)
    return vals


def read_dist_file(path) -> StackDistanceDistribution:
    """Read the reference DLRM's 3-line distribution file (e.g. ``dist_emb_0.log``).

    Raises:
        TraceFormatError: wrong line count, non-numeric items, mismatched line lengths,
            unsorted distances or a cumulative column that is not a CDF (names the line).
    """
    path = input_file(path, "distribution file")
    try:
        with open(path, encoding="utf-8") as fh:
            lines = [ln for ln in fh.read().splitlines() if ln.strip()]
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"{path}: a distribution file is UTF-8 text; {exc}", field="file",
                               path=path) from None
    if len(lines) != 3:
        raise TraceFormatError(f"{path}: a distribution file has 3 lines (unique accesses, stack "
                               f"distances, cumulative probabilities), got {len(lines)}",
                               field="lines", path=path)
    uniq = np.array(_parse_line(lines[0], 1, path, int, "integer key"), dtype=np.int64)
    dist = np.array(_parse_line(lines[1], 2, path, int, "integer stack distance"), dtype=np.int64)
    cum = np.array(_parse_line(lines[2], 3, path, float, "probability"), dtype=np.float64)
    if dist.shape != cum.shape:
        raise TraceFormatError(f"{path}: line 2 has {dist.shape[0]} stack distances but line 3 has "
                               f"{cum.shape[0]} probabilities", field="line 3", path=path)
    if dist.min() < 0 or np.any(np.diff(dist) <= 0):
        raise TraceFormatError(f"{path}: line 2 stack distances must be >= 0 and strictly "
                               f"increasing", field="line 2", path=path)
    if cum.min() < 0 or np.any(np.diff(cum) < 0) or abs(cum[-1] - 1.0) > 0.01:
        raise TraceFormatError(f"{path}: line 3 must be non-decreasing probabilities ending at 1, "
                               f"got last = {cum[-1]}", field="line 3", path=path)
    if uniq.min() < 0:
        raise TraceFormatError(f"{path}: line 1 holds a negative key {int(uniq.min())}",
                               field="line 1", path=path)
    cum[-1] = 1.0
    return StackDistanceDistribution(uniq, dist, cum)


def write_dist_file(path, dist: StackDistanceDistribution, *, decimals: int | None = None) -> str:
    """Write ``dist`` in the 3-line format; ``decimals`` rounds the probabilities (the reference
    files use 2), None keeps full precision."""
    path = os.fspath(path)
    cum = dist.cumulative if decimals is None else np.round(dist.cumulative, decimals)
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(", ".join(str(int(x)) for x in dist.unique_accesses) + "\n")
            fh.write(", ".join(str(int(x)) for x in dist.distances) + "\n")
            fh.write(", ".join(repr(float(x)) for x in cum) + "\n")
    except OSError as exc:
        raise InvalidArgumentError(f"cannot write distribution file {path!r}: {exc.strerror}") from None
    return path


@jit
def _sd_generate(unique, dists, cum, u, out):
    # The "line list" holds not-yet-touched keys in front, then touched keys from least to most
    # recent. Slots of a Fenwick tree keep that order: a key moved to the top takes a fresh slot
    # at the end, so the k-th occupied slot is the k-th list entry in O(log n).
    nu = unique.shape[0]
    n = out.shape[0]
    size = nu + n
    tree = np.zeros(size + 1, dtype=np.int64)
    item = np.empty(size, dtype=np.int64)
    for j in range(nu):
        item[j] = unique[j]
        _fen_add(tree, j + 1, 1)
    log = 1
    while log * 2 <= size:
        log *= 2
    nxt = nu
    touched = 0
    k = dists.shape[0]
    # P(d = 0): a draw of a new reference once every key is touched is redrawn among d >= 1
    p_new = cum[0] if dists[0] == 0 else 0.0
    for t in range(n):
        x = u[t]
        if touched >= nu and p_new > 0.0 and p_new < 1.0:
            x = p_new + x * (1.0 - p_new)
        j = np.searchsorted(cum, x, side="left")
        if j >= k:
            j = k - 1
        d = dists[j]
        if d == 0 or d > touched:
            # a distance longer than the keys touched so far can only be a first touch; the
            # source trace's cold misses gather at its start the same way
            if touched < nu:
                pos = 1
                touched += 1
            else:
                pos = 1  # every key touched and no warm distance to draw: the least recent
        else:
            pos = nu - d + 1
        slot = _fen_kth(tree, pos, log) - 1
        key = item[slot]
        _fen_add(tree, slot + 1, -1)
        item[nxt] = key
        _fen_add(tree, nxt + 1, 1)
        nxt += 1
        out[t] = key


def generate_stack_distance_keys(dist: StackDistanceDistribution, n: int, rng) -> np.ndarray:
    """Draw ``n`` keys whose LRU stack distances follow ``dist``.

    New references take the unique keys in their first-touch order; a draw of distance ``d``
    re-touches the ``d``-th most recent key. A draw longer than the number of keys touched so far
    becomes a new reference, and once every unique key is touched, new-reference draws are
    redrawn among the warm distances. (The reference DLRM generator instead shrinks the support
    to realisable distances and keeps drawing new references at the marginal rate; when a trace
    touches most keys late, that shortens every distance. Here cold misses gather at the start,
    as in the profiled trace, and profiling the output gives the distribution back.)

    Returns:
        ``(n,)`` int64 keys.
    """
    if n < 0:
        raise InvalidArgumentError(f"n must be >= 0, got {n}")
    if dist.unique_accesses.shape[0] == 0:
        raise InvalidArgumentError("the distribution has no unique accesses to draw from")
    out = np.empty(int(n), dtype=np.int64)
    u = rng.random(int(n))
    _sd_generate(np.ascontiguousarray(dist.unique_accesses, dtype=np.int64),
                 np.ascontiguousarray(dist.distances, dtype=np.int64),
                 np.ascontiguousarray(dist.cumulative, dtype=np.float64), u, out)
    return out

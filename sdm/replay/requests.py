"""What a request is when a trace is replayed, and the cache key stream requests produce.

A trace batch holds ``B`` samples over ``T`` tables. Replay serves it as one or more
*requests*, each a single ``Store.embedding_bags`` call (so each is one unit of modeled
latency: it completes when its slowest lookup does, as EVStore points out):

* ``request_size=None`` (default): a batch that carries ``request_ids`` (inference traces:
  one user x N candidate items) is split at every change of request id, so each user request
  is one request; any other batch is one request of ``B`` samples — the batch an inference
  server ranks at once;
* ``request_size=N``: every batch is cut into requests of ``N`` samples (the last may be
  shorter), whatever its ``request_ids``.

The store's DRAM cache sees, per request and per table in table order, the table's distinct
row ids in ascending order, keyed ``table_id << 48 | row_id`` (``sdm.tiers.dram_cache``).
:func:`key_stream` builds exactly that stream, so ``sdm.simulate`` on it counts the hits and
misses the store's cache counts; replay and sweep both call it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from sdm.kernels.jit import jit
from sdm.kernels.serve import TABLE_SHIFT
from sdm.validate import check_int

__all__ = ["Request", "check_request_size", "request_bounds", "iter_requests", "KeyStream", "key_stream"]


@dataclass
class Request:
    """One request: samples ``[start, stop)`` of trace batch ``batch``.

    ``indices[t]`` ``(nnz_t,)`` int64 row ids and ``offsets[t]`` ``(n + 1,)`` int64 CSR of
    table ``t`` (views into the batch where possible); ``dense`` ``(n, D)`` float32 or None.
    """

    batch: int
    start: int
    stop: int
    indices: list
    offsets: list
    dense: np.ndarray | None = None

    @property
    def samples(self) -> int:
        return self.stop - self.start

    @property
    def lookups(self) -> int:
        return int(sum(int(ix.shape[0]) for ix in self.indices))


def check_request_size(request_size) -> int | None:
    """Samples per request: None (see the module doc) or an integer >= 1."""
    return None if request_size is None else check_int(request_size, "request_size", lo=1)


def request_bounds(batch, request_size=None) -> np.ndarray:
    """Sample boundaries of a batch's requests: ``(R + 1,)`` int64, ``[0, ..., B]``.

    An empty batch (``B = 0``) has no request: ``[0]``.
    """
    request_size = check_request_size(request_size)
    b = batch.batch_size
    if b == 0:
        return np.zeros(1, dtype=np.int64)
    if request_size is not None:
        return np.append(np.arange(0, b, request_size, dtype=np.int64), np.int64(b))
    rid = batch.request_ids
    if rid is None:
        return np.array([0, b], dtype=np.int64)
    rid = np.asarray(rid)
    cuts = np.flatnonzero(rid[1:] != rid[:-1]) + 1
    return np.concatenate(([0], cuts, [b])).astype(np.int64)


def _slice(batch, index: int, start: int, stop: int) -> Request:
    if start == 0 and stop == batch.batch_size:
        return Request(index, start, stop, list(batch.indices), list(batch.offsets), batch.dense)
    indices, offsets = [], []
    for ix, of in zip(batch.indices, batch.offsets):
        o = of[start:stop + 1]
        indices.append(ix[o[0]:o[-1]])
        offsets.append(o - o[0])
    dense = None if batch.dense is None else batch.dense[start:stop]
    return Request(index, start, stop, indices, offsets, dense)


def iter_requests(trace, request_size=None) -> Iterator[Request]:
    """The requests of ``trace`` (any iterable of :class:`sdm.trace.Batch`) in order."""
    request_size = check_request_size(request_size)
    for i, batch in enumerate(trace):
        bounds = request_bounds(batch, request_size)
        for r in range(bounds.shape[0] - 1):
            yield _slice(batch, i, int(bounds[r]), int(bounds[r + 1]))


@dataclass(frozen=True)
class KeyStream:
    """The DRAM cache's view of a trace.

    Attributes:
        keys: ``(n,)`` int64 cache keys ``table << 48 | row``: per request, per table, the
            table's distinct ids ascending.
        segments: ``(R * T + 1,)`` int64 CSR into ``keys``: segment ``r * T + t`` holds the
            keys of table ``t`` in request ``r``.
        segment_lookups: ``(R * T,)`` int64 lookups (with repeats) of each segment.
        lookups: ``(R,)`` int64 lookups (with repeats) of each request.
        samples: ``(R,)`` int64 samples of each request.
        num_tables: ``T``.
    """

    keys: np.ndarray
    segments: np.ndarray
    segment_lookups: np.ndarray
    lookups: np.ndarray
    samples: np.ndarray
    num_tables: int

    @property
    def num_requests(self) -> int:
        return int(self.lookups.shape[0])

    @property
    def num_lookups(self) -> int:
        return int(self.lookups.sum())


@jit
def _batch_keys(indices, offsets, num_tables, batch_size, bounds, keys, seg_len, seg_lookups, lookups):
    """Keys of one batch. ``indices``/``offsets``: FBGEMM table-major ``(nnz,)`` and
    ``(T * B + 1,)``; ``bounds`` ``(R + 1,)`` request sample boundaries. Writes ``keys``
    (``>= nnz``), ``seg_len`` and ``seg_lookups`` ``(R * T,)`` and ``lookups`` ``(R,)``;
    returns the keys written."""
    n = 0
    nreq = bounds.shape[0] - 1
    for r in range(nreq):
        total = 0
        for t in range(num_tables):
            lo = offsets[t * batch_size + bounds[r]]
            hi = offsets[t * batch_size + bounds[r + 1]]
            total += hi - lo
            seg_lookups[r * num_tables + t] = hi - lo
            seg = np.sort(indices[lo:hi])
            prefix = np.int64(t) << TABLE_SHIFT
            m = 0
            for i in range(seg.shape[0]):
                if i == 0 or seg[i] != seg[i - 1]:
                    keys[n + m] = prefix | seg[i]
                    m += 1
            seg_len[r * num_tables + t] = m
            n += m
        lookups[r] = total
    return n


def key_stream(trace, request_size=None) -> KeyStream:
    """The cache key stream of ``trace`` (a :class:`sdm.trace.Trace` or a sequence of
    batches) served as :func:`iter_requests` serves it; see :class:`KeyStream`."""
    request_size = check_request_size(request_size)
    keys, seg_lens, seg_lookups, lookups, samples = [], [], [], [], []
    num_tables = None
    for batch in trace:
        num_tables = batch.num_tables if num_tables is None else num_tables
        bounds = request_bounds(batch, request_size)
        indices, offsets = batch.to_fbgemm()
        indices = np.ascontiguousarray(indices, dtype=np.int64)
        nreq = bounds.shape[0] - 1
        k = np.empty(indices.shape[0], dtype=np.int64)
        sl = np.empty(nreq * num_tables, dtype=np.int64)
        sk = np.empty(nreq * num_tables, dtype=np.int64)
        lk = np.empty(nreq, dtype=np.int64)
        n = _batch_keys(indices, offsets, np.int64(num_tables), np.int64(batch.batch_size), bounds, k, sl,
                        sk, lk)
        keys.append(k[:n])
        seg_lens.append(sl)
        seg_lookups.append(sk)
        lookups.append(lk)
        samples.append(np.diff(bounds))
    if num_tables is None:
        num_tables = int(len(getattr(trace, "table_sizes", ())) or 1)

    def cat(parts):
        return np.concatenate(parts).astype(np.int64, copy=False) if parts else np.zeros(0, np.int64)

    segments = np.concatenate(([0], np.cumsum(cat(seg_lens)))).astype(np.int64)
    return KeyStream(cat(keys), segments, cat(seg_lookups), cat(lookups), cat(samples), int(num_tables))

"""Locality statistics of a trace (compute only; :mod:`sdm.trace.render` formats them).

Definitions follow facebookresearch/dlrm_datasets' ``locality_stats``: within one batch, the
reuse of a distinct ``(table, row)`` pair is the number of lookups that hit it. The histogram
bins reuse into ``(0,1], (1,2], (2,4], ..., (16384,32768]`` and an open bin ``32768+``; ``rows``
is the share of distinct pairs per bin, ``lookups`` the share of lookups falling on pairs of
that bin. Counts are summed over batches before taking shares.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sdm.kernels.jit import jit
from sdm.errors import InvalidArgumentError
from sdm.trace.format import Trace, load
from sdm.trace.generate import REUSE_BIN_EDGES
from sdm.trace.stackdist import stack_distances
from sdm.validate import check_int

__all__ = ["TraceStats", "TableStats", "trace_stats", "reuse_bins", "batch_reuse", "fit_zipf_alpha",
           "table_stack_distribution",
           "read_locality_stats"]

NUM_REUSE_BINS = len(REUSE_BIN_EDGES) + 1


def reuse_bins(counts) -> np.ndarray:
    """Bin index of each reuse count: 0 for 1, k for ``(2**(k-1), 2**k]``, 16 for ``> 32768``."""
    c = np.asarray(counts, dtype=np.int64)
    k = np.zeros(c.shape, dtype=np.int64)
    big = c > 1
    # ceil(log2(c)) exactly, via the bit length of c - 1
    k[big] = np.floor(np.log2(c[big] - 1)).astype(np.int64) + 1
    return np.minimum(k, NUM_REUSE_BINS - 1)


def batch_reuse(keys) -> tuple[np.ndarray, np.ndarray, int]:
    """Reuse histogram of one batch of ``(nnz,)`` integer global keys.

    Returns ``(rows, lookups, distinct)``: ``(17,)`` int64 distinct-pair counts and lookup
    counts per bin, and the number of distinct keys.
    """
    _, counts = np.unique(np.asarray(keys), return_counts=True)
    k = reuse_bins(counts)
    rows = np.bincount(k, minlength=NUM_REUSE_BINS).astype(np.int64)
    lk = np.bincount(k, weights=counts, minlength=NUM_REUSE_BINS).astype(np.int64)
    return rows, lk, int(counts.shape[0])


def fit_zipf_alpha(freqs, *, min_count: int = 5) -> float | None:
    """Zipf exponent of a frequency list: least squares of ``log f`` on ``log rank`` over ranks
    whose frequency is at least ``min_count`` (the tail below is sampling noise), sampled at
    log-spaced ranks so every decade weighs the same. None when fewer than 3 ranks qualify."""
    f = np.sort(np.asarray(freqs, dtype=np.float64))[::-1]
    f = f[f >= min_count]
    if f.shape[0] < 3:
        return None
    ranks = np.unique(np.geomspace(1, f.shape[0], num=min(64, f.shape[0])).astype(np.int64))
    x = np.log(ranks)
    y = np.log(f[ranks - 1])
    slope = np.polyfit(x, y, 1)[0]
    return float(-slope)


def _merge_counts(ids_a, cnt_a, ids_b, cnt_b):
    ids = np.concatenate([ids_a, ids_b])
    cnt = np.concatenate([cnt_a, cnt_b])
    uniq, inv = np.unique(ids, return_inverse=True)
    return uniq, np.bincount(inv.ravel(), weights=cnt, minlength=uniq.shape[0]).astype(np.int64)


class _RowCounter:
    """Lookups per distinct row of one table, as sorted ``(ids, counts)`` runs merged
    log-structured (a run merges with the one below when it grows to half its size), so a trace
    of N batches costs O(total log total) instead of re-merging everything every batch."""

    def __init__(self):
        self.runs = []

    def add(self, ids, counts):
        self.runs.append((ids, counts))
        while len(self.runs) >= 2 and self.runs[-2][0].shape[0] <= 2 * self.runs[-1][0].shape[0]:
            b = self.runs.pop()
            a = self.runs.pop()
            self.runs.append(_merge_counts(*a, *b))

    def result(self):
        while len(self.runs) >= 2:
            b = self.runs.pop()
            a = self.runs.pop()
            self.runs.append(_merge_counts(*a, *b))
        if not self.runs:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        return self.runs[0]


@jit
def _mark_seen(bits, keys):
    """Set the bit of every key; return how many were not set before (first touches)."""
    new = 0
    for i in range(keys.shape[0]):
        k = keys[i]
        byte = k >> 3
        mask = np.uint8(1 << (k & 7))
        if (bits[byte] & mask) == 0:
            bits[byte] |= mask
            new += 1
    return new


# the working-set curve keeps one bit per row of the trace; beyond this it is skipped
_MAX_BITMAP_BYTES = 1 << 30


@dataclass
class TableStats:
    """Per-table figures over the whole trace."""

    table: int
    size: int
    lookups: int
    distinct: int
    pooling: float
    zipf_alpha: float | None

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class TraceStats:
    """Locality statistics of a trace.

    Attributes:
        batches, samples, lookups: totals.
        distinct: distinct ``(table, row)`` pairs over the whole trace.
        reuse_rows, reuse_lookups: ``(17,)`` int64 per-bin counts summed over batches.
        lookups_per_batch, unique_per_batch: ``(N,)`` int64.
        tables: per-table :class:`TableStats`.
        zipf_alpha: fit over the merged frequency list of every table (None if too few data).
        stack: dict with the LRU stack distance distribution of the first ``stack_lookups``
            lookups (``cold`` share, ``bins`` upper bounds, ``shares``, percentiles).
        working_set: ``(lookups_seen, distinct_seen)`` arrays at batch boundaries (None when the
            trace has more than 8 Gi rows: the curve keeps one bit per row).
    """

    path: str | None
    metadata: dict
    batches: int
    samples: int
    lookups: int
    distinct: int
    reuse_rows: np.ndarray
    reuse_lookups: np.ndarray
    lookups_per_batch: np.ndarray
    unique_per_batch: np.ndarray
    tables: list
    zipf_alpha: float | None
    stack: dict
    working_set: tuple
    rank_frequency: np.ndarray = field(repr=False, default_factory=lambda: np.empty(0))
    batch_reuse_rows: np.ndarray = field(repr=False, default_factory=lambda: np.empty((0, 17)))
    batch_reuse_lookups: np.ndarray = field(repr=False, default_factory=lambda: np.empty((0, 17)))

    def compare(self, rows, lookups) -> dict:
        """Per-batch distance to target histograms (``rows`` and ``lookups`` shares, 17 bins
        each): the largest absolute per-bin difference over batches, and which batch."""
        rows, lookups = np.asarray(rows, np.float64), np.asarray(lookups, np.float64)
        r = self.batch_reuse_rows / np.maximum(self.batch_reuse_rows.sum(1, keepdims=True), 1)
        lk = self.batch_reuse_lookups / np.maximum(self.batch_reuse_lookups.sum(1, keepdims=True), 1)
        dr = np.abs(r - rows).max(1) if r.size else np.zeros(0)
        dl = np.abs(lk - lookups).max(1) if lk.size else np.zeros(0)
        worst = np.maximum(dr, dl)
        return {"max_abs_diff_rows": float(dr.max()) if dr.size else None,
                "max_abs_diff_lookups": float(dl.max()) if dl.size else None,
                "worst_batch": int(np.argmax(worst)) if worst.size else None,
                "per_batch_max_abs_diff": [round(float(x), 5) for x in worst]}

    @property
    def reuse_row_shares(self) -> np.ndarray:
        return self.reuse_rows / max(int(self.reuse_rows.sum()), 1)

    @property
    def reuse_lookup_shares(self) -> np.ndarray:
        return self.reuse_lookups / max(int(self.reuse_lookups.sum()), 1)

    @property
    def avg_reuse_per_batch(self) -> float:
        return float(self.lookups / max(int(self.unique_per_batch.sum()), 1))

    def to_json(self) -> dict:
        """A JSON-ready dict (the ``sdm trace stats --json`` output)."""
        return {
            "path": self.path,
            "metadata": self.metadata,
            "batches": self.batches,
            "samples": self.samples,
            "lookups": self.lookups,
            "distinct": self.distinct,
            "avg_reuse_per_batch": round(self.avg_reuse_per_batch, 4),
            "tables": [t.to_json() for t in self.tables],
            "reuse_histogram": {
                "bins": list(REUSE_BIN_EDGES),
                "open_bin": f">{REUSE_BIN_EDGES[-1]}",
                "note": "rows/lookups have len(bins) + 1 entries: (0,1], (1,2], (2,4], ..., "
                        "(16384,32768], then the open bin 32768+",
                "rows": [float(x) for x in self.reuse_row_shares],
                "lookups": [float(x) for x in self.reuse_lookup_shares],
                "row_counts": [int(x) for x in self.reuse_rows],
                "lookup_counts": [int(x) for x in self.reuse_lookups],
            },
            "zipf_alpha": self.zipf_alpha,
            "lookups_per_batch": [int(x) for x in self.lookups_per_batch],
            "unique_per_batch": [int(x) for x in self.unique_per_batch],
            "stack_distance": self.stack,
            "working_set": None if self.working_set is None else {
                "lookups": [int(x) for x in self.working_set[0]],
                "distinct": [int(x) for x in self.working_set[1]]},
        }


def _stack_summary(keys: np.ndarray) -> dict:
    if keys.shape[0] == 0:
        return {"lookups": 0, "cold": 0.0, "bins": [], "shares": [], "p50": None, "p90": None,
                "p99": None}
    d, _ = stack_distances(keys)
    warm = d[d > 0]
    cold = float((d == 0).mean())
    top = int(warm.max()) if warm.size else 1
    edges = [1]
    while edges[-1] < top:
        edges.append(edges[-1] * 2)
    k = np.searchsorted(np.array(edges), warm, side="left")
    shares = np.bincount(k, minlength=len(edges)) / d.shape[0]

    def pct(q):
        return int(np.percentile(warm, q)) if warm.size else None

    return {"lookups": int(d.shape[0]), "cold": cold, "bins": edges,
            "shares": [float(x) for x in shares], "p50": pct(50), "p90": pct(90), "p99": pct(99),
            "note": "share of all sampled lookups whose LRU stack distance d (1 = immediate "
                    "repeat) is in (bins[i-1], bins[i]]; cold = first touches"}


def trace_stats(trace, *, stack_lookups: int = 1_000_000, progress: bool = False) -> TraceStats:
    """Compute :class:`TraceStats` of a trace (a path or an open :class:`~sdm.trace.Trace`).

    Streams batch by batch; memory is one batch plus the per-table frequency of distinct rows.
    The stack-distance distribution uses the first ``stack_lookups`` lookups of the global key
    stream (table-major within a batch) to stay O(stack_lookups log) in time.
    """
    stack_lookups = check_int(stack_lookups, "stack_lookups", lo=0)
    own = not isinstance(trace, Trace)
    tr = load(trace) if own else trace
    try:
        ntab = tr.num_tables
        bases = tr.table_bases
        rows = np.zeros(NUM_REUSE_BINS, dtype=np.int64)
        lks = np.zeros(NUM_REUSE_BINS, dtype=np.int64)
        per_lookups, per_unique, per_rows, per_lks = [], [], [], []
        acc = [_RowCounter() for _ in range(ntab)]
        total_rows = int(tr.table_sizes.sum())
        bits = None
        if (total_rows + 7) // 8 <= _MAX_BITMAP_BYTES:
            bits = np.zeros((total_rows + 7) // 8, dtype=np.uint8)
        ws_x, ws_y = [0], [0]
        stack_parts, stack_have = [], 0
        samples = 0
        it = iter(tr)
        if progress:
            from tqdm import tqdm

            it = tqdm(it, total=len(tr), unit="batch", desc="trace stats")
        for batch in it:
            samples += batch.batch_size
            parts = []
            for t, ix in enumerate(batch.indices):
                ix = np.asarray(ix, dtype=np.int64)
                parts.append(ix + bases[t])
                u, c = np.unique(ix, return_counts=True)
                acc[t].add(u, c)
            keys = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
            r, lk, dist = batch_reuse(keys)
            rows += r
            lks += lk
            per_rows.append(r)
            per_lks.append(lk)
            per_lookups.append(keys.shape[0])
            per_unique.append(dist)
            ws_x.append(ws_x[-1] + keys.shape[0])
            if bits is not None:
                ws_y.append(ws_y[-1] + _mark_seen(bits, keys))
            if stack_have < stack_lookups:
                take = keys[: stack_lookups - stack_have]
                stack_parts.append(take)
                stack_have += take.shape[0]
        tables = []
        all_freq = []
        for t in range(ntab):
            ids, cnt = acc[t].result()
            all_freq.append(cnt)
            lk_t = int(cnt.sum())
            tables.append(TableStats(t, int(tr.table_sizes[t]), lk_t, int(cnt.shape[0]),
                                     round(lk_t / samples, 4) if samples else 0.0,
                                     fit_zipf_alpha(cnt)))
        freq = np.sort(np.concatenate(all_freq))[::-1] if all_freq else np.empty(0, dtype=np.int64)
        stack_keys = np.concatenate(stack_parts) if stack_parts else np.empty(0, dtype=np.int64)
        return TraceStats(
            path=getattr(tr, "path", None), metadata=tr.metadata, batches=len(tr), samples=samples,
            lookups=int(sum(per_lookups)), distinct=int(freq.shape[0]), reuse_rows=rows,
            reuse_lookups=lks, lookups_per_batch=np.array(per_lookups, dtype=np.int64),
            unique_per_batch=np.array(per_unique, dtype=np.int64), tables=tables,
            zipf_alpha=fit_zipf_alpha(freq), stack=_stack_summary(stack_keys),
            working_set=(np.array(ws_x), np.array(ws_y)) if bits is not None else None,
            rank_frequency=freq,
            batch_reuse_rows=np.array(per_rows, dtype=np.int64).reshape(-1, NUM_REUSE_BINS),
            batch_reuse_lookups=np.array(per_lks, dtype=np.int64).reshape(-1, NUM_REUSE_BINS))
    finally:
        if own:
            tr.close()


def read_locality_stats(path) -> list[dict]:
    """Parse a dlrm_datasets ``locality_stats.txt``: one dict per file block with ``file``,
    ``lookups``, ``distinct``, ``avg_reuse``, ``rows`` and ``lookups_share`` (17 shares each)."""
    from sdm.trace.format import TraceFormatError, input_file

    blocks, cur, mode = [], None, None
    path = input_file(path, "locality_stats file")
    with open(path, encoding="utf-8", errors="replace") as fh:  # undecodable bytes fail to parse below
        for lineno, line in enumerate(fh, 1):
            s = line.strip()
            if not s:
                continue
            try:
                if s.endswith(".pt"):
                    cur = {"file": s, "rows": [], "lookups_share": []}
                    blocks.append(cur)
                elif s.startswith("Avg # of indices:"):
                    cur["lookups"] = int(s.split(":")[1])
                elif s.startswith("Avg # of unique cols:"):
                    cur["distinct"] = int(s.split(":")[1])
                elif s.startswith("Avg col size:"):
                    cur["avg_reuse"] = float(s.split(":")[1])
                elif s.startswith("Histogram of col sizes"):
                    mode = "rows"
                elif s.startswith("Ratio of index distribution"):
                    mode = "lookups_share"
                elif s.startswith("(") and ":" in s:
                    cur[mode].append(float(s.rsplit(":", 1)[1]))
            except (ValueError, TypeError, KeyError) as exc:
                raise TraceFormatError(f"{path}: line {lineno}: cannot parse {s!r} ({exc})",
                                       field=f"line {lineno}") from None
    return blocks


def table_stack_distribution(trace, table: int = 0, *, max_lookups: int | None = None):
    """Fit the reference DLRM stack-distance distribution to one table of a trace (the
    profiling step whose output ``write_dist_file`` saves and the ``stack-distance`` profile
    replays). Uses the first ``max_lookups`` lookups of the table (all when None)."""
    from sdm.trace.stackdist import fit_stack_distance

    own = not isinstance(trace, Trace)
    tr = load(trace) if own else trace
    try:
        if not 0 <= table < tr.num_tables:
            raise InvalidArgumentError(f"table {table} out of range; the trace has {tr.num_tables} "
                                       f"tables")
        parts, have = [], 0
        for batch in tr:
            ix = np.asarray(batch.indices[table], dtype=np.int64)
            if max_lookups is not None:
                ix = ix[: max_lookups - have]
            parts.append(ix)
            have += ix.shape[0]
            if max_lookups is not None and have >= max_lookups:
                break
        keys = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        if keys.size == 0:
            raise InvalidArgumentError(f"table {table} has no lookups to profile")
        return fit_stack_distance(keys)
    finally:
        if own:
            tr.close()

"""Placement from a trace profile: what DRAM pins, and how SCM row files order their rows.

A :class:`~sdm.store.placement.Placement` is computed by :func:`plan` from the access counts of a trace and
consumed by the hierarchy (tables and rows pinned in DRAM) and by
:class:`sdm.tiers.mmap.MmapTier` (``row_order``: the SCM row file in placement order, so rows
looked up together share device blocks, after Bandana).

Pinning rule (:func:`plan`): candidates are every table the profile touches (value = all its
lookups, cost = its bytes) and every touched row (value = its lookups, cost = its row bytes);
they are taken greedily in descending lookups per byte, skipping any that no longer fits the
pin budget ``pin_fraction * dram_bytes``. Pinning a table whole releases the row pins it
already holds (so it costs its bytes minus theirs) and later rows of it are skipped.

Block layout: see :func:`plan` (``layout=``). :func:`blocks_per_lookup` measures what a
layout saves: the SCM blocks a cold cache would read per lookup, batch by batch.
"""

from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from sdm.devices import count_blocks
from sdm.errors import ConfigError, InvalidArgumentError
from sdm.kernels.hashmap import finalize64_many
from sdm.kernels.jit import jit
from sdm.store.placement import LAYOUTS, Placement
from sdm.tiers.manifest import TableSpec
from sdm.validate import INT64_MAX, check_choice, check_int, check_number

__all__ = ["plan", "blocks_per_lookup"]

# Rows of lookups buffered per table before they are merged into the running counts: bounds
# the profile's memory to the touched rows plus this buffer.
_MERGE_IDS = 1 << 22
_MAX_BYTES = INT64_MAX  # byte counts are int64 in the profile arithmetic


# -- trace access ---------------------------------------------------------------------------

def _open_trace(trace):
    """(trace object, close it afterwards?) from a Trace-like object or a path."""
    if isinstance(trace, (str, os.PathLike)):
        from sdm.trace.format import load

        return load(trace), True
    if not hasattr(trace, "table_sizes") or not hasattr(trace, "__len__"):
        raise InvalidArgumentError(f"trace must be an sdm.trace.Trace, a generated trace or a path, "
                                   f"got {type(trace).__name__}")
    return trace, False


def _batch(trace, i: int):
    return trace.batch(i) if hasattr(trace, "batch") else trace[i]


def _check_tables(trace, tables: Mapping[str, TableSpec]) -> list[TableSpec]:
    if not isinstance(tables, Mapping):
        raise InvalidArgumentError(f"tables must map names to TableSpec, got {type(tables).__name__}")
    specs = list(tables.values())
    for name, spec in tables.items():
        if not isinstance(spec, TableSpec):
            raise InvalidArgumentError(f"tables[{name!r}] must be a TableSpec, got {type(spec).__name__}")
    sizes = np.asarray(trace.table_sizes, dtype=np.int64)
    if sizes.shape[0] != len(specs):
        names = list(tables)
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise ConfigError(f"the trace has {sizes.shape[0]} tables, the store {len(specs)} "
                          f"({shown}); trace table t must be the store's t-th table")
    for t, spec in enumerate(specs):
        if int(sizes[t]) != spec.num_rows:
            raise ConfigError(f"trace table {t} has {int(sizes[t])} rows, store table {spec.name!r} "
                              f"(table {t}) has {spec.num_rows}")
    return specs


def _batch_range(trace, batches) -> range:
    n = len(trace)
    if batches is None:
        return range(n)
    if isinstance(batches, slice):
        return range(n)[batches]
    if isinstance(batches, range):
        if batches.step != 1 or batches.start < 0 or batches.stop > n:
            raise InvalidArgumentError(f"batches {batches} must be a step-1 range inside [0, {n})")
        return batches
    raise InvalidArgumentError(f"batches must be None, a range or a slice, got {type(batches).__name__}")


# -- blocks per lookup ----------------------------------------------------------------------

def blocks_per_lookup(trace, tables: Mapping[str, TableSpec], *, row_order=None,
                      block_bytes: int = 4096, exclude: "Placement | None" = None,
                      batches=None) -> dict:
    """SCM blocks a cold cache reads per lookup, per table and in total.

    For each batch and table, the batch's distinct ids (less rows pinned by ``exclude``;
    a table ``exclude`` pins whole reads nothing) sit at byte offsets
    ``pos[id] * row_bytes`` of the row file (``pos`` inverts ``row_order[name]``; identity
    without one) and cost every ``block_bytes`` block they touch
    (:func:`sdm.devices.count_blocks`): the reads one batch issues with nothing cached.

    Args:
        trace: an :class:`sdm.trace.Trace`, a generated trace, or a path; trace table ``t`` is
            the ``t``-th table of ``tables``.
        tables: ``{name: TableSpec}`` in store order.
        row_order: ``{name: (num_rows,) int64 permutation}`` (a :class:`Placement`'s), or None.
        block_bytes: the device block, >= 1.
        exclude: a :class:`Placement` whose pinned tables and rows are never read.
        batches: a range or slice of batch indices (default: every batch).

    Returns:
        ``{"tables": {name: counts}, "total": counts, "batches": k}``; counts =
        ``{"blocks", "rows", "lookups", "blocks_per_lookup"}`` where ``rows`` are the distinct
        rows read (summed over batches) and ``lookups`` every lookup of the table, pinned ones
        included, so pins lower the figure.
    """
    block_bytes = check_int(block_bytes, "block_bytes", lo=1, hi=_MAX_BYTES)
    trace, close = _open_trace(trace)
    try:
        specs = _check_tables(trace, tables)
        span = _batch_range(trace, batches)
        if exclude is not None and not isinstance(exclude, Placement):
            raise InvalidArgumentError(f"exclude must be a Placement or None, got {type(exclude).__name__}")
        orders = {} if row_order is None else dict(row_order)
        probe = Placement(row_order=orders)  # validates the orders, caches their inverses
        probe.validate(tables)
        if exclude is not None:
            exclude.validate(tables)
        whole = set(exclude.pinned_tables) if exclude is not None else set()
        pinned = exclude.pinned_rows if exclude is not None else {}
        counts = np.zeros((len(specs), 3), dtype=np.int64)  # blocks, rows, lookups
        for i in span:
            batch = _batch(trace, i)
            for t, spec in enumerate(specs):
                ix = np.asarray(batch.indices[t], dtype=np.int64)
                counts[t, 2] += ix.shape[0]
                if spec.name in whole or not ix.shape[0]:
                    continue
                ids = np.unique(ix)
                pin = pinned.get(spec.name)
                if pin is not None and pin.size:
                    ids = ids[~_member(ids, pin)]
                pos = probe.inverse_order(spec.name)
                if pos is not None:
                    ids = pos[ids]
                counts[t, 0] += count_blocks(ids * spec.row_bytes, spec.row_bytes, int(block_bytes))
                counts[t, 1] += ids.shape[0]
        out = {"tables": {spec.name: _bpl(counts[t]) for t, spec in enumerate(specs)},
               "total": _bpl(counts.sum(axis=0)), "batches": len(span)}
        return out
    finally:
        if close:
            trace.close()


def _bpl(c) -> dict:
    blocks, rows, lookups = (int(x) for x in c)
    return {"blocks": blocks, "rows": rows, "lookups": lookups,
            "blocks_per_lookup": blocks / lookups if lookups else 0.0}


def _member(ids: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """``(n,) bool``: which of ``ids`` are in the sorted unique ``sorted_set``."""
    at = np.searchsorted(sorted_set, ids)
    at[at == sorted_set.shape[0]] = 0
    return sorted_set[at] == ids


# -- the profile ---------------------------------------------------------------------------

class _Profile:
    """Per table: touched ids ``(m,) int64`` sorted, lookups per id, batches touching each id.

    Batches' per-batch counts are buffered and merged when the buffer reaches ``_MERGE_IDS``
    ids, so memory follows the touched rows, never ``num_rows``.
    """

    def __init__(self, num_tables: int):
        empty = np.empty(0, dtype=np.int64)
        self.ids = [empty] * num_tables
        self.count = [empty] * num_tables
        self.presence = [empty] * num_tables
        self._buf: list[list] = [[] for _ in range(num_tables)]
        self._buffered = [0] * num_tables

    def add(self, t: int, ix: np.ndarray) -> None:
        if not ix.shape[0]:
            return
        u, c = np.unique(ix, return_counts=True)
        self._buf[t].append((u, c))
        self._buffered[t] += u.shape[0]
        if self._buffered[t] >= max(_MERGE_IDS, self.ids[t].shape[0]):
            self._merge(t)

    def _merge(self, t: int) -> None:
        parts = self._buf[t]
        if not parts:
            return
        ids = np.concatenate([self.ids[t]] + [u for u, _ in parts])
        cnt = np.concatenate([self.count[t]] + [c for _, c in parts])
        pres = np.concatenate([self.presence[t]] + [np.ones(u.shape[0], np.int64) for u, _ in parts])
        u, inv = np.unique(ids, return_inverse=True)
        self.ids[t] = u
        self.count[t] = np.bincount(inv, weights=cnt, minlength=u.shape[0]).astype(np.int64)
        self.presence[t] = np.bincount(inv, weights=pres, minlength=u.shape[0]).astype(np.int64)
        self._buf[t] = []
        self._buffered[t] = 0

    def finish(self) -> "_Profile":
        for t in range(len(self.ids)):
            self._merge(t)
        return self


def _mix64(x) -> np.ndarray:
    """splitmix64's finalizer over a uint64 array (or scalar): well-spread hashes of batch numbers."""
    return finalize64_many(np.atleast_1d(np.asarray(x, dtype=np.uint64)))


_SEED_BATCH = _mix64(np.array([1, 2], dtype=np.uint64))
_SEED_BAG = _mix64(np.array([3], dtype=np.uint64))[0]


# -- the greedy pin rule -------------------------------------------------------------------

@jit
def _greedy_pins(cand_table, cand_row, cand_bytes, table_bytes, budget):
    # Candidates arrive densest first; a whole table (row -1) absorbs its pinned rows' bytes.
    ntab = table_bytes.shape[0]
    whole = np.zeros(ntab, dtype=np.bool_)
    row_bytes_pinned = np.zeros(ntab, dtype=np.int64)
    take = np.zeros(cand_table.shape[0], dtype=np.bool_)
    left = budget
    for i in range(cand_table.shape[0]):
        t = cand_table[i]
        if whole[t]:
            continue
        if cand_row[i] < 0:
            cost = table_bytes[t] - row_bytes_pinned[t]
            if cost <= left:
                whole[t] = True
                left -= cost
                take[i] = True
        elif cand_bytes[i] <= left:
            take[i] = True
            left -= cand_bytes[i]
            row_bytes_pinned[t] += cand_bytes[i]
    return whole, take


def _choose_pins(specs, prof: _Profile, budget: int):
    """(whole ``(T,) bool``, per-table sorted pinned ids) by the greedy rule of :func:`plan`."""
    ntab = len(specs)
    row_b = np.array([s.row_bytes for s in specs], dtype=np.int64)
    tab_b = np.array([s.row_bytes * s.num_rows for s in specs], dtype=np.int64)
    acc = np.array([int(c.sum()) for c in prof.count], dtype=np.int64)
    touched = np.flatnonzero(acc > 0)
    sizes = [prof.ids[t].shape[0] for t in range(ntab)]
    table = np.concatenate([touched] + [np.full(sizes[t], t, np.int64) for t in range(ntab)])
    row = np.concatenate([np.full(touched.shape[0], -1, np.int64)] + prof.ids)
    hits = np.concatenate([acc[touched]] + prof.count)
    nbytes = np.concatenate([tab_b[touched]] + [np.full(sizes[t], row_b[t], np.int64) for t in range(ntab)])
    kind = (row >= 0).astype(np.int64)  # ties: whole tables first, then store order, then id
    order = np.lexsort((row, table, kind, -(hits / nbytes)))
    whole, take = _greedy_pins(table[order], row[order], nbytes[order], tab_b, np.int64(budget))
    taken = order[take]
    taken = taken[(row[taken] >= 0) & ~whole[table[taken]]]
    taken = taken[np.lexsort((row[taken], table[taken]))]
    cuts = np.searchsorted(table[taken], np.arange(ntab + 1))
    return whole, [row[taken[cuts[t]:cuts[t + 1]]] for t in range(ntab)]


# -- the block layout ------------------------------------------------------------------------

def _layout_order(spec: TableSpec, ids, count, presence, sig, pinned, layout: str) -> np.ndarray:
    """``(num_rows,) int64`` row order: pinned rows, touched rows in layout order, then the
    untouched rows in id order."""
    n = spec.num_rows
    is_pin = _member(ids, pinned) if pinned.size else np.zeros(ids.shape[0], np.bool_)
    if layout == "frequency":
        keys = (ids, -presence, -count)
    else:
        # Half-octave of lookups first (rows read about as often share blocks; on the bundled
        # trace whole octaves did a little worse, quarter octaves no better), then
        # the MinHash of the batches reading the row (rows read by the same batches land
        # together), then of the bags holding it (within those, rows of the same bags side by
        # side); then as "frequency".
        octave = np.floor(np.log2(count) * 2.0).astype(np.int64)
        keys = (ids, -presence, sig[:, 2], -count, sig[:, 1], sig[:, 0], -octave)
    touched = ids[np.lexsort(keys + (~is_pin,))]
    rest = np.ones(n, dtype=np.bool_)
    rest[ids] = False
    return np.concatenate([touched, np.flatnonzero(rest)]).astype(np.int64)


def _signatures(trace, span: range, specs, prof: _Profile) -> list[np.ndarray]:
    """Per table ``(m, 3) uint64`` MinHashes of each touched row: columns 0 and 1 (two hash
    functions) over the set of profile batches reading it, column 2 over the set of bags
    (batch, sample) holding it. Rows with equal sets get equal values (sets with Jaccard
    similarity J agree with probability J)."""
    top = np.iinfo(np.uint64).max
    sigs = [np.full((prof.ids[t].shape[0], 3), top, dtype=np.uint64) for t in range(len(specs))]
    for i in span:
        batch = _batch(trace, i)
        h_batch = _mix64(np.uint64(i) ^ _SEED_BATCH)  # (2,): two hash functions
        for t in range(len(specs)):
            ix = np.asarray(batch.indices[t], dtype=np.int64)
            if not ix.shape[0]:
                continue
            off = np.asarray(batch.offsets[t], dtype=np.int64)
            bag = np.repeat(np.arange(off.shape[0] - 1, dtype=np.uint64), np.diff(off))
            h_bag = _mix64((np.uint64(i) << np.uint64(32)) ^ bag ^ _SEED_BAG)
            by = np.lexsort((h_bag, ix))  # per row, its smallest bag hash first
            first = np.ones(by.shape[0], dtype=np.bool_)
            first[1:] = ix[by[1:]] != ix[by[:-1]]
            at = np.searchsorted(prof.ids[t], ix[by[first]])
            sig = sigs[t]
            sig[at, :2] = np.minimum(sig[at, :2], h_batch)  # `at` is unique: plain fancy assignment
            sig[at, 2] = np.minimum(sig[at, 2], h_bag[by[first]])
    return sigs


# -- plan --------------------------------------------------------------------------------

def plan(trace, tables: Mapping[str, TableSpec], *, dram_bytes: int, pin_fraction: float = 0.5,
         layout: str | None = "coaccess", block_bytes: int = 4096, holdout: float = 0.5) -> Placement:
    """Plan pins and a block layout from a trace's access profile.

    The trace is split in time: the first ``1 - holdout`` of its batches is the profile the
    plan is computed from; the last ``holdout`` (held out) measures it (``holdout=0``
    measures on the profile itself, and ``info`` says so).

    Pins: candidates are every table the profile touches (value = its lookups, cost = its
    ``num_rows * row_bytes``) and every touched row (value = its lookups, cost =
    ``row_bytes``). They are taken in descending lookups per byte (access density; ties: whole
    tables first, then store order, then row id), each skipped when it no longer fits the pin
    budget ``floor(pin_fraction * dram_bytes)``; the rest of ``dram_bytes`` is left to the
    dynamic cache. Pinning a table whole frees the row pins it already holds (it costs its
    bytes minus theirs) and its later rows are skipped. Untouched tables and rows are never
    pinned.

    Layouts (order of rows in the SCM row file; pinned rows first, since DRAM serves them,
    untouched rows last in id order):

    * ``"frequency"``: rows by profile lookups, descending (then by the number of profile
      batches reading them, then id): hot rows packed into few blocks.
    * ``"coaccess"``: rows grouped by half-octave of lookups (``floor(2 * log2(lookups))``),
      within it by a MinHash signature (two hashes) of the set of profile batches reading the
      row, then by a MinHash of the set of bags (batch, sample) holding it, then as ``"frequency"``. Rows read by the
      same batches get equal batch hashes and share blocks (Bandana's co-access idea; the
      objective is distinct blocks per batch), and among them rows of the same bags sit side
      by side; rows that co-occur only by chance stay among rows of similar heat. A second
      pass over the profile batches, one sort, memory linear in the touched rows.
    * ``None``: identity order (no ``row_order`` entries).

    Args:
        trace: an :class:`sdm.trace.Trace`, a generated trace or a path; its table ``t`` is the
            store's ``t``-th table (same ``num_rows``).
        tables: ``{name: TableSpec}`` in store order (``Store.tables``).
        dram_bytes: DRAM for this store, bytes (int >= 0).
        pin_fraction: share of ``dram_bytes`` pins may take, in ``[0, 1]``.
        layout: ``"coaccess"``, ``"frequency"`` or None.
        block_bytes: device block the layout is measured with.
        holdout: share of the trace's batches (the last ones) held out for measurement, in
            ``[0, 1)``.

    Returns:
        A :class:`Placement`; ``info`` holds the budget, each table's accesses, density and
        decision, and blocks per lookup on the held-out batches before (identity order) and
        after (the layout), both with the pinned rows excluded, and their ratio.

    Raises:
        ConfigError: bad arguments, or a trace whose tables do not match the store's.
    """
    dram_bytes = check_int(dram_bytes, "dram_bytes", lo=0, hi=_MAX_BYTES, error=ConfigError)
    pin_fraction = check_number(pin_fraction, "pin_fraction", lo=0, hi=1, error=ConfigError)
    if layout is not None:
        check_choice(layout, "layout", LAYOUTS, error=ConfigError)
    block_bytes = check_int(block_bytes, "block_bytes", lo=1, hi=_MAX_BYTES, error=ConfigError)
    holdout = check_number(holdout, "holdout", lo=0, hi=1, hi_open=True, error=ConfigError)
    trace, close = _open_trace(trace)
    try:
        specs = _check_tables(trace, tables)
        n = len(trace)
        if n == 0:
            raise ConfigError("the trace has no batches to profile")
        cut = max(1, n - int(round(n * float(holdout))))
        profile_span, measure_span = range(0, cut), range(cut, n)
        held_out = len(measure_span) > 0
        if not held_out:
            measure_span = profile_span

        prof = _Profile(len(specs))
        for i in profile_span:
            batch = _batch(trace, i)
            for t in range(len(specs)):
                prof.add(t, np.asarray(batch.indices[t], dtype=np.int64))
        prof.finish()

        budget = int(float(pin_fraction) * int(dram_bytes))
        whole, pins = _choose_pins(specs, prof, budget)
        sigs = _signatures(trace, profile_span, specs, prof) if layout == "coaccess" else None
        orders = {}
        if layout is not None:
            for t, spec in enumerate(specs):
                if prof.ids[t].shape[0]:
                    orders[spec.name] = _layout_order(spec, prof.ids[t], prof.count[t], prof.presence[t],
                                                      None if sigs is None else sigs[t], pins[t], layout)
        pinned_tables = tuple(s.name for t, s in enumerate(specs) if whole[t])
        pinned_rows = {s.name: pins[t] for t, s in enumerate(specs) if pins[t].size}
        pins_only = Placement(pinned_tables, pinned_rows)
        before = blocks_per_lookup(trace, tables, block_bytes=int(block_bytes), exclude=pins_only,
                                   batches=measure_span)
        after = (blocks_per_lookup(trace, tables, row_order=orders, block_bytes=int(block_bytes),
                                   exclude=pins_only, batches=measure_span) if orders else before)
        info = _info(trace, specs, prof, whole, pins, budget, int(dram_bytes), float(pin_fraction),
                     layout, int(block_bytes), profile_span, measure_span, held_out, before, after)
        return Placement(pinned_tables, pinned_rows, orders, info)
    finally:
        if close:
            trace.close()


def _info(trace, specs, prof, whole, pins, budget, dram_bytes, pin_fraction, layout, block_bytes,
          profile_span, measure_span, held_out, before, after) -> dict:
    tables = {}
    pinned_bytes = 0
    for t, spec in enumerate(specs):
        nbytes = spec.num_rows * spec.row_bytes
        acc = int(prof.count[t].sum())
        if whole[t]:
            decision, pb, pacc = "pinned whole", nbytes, acc
        else:
            pb = int(pins[t].shape[0]) * spec.row_bytes
            pacc = int(prof.count[t][np.searchsorted(prof.ids[t], pins[t])].sum()) if pins[t].size else 0
            decision = f"{pins[t].shape[0]} rows pinned" if pins[t].size else "cached"
        pinned_bytes += pb
        b, a = before["tables"][spec.name], after["tables"][spec.name]
        tables[spec.name] = {
            "rows": spec.num_rows, "row_bytes": spec.row_bytes, "bytes": nbytes, "accesses": acc,
            "touched_rows": int(prof.ids[t].shape[0]), "density": acc / nbytes,
            "decision": decision, "pinned_whole": bool(whole[t]),
            "pinned_rows": 0 if whole[t] else int(pins[t].shape[0]), "pinned_bytes": pb,
            "pinned_accesses": pacc,
            "blocks_per_lookup_before": b["blocks_per_lookup"],
            "blocks_per_lookup_after": a["blocks_per_lookup"],
        }
    tb, ta = before["total"]["blocks_per_lookup"], after["total"]["blocks_per_lookup"]
    src = getattr(trace, "path", None) or getattr(trace, "metadata", {}).get("profile")
    return {
        "trace": None if src is None else str(src),
        "dram_bytes": dram_bytes, "pin_fraction": pin_fraction, "pin_budget_bytes": budget,
        "pinned_bytes": pinned_bytes, "layout": layout, "block_bytes": block_bytes,
        "profile_batches": [profile_span.start, profile_span.stop],
        "measured_batches": [measure_span.start, measure_span.stop],
        "held_out": held_out,
        "measured_on": ("held-out batches (planned on the first part of the trace, measured on "
                        "the rest)" if held_out else "the profile batches themselves (in-sample)"),
        "tables": tables,
        "blocks_per_lookup": {
            "note": "SCM blocks a cold cache reads per lookup; pinned rows and tables excluded; "
                    "before = identity row order, after = the planned layout",
            "before": before, "after": after,
            "reduction": tb / ta if ta else (1.0 if tb == 0 else float("inf")),
        },
    }

"""The tier contract: batch-first reads of raw rows into a caller-provided buffer.

A tier never interprets row bytes (formats are the kernels' business) and never does
per-row work in Python. Optional abilities are properties, as zarr's stores do:
``holds_all_rows`` (False: a :class:`CacheTier`, which serves some rows and forwards the
rest to the tier below), ``supports_direct_io`` (:meth:`Tier.read_rows_direct`) and
``supports_load_table`` (:meth:`Tier.load_table`). Every method a hierarchy calls is
declared here, so a hierarchy never asks what type a tier is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple, Sequence

import numpy as np

from sdm.tiers.manifest import TableLayout


class Bags(NamedTuple):
    """One table's bags of a request, validated, and where to pool them.

    ``indices`` ``(nnz,)`` int32/int64 ids; ``offsets`` ``(B + 1,)`` int64 CSR bag
    boundaries; ``weights`` ``(nnz,)`` float32 per-sample weights or None; ``mean``: average
    instead of sum; ``out`` ``(B, dim)`` float32, overwritten.
    """

    layout: TableLayout
    indices: np.ndarray
    offsets: np.ndarray
    weights: np.ndarray | None
    mean: bool
    out: np.ndarray


class Tier(ABC):
    """A place rows of a store's tables live.

    Subclasses set ``name`` (shown in ``stats()``) and ``kind`` (the medium: ``dram``,
    ``cache``, ``mmap``, ``lmdb``) and implement :meth:`read_rows` and :meth:`row_offsets`.
    """

    name: str = "tier"
    kind: str = "tier"

    #: True when the tier serves every row of every written table (a backing tier). A tier
    #: that holds only some rows (a cache) reports misses instead.
    holds_all_rows: bool = True

    #: True when the tier can read its medium with O_DIRECT (:meth:`read_rows_direct`),
    #: bypassing the page cache so a real device is measured.
    supports_direct_io: bool = False

    #: True when :meth:`load_table` returns a whole table at once (a DRAM tier loads from it).
    supports_load_table: bool = False

    @abstractmethod
    def read_rows(self, layout: TableLayout, ids: np.ndarray, out: np.ndarray) -> None:
        """Copy rows ``ids`` of ``layout``'s table into ``out``.

        Args:
            layout: the table.
            ids: ``(n,)`` int64, sorted, unique, each in ``[0, num_rows)`` (validated by
                the caller; tiers trust it).
            out: ``(n, row_bytes)`` uint8, C-contiguous; row ``k`` receives row ``ids[k]``.

        Returns:
            None when every row came from this tier's own medium; a tier holding only some
            rows (a cache) returns a ``(n,) bool`` mask of the rows it served itself, the
            rest having come from the tier below it. A device model charges only those.

        Raises:
            CorruptStoreError: the backing medium fails its checksum.
        """

    def read_many(self, reads: Sequence[tuple[TableLayout, np.ndarray, np.ndarray]]) -> None:
        """:meth:`read_rows` of several tables at once: ``reads`` holds ``(layout, ids, out)``
        per table (a table at most once). A device model charges each table's reads as a
        batch of its own, one after another, as the host model and the sweep do."""
        for layout, ids, out in reads:
            self.read_rows(layout, ids, out)

    def read_rows_direct(self, layout: TableLayout, ids: np.ndarray, out: np.ndarray, *,
                         queue_depth: int = 1) -> None:
        """:meth:`read_rows` with real O_DIRECT block reads, ``queue_depth`` in flight.

        Only tiers with ``supports_direct_io`` implement it.
        """
        raise NotImplementedError(f"tier {self.name!r} has no direct IO path")

    def load_table(self, layout: TableLayout) -> np.ndarray:
        """Every row of ``layout``'s table, ``(num_rows, row_bytes) uint8``, a new array.

        Only tiers with ``supports_load_table`` implement it.
        """
        raise NotImplementedError(f"tier {self.name!r} cannot load a whole table")

    @abstractmethod
    def row_offsets(self, layout: TableLayout, ids: np.ndarray) -> np.ndarray:
        """Byte offset of each row of ``ids`` in this tier's medium, ``(n,) int64``.

        A device model maps ``[offset, offset + row_bytes)`` onto whole device blocks to
        count reads and read amplification; rows of one table never interleave with
        another's.
        """

    def serves(self, layout: TableLayout) -> bool:
        """True when lookups of ``layout``'s table start at this tier. A hierarchy serves a
        table from its first tier that serves it: a tier of pinned tables in front of the
        cache serves only those."""
        return True

    @property
    def medium(self) -> "Tier":
        """This tier without any device model around it: where setup work (loading pinned
        rows) reads without being charged. Wrappers return their inner tier's medium."""
        return self

    def resident(self, layout: TableLayout) -> np.ndarray | None:
        """The whole table as ``(num_rows, row_bytes) uint8`` when this tier keeps it in
        memory (so kernels may pool from it directly), else None."""
        return None

    def count_hits(self, n: int, layout: TableLayout) -> None:
        """Record ``n`` lookups of ``layout``'s table pooled straight from :meth:`resident`
        (no copy through read_rows); a device model charges them."""

    def invalidate(self, layout: TableLayout) -> None:
        """Forget anything held for ``layout``'s table; its rows have changed."""

    def rows_changed(self, layout: TableLayout, ids: np.ndarray) -> None:
        """Rows ``ids`` (sorted, unique int64) of ``layout``'s table were updated in the
        durable copy (the tiers below already serve the new ones): forget or refresh any
        copy of them held here."""

    def stats(self) -> dict:
        """Counters of this tier (see ``Store.stats``)."""
        return {}

    def close(self) -> None:
        """Release the tier's resources."""


class CacheTier(Tier):
    """A tier holding only some rows (``holds_all_rows`` False): hits are served from its
    slots, misses read from :attr:`lower` and admitted by its policy.

    Beyond the tier contract a cache pools bags straight from its slots, and pins rows:
    for good (a placement's hot rows) or until released (a prefetch).
    """

    holds_all_rows = False
    kind = "cache"

    #: The tier misses are read from.
    lower: Tier

    @abstractmethod
    def pool_bags(self, bags: Sequence[Bags]) -> int:
        """Pool every table's bags of one request straight from the cache's slots, each into
        its ``out``, in one probe of the request's distinct rows.

        Args:
            bags: one :class:`Bags` per table, validated by the caller, at most one per table.

        Returns:
            The distinct rows of the request that hit.
        """

    @abstractmethod
    def pin_rows(self, layout: TableLayout, ids: np.ndarray, *, source: Tier | None = None) -> None:
        """Load rows ``ids`` (sorted, unique int64) from ``source`` (default :attr:`lower`)
        and pin them for good; they count against the capacity."""

    @abstractmethod
    def prefetch(self, layout: TableLayout, ids: np.ndarray) -> int:
        """Bring rows ``ids`` (sorted, unique int64) in ahead of use and pin them until
        :meth:`release`; returns the rows read from :attr:`lower`."""

    @abstractmethod
    def release(self, layout: TableLayout, ids: np.ndarray) -> None:
        """Unpin rows ``ids`` a :meth:`prefetch` pinned."""

"""The tier contract: batch-first reads of raw rows into a caller-provided buffer.

A tier never interprets row bytes (formats are the kernels' business) and never does
per-row work in Python. Optional abilities are properties, as zarr's stores do.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from sdm.manifest import TableLayout


class Tier(ABC):
    """A place rows of a store's tables live.

    Subclasses set ``name`` (shown in ``stats()``) and implement :meth:`read_rows` and
    :meth:`row_offsets`.
    """

    name: str = "tier"

    #: True when the tier serves every row of every written table (a backing tier). A tier
    #: that holds only some rows (a cache) reports misses instead.
    holds_all_rows: bool = True

    #: True when the tier can read its medium with O_DIRECT (:meth:`read_rows_direct`),
    #: bypassing the page cache so a real device is measured.
    supports_direct_io: bool = False

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

    def read_rows_direct(self, layout: TableLayout, ids: np.ndarray, out: np.ndarray, *,
                         queue_depth: int = 1) -> None:
        """:meth:`read_rows` with real O_DIRECT block reads, ``queue_depth`` in flight.

        Only tiers with ``supports_direct_io`` implement it.
        """
        raise NotImplementedError(f"tier {self.name!r} has no direct IO path")

    @abstractmethod
    def row_offsets(self, layout: TableLayout, ids: np.ndarray) -> np.ndarray:
        """Byte offset of each row of ``ids`` in this tier's medium, ``(n,) int64``.

        A device model maps ``[offset, offset + row_bytes)`` onto whole device blocks to
        count reads and read amplification; rows of one table never interleave with
        another's.
        """

    def resident(self, layout: TableLayout) -> np.ndarray | None:
        """The whole table as ``(num_rows, row_bytes) uint8`` when this tier keeps it in
        memory (so kernels may pool from it directly), else None."""
        return None

    def count_hits(self, n: int) -> None:
        """Record ``n`` rows pooled straight from :meth:`resident` (no copy through read_rows)."""

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

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

    @abstractmethod
    def read_rows(self, layout: TableLayout, ids: np.ndarray, out: np.ndarray) -> None:
        """Copy rows ``ids`` of ``layout``'s table into ``out``.

        Args:
            layout: the table.
            ids: ``(n,)`` int64, sorted, unique, each in ``[0, num_rows)`` (validated by
                the caller; tiers trust it).
            out: ``(n, row_bytes)`` uint8, C-contiguous; row ``k`` receives row ``ids[k]``.

        Raises:
            CorruptStoreError: the backing medium fails its checksum.
        """

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

    def invalidate(self, layout: TableLayout) -> None:
        """Forget anything held for ``layout``'s table; its rows have changed."""

    def stats(self) -> dict:
        """Counters of this tier (see ``Store.stats``)."""
        return {}

    def close(self) -> None:
        """Release the tier's resources."""

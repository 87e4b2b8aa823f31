"""The sparse arch of DLRM: one sum-pooled embedding bag per table.

Rows come either from tables the model holds (``(rows, dim)`` float32 arrays, pooled with
the Numba kernels of :mod:`sdm.kernels.pooling`) or from an :class:`sdm.Store` of any hierarchy.
A randomly initialized model need not hold its tables at all: rows are generated on demand
from a seed, block by block, so a store for a 100 GB preset can be written with memory
bounded by one block.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from sdm.errors import ConfigError, InvalidArgumentError, InvalidOffsetsError
from sdm.kernels.pooling import check_ids, check_offsets, pool

__all__ = ["SparseArch", "GEN_BLOCK_ROWS"]

# Rows generated per seeded block; any chunking aligned to it yields the same rows.
GEN_BLOCK_ROWS = 1 << 16


class SparseArch:
    """Embedding tables, all of width ``dim``, held as arrays or generated from a seed.

    Args:
        tables: ``(rows_k, dim)`` float arrays, one per table; or None with ``table_sizes``,
            ``dim`` and ``seed`` for seeded tables that are not allocated until asked.
        names: table names (default ``emb_0, emb_1, ...``), the names used in a store.

    Raises:
        ConfigError: no tables, tables of different widths or not 2-D, bad sizes.
    """

    def __init__(self, tables: Sequence | None = None, *, table_sizes: Sequence[int] | None = None,
                 dim: int | None = None, seed: int | None = None, names: Sequence[str] | None = None):
        if tables is not None:
            arrays = []
            for k, t in enumerate(tables):
                t = np.asarray(t)
                if t.ndim != 2 or t.shape[0] < 1 or t.shape[1] < 1:
                    raise ConfigError(f"embedding table {k} must be 2-D (rows >= 1, dim >= 1), got shape {t.shape}")
                if not np.issubdtype(t.dtype, np.floating):
                    raise ConfigError(f"embedding table {k} must be floating, got dtype {t.dtype}")
                arrays.append(np.ascontiguousarray(t, dtype=np.float32))
            if not arrays:
                raise ConfigError("a DLRM needs at least one embedding table, got none")
            dims = sorted({a.shape[1] for a in arrays})
            if len(dims) != 1:
                raise ConfigError(f"every embedding table must have the same dim, got dims {dims}")
            if dim is not None and dim != dims[0]:
                raise ConfigError(f"dim {dim} does not match the tables' {dims[0]} columns")
            self._tables: list[np.ndarray] | None = arrays
            self.table_sizes = tuple(a.shape[0] for a in arrays)
            self.dim = dims[0]
            self.seed = seed
        else:
            if table_sizes is None or dim is None or seed is None:
                raise ConfigError("seeded tables need table_sizes, dim and seed")
            sizes = tuple(int(n) for n in table_sizes)
            if not sizes:
                raise ConfigError("a DLRM needs at least one embedding table, got none")
            if min(sizes) < 1 or int(dim) < 1:
                raise ConfigError(f"table sizes and dim must be >= 1, got sizes {sizes[:8]}..., dim {dim}")
            self._tables = None
            self.table_sizes = sizes
            self.dim = int(dim)
            self.seed = int(seed)
        if names is None:
            names = [f"emb_{k}" for k in range(len(self.table_sizes))]
        names = [str(n) for n in names]
        if len(names) != len(self.table_sizes) or len(set(names)) != len(names):
            raise ConfigError(f"need {len(self.table_sizes)} distinct table names, got {names}")
        self.names = tuple(names)

    @property
    def num_tables(self) -> int:
        return len(self.table_sizes)

    @property
    def materialized(self) -> bool:
        """Whether the tables are held in memory (else they are generated when asked)."""
        return self._tables is not None

    @property
    def tables(self) -> list[np.ndarray]:
        """The ``(rows_k, dim)`` float32 tables; raises if they are not materialized."""
        if self._tables is None:
            raise InvalidArgumentError(
                f"the {self.num_tables} tables ({sum(self.table_sizes)} rows x {self.dim}) are not "
                f"materialized; call model.materialize() or pass embeddings=<sdm.Store>")
        return self._tables

    def materialize(self) -> None:
        """Allocate and fill every seeded table (``4 * dim * rows`` bytes)."""
        if self._tables is None:
            self._tables = [np.concatenate(list(self.chunks(k))) for k in range(self.num_tables)]

    def chunks(self, k: int, rows_per_chunk: int = GEN_BLOCK_ROWS) -> Iterator[np.ndarray]:
        """Rows of table ``k`` as ``(<= rows_per_chunk, dim)`` float32 chunks, in order."""
        n = self.table_sizes[k]
        if self._tables is not None:
            for i in range(0, n, rows_per_chunk):
                yield self._tables[k][i:i + rows_per_chunk]
            return
        # Seeded rows: uniform in +-sqrt(1 / rows), like the reference's create_emb. Each
        # block of GEN_BLOCK_ROWS rows has its own generator, so the rows do not depend on
        # how they are chunked.
        bound = np.float32(np.sqrt(1.0 / n))
        for start in range(0, n, GEN_BLOCK_ROWS):
            rng = np.random.default_rng([self.seed, 2, k, start // GEN_BLOCK_ROWS])
            rows = min(GEN_BLOCK_ROWS, n - start)
            block = rng.random((rows, self.dim), dtype=np.float32)
            block *= 2 * bound
            block -= bound
            yield block

    # -- lookups -------------------------------------------------------------------------

    def check(self, sparse, batch: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Validate one batch: ``sparse`` holds one ``(indices, offsets)`` per table (a
        sequence in table order, or a mapping by table name); every offsets array must have
        ``batch + 1`` entries. Returns contiguous ``(int64/int32 ids, int64 offsets)`` pairs."""
        if isinstance(sparse, Mapping):
            missing = [n for n in self.names if n not in sparse]
            extra = [n for n in sparse if n not in self.names]
            if missing or extra:
                raise InvalidArgumentError(
                    f"sparse must have one entry per table {list(self.names)}; missing {missing}, "
                    f"unknown {extra}")
            sparse = [sparse[n] for n in self.names]
        elif isinstance(sparse, (str, bytes)) or not isinstance(sparse, Sequence):
            raise InvalidArgumentError(
                f"sparse must be a sequence of (indices, offsets), one per table; got {type(sparse).__name__}")
        if len(sparse) != self.num_tables:
            raise InvalidArgumentError(
                f"sparse has {len(sparse)} (indices, offsets) pairs but the model has "
                f"{self.num_tables} tables")
        checked = []
        for k, pair in enumerate(sparse):
            name = self.names[k]
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise InvalidArgumentError(f"sparse[{k}] (table {name!r}) must be (indices, offsets)")
            offsets = np.asarray(pair[1])
            if offsets.ndim != 1 or offsets.shape[0] != batch + 1:
                raise InvalidOffsetsError(
                    f"offsets of table {name!r} have shape {offsets.shape}; the batch has {batch} "
                    f"samples (dense_x rows), so offsets need {batch + 1} entries (CSR, B + 1)")
            ids = check_ids(pair[0], self.table_sizes[k], what=f"index of table {name!r}")
            checked.append((ids, check_offsets(offsets, ids.shape[0])))
        return checked

    def pool_into(self, checked, out: np.ndarray) -> None:
        """Sum-pool validated bags from the model's tables into ``out (t, B, dim)`` float32."""
        for k, pair in enumerate(checked):
            self.pool_table(k, pair, out[k])

    def pool_table(self, k: int, pair, out: np.ndarray) -> None:
        """Sum-pool validated ``(ids, offsets)`` of table ``k`` into ``out (B, dim)`` float32."""
        pool(self.tables[k], pair[0], pair[1], None, False, "fp32", out)

    def check_store(self, store) -> None:
        """Raise unless ``store`` holds every table of the model with the same rows and dim."""
        if not hasattr(store, "embedding_bags") or not hasattr(store, "tables"):
            raise InvalidArgumentError(f"embeddings must be an sdm.Store or None, got {type(store).__name__}")
        have = store.tables
        for name, rows in zip(self.names, self.table_sizes):
            spec = have.get(name)
            if spec is None:
                raise ConfigError(f"the store has no table {name!r}; it holds {list(have)}")
            if spec.num_rows != rows or spec.dim != self.dim:
                raise ConfigError(
                    f"store table {name!r} is {spec.num_rows} x {spec.dim} but the model's is {rows} x {self.dim}")

    def pool_store_into(self, store, checked, out: np.ndarray) -> None:
        """Sum-pool validated bags through ``store`` into ``out (t, B, dim)`` float32."""
        pooled = store.embedding_bags({n: c for n, c in zip(self.names, checked)})
        for k, name in enumerate(self.names):
            out[k] = pooled[name]

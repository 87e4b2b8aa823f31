"""A PyTorch-free DLRM (Naumov et al. 2019) for inference over sdm stores.

Split like torchrec: a dense arch (bottom MLP over dense features), a sparse arch (one
sum-pooled embedding bag per table, from the model's own tables or a :class:`sdm.Store`),
an interaction (``dot`` or ``cat``) and an over arch (top MLP ending in a sigmoid).

The embedding lookups run in a worker thread while the main thread runs the bottom MLP:
the Numba pooling kernels and numpy's BLAS both release the GIL, so the two overlap as IO
and dense compute do in the SDM paper. ``overlap=False`` runs them one after the other, to
measure what the overlap saves.

Tables are pooled in parallel *across tables* (each worker thread takes the next table and
pools it with one Numba thread) rather than inside each table's kernel: a per-table
parallel kernel ends in a barrier, and when another process holds a core every barrier
waits a scheduler slice for the descheduled thread (measured on the 2-core test machine
under load: 8 tables, B = 2048, 20 lookups per bag, 63 ms kernel-parallel vs 25 ms
table-parallel). ``table_parallel=False`` restores the per-kernel split.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from functools import partial

import numba
import numpy as np

from sdm.errors import ConfigError, InvalidArgumentError
from sdm.validate import check_choice, check_int
from sdm.model.interaction import interact
from sdm.model.mlp import MLP, init_mlp
from sdm.model.presets import INTERACTIONS, ModelPreset, get_preset, interaction_width
from sdm.model.profile import Profiler, StageTimes
from sdm.model.sparse import SparseArch
from sdm.store.store import Store, TableSpec

__all__ = ["DLRM"]


class DLRM:
    """DLRM inference in numpy.

    Args:
        bottom: the dense arch, an :class:`MLP` with ReLU on every layer.
        sparse: the embedding tables, a :class:`SparseArch`.
        top: the over arch, an :class:`MLP` whose last layer has a sigmoid and width 1.
        interaction: ``"dot"`` or ``"cat"``.
        self_interaction: with ``dot``, keep each feature's dot product with itself.
        overlap: run lookups beside the bottom MLP by default (``forward`` may override).
        lookup_threads: threads for the embedding lookups; None uses the caller's
            ``numba.get_num_threads()``. Fewer leaves cores to BLAS while lookups overlap
            the bottom MLP.
        table_parallel: spread tables over ``lookup_threads`` worker threads (one Numba
            thread each) instead of running each table's kernel on all of them.

    Raises:
        ConfigError: widths that do not fit, naming them: the bottom MLP's output must equal
            the embedding dim for ``dot``; the top MLP's input must equal the interaction's
            output width; the top MLP must end in one unit.
    """

    def __init__(self, bottom: MLP, sparse: SparseArch, top: MLP, *, interaction: str = "dot",
                 self_interaction: bool = False, overlap: bool = True,
                 lookup_threads: int | None = None, table_parallel: bool = True):
        check_choice(interaction, "interaction", INTERACTIONS, error=ConfigError)
        if interaction == "dot" and bottom.out_width != sparse.dim:
            raise ConfigError(
                f"bottom MLP output width {bottom.out_width} != embedding dim {sparse.dim}; "
                f"the dot interaction needs them equal")
        want = interaction_width(interaction, bottom.out_width, sparse.dim, sparse.num_tables,
                                 self_interaction)
        if top.in_width != want:
            raise ConfigError(
                f"top MLP input width {top.in_width} != {want}, the width of the {interaction} "
                f"interaction of a {bottom.out_width}-wide bottom output with {sparse.num_tables} "
                f"tables of dim {sparse.dim}" + (" (with self-interaction)" if self_interaction else ""))
        if top.out_width != 1:
            raise ConfigError(f"top MLP must end in 1 unit (the click logit), got {top.out_width}")
        self.bottom = bottom
        self.sparse = sparse
        self.top = top
        self.interaction = interaction
        self.self_interaction = bool(self_interaction)
        self.overlap = bool(overlap)
        self.lookup_threads = None if lookup_threads is None else check_int(
            lookup_threads, "lookup_threads", lo=1, hi=numba.config.NUMBA_NUM_THREADS, error=ConfigError)
        self.table_parallel = bool(table_parallel)
        self._pool_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._executor_pid = None

    # -- construction ------------------------------------------------------------------

    @classmethod
    def from_arrays(cls, bottom_weights, bottom_biases, top_weights, top_biases, tables, *,
                    interaction: str = "dot", self_interaction: bool = False, names=None,
                    overlap: bool = True) -> "DLRM":
        """Build from torch-layout arrays: ``W_i (out, in)``, ``b_i (out,)``, tables
        ``(rows_k, dim)``."""
        return cls(MLP(bottom_weights, bottom_biases, last="relu", name="bottom MLP"),
                   SparseArch(tables, names=names),
                   MLP(top_weights, top_biases, last="sigmoid", name="top MLP"),
                   interaction=interaction, self_interaction=self_interaction, overlap=overlap)

    @classmethod
    def random(cls, arch, *, seed: int = 0, materialize: bool | None = None,
               overlap: bool = True) -> "DLRM":
        """A seeded, randomly initialized model of ``arch`` (a :class:`ModelPreset` or the
        name of one in ``PRESETS``), initialized as the reference DLRM: MLP weights normal
        with std ``sqrt(2 / (fan_in + fan_out))``, biases with std ``sqrt(1 / fan_out)``,
        embedding rows uniform in ``+-sqrt(1 / rows)``.

        ``materialize``: allocate the tables now (True), or generate rows only when asked
        (:meth:`to_store`, :meth:`materialize`) (False). None allocates only when the tables
        fit in 256 MiB, so a 100 GB preset costs nothing until a store is built from it.
        """
        p = get_preset(arch)
        if materialize is None:
            materialize = p.table_bytes_fp32 <= (256 << 20)
        bottom = init_mlp(p.bottom, lambda i: np.random.default_rng([seed, 0, i]),
                          last="relu", name="bottom MLP")
        top = init_mlp(p.top_widths, lambda i: np.random.default_rng([seed, 1, i]),
                       last="sigmoid", name="top MLP")
        sparse = SparseArch(table_sizes=p.table_sizes, dim=p.dim, seed=seed)
        model = cls(bottom, sparse, top, interaction=p.interaction,
                    self_interaction=p.self_interaction, overlap=overlap)
        if materialize:
            model.materialize()
        return model

    from_preset = random

    def materialize(self) -> "DLRM":
        """Allocate the seeded tables in memory (a no-op for a model that holds them)."""
        self.sparse.materialize()
        return self

    @property
    def arch(self) -> ModelPreset:
        """This model's architecture as a :class:`ModelPreset` (named ``custom``)."""
        return ModelPreset("custom", self.sparse.dim, self.bottom.widths, self.top.widths[1:],
                           self.sparse.table_sizes, 0, self.interaction, self.self_interaction)

    @property
    def num_dense(self) -> int:
        return self.bottom.in_width

    @property
    def num_tables(self) -> int:
        return self.sparse.num_tables

    def __repr__(self):
        return (f"DLRM(bottom={'-'.join(map(str, self.bottom.widths))}, "
                f"top={'-'.join(map(str, self.top.widths))}, tables={self.num_tables} x dim "
                f"{self.sparse.dim}, interaction={self.interaction!r}"
                f"{', self_interaction=True' if self.self_interaction else ''})")

    # -- store ---------------------------------------------------------------------------

    def table_specs(self, fmt: str = "fp32") -> list[TableSpec]:
        """One :class:`sdm.TableSpec` per table, named as the model names them."""
        return [TableSpec(n, rows, self.sparse.dim, fmt)
                for n, rows in zip(self.sparse.names, self.sparse.table_sizes)]

    def to_store(self, path, *, fmt: str = "fp32", config=None, progress: bool | None = None) -> Store:
        """Create a store at ``path`` holding this model's tables in row format ``fmt`` and
        return it open with hierarchy ``config``. Rows are written chunk by chunk (generated
        on the fly for unmaterialized tables), so memory stays bounded by one chunk.

        Raises:
            StoreExistsError: ``path`` exists. InvalidArgumentError: an unknown ``fmt``.
        """
        store = Store.create(path, self.table_specs(fmt), config=config)
        try:
            for k, name in enumerate(self.sparse.names):
                store.write_table(name, self.sparse.chunks(k), progress=progress)
        except BaseException:
            store.close()
            raise
        return store

    # -- inference -----------------------------------------------------------------------

    def forward(self, dense_x, sparse, *, embeddings: Store | None = None,
                profile: Profiler | None = None, overlap: bool | None = None) -> np.ndarray:
        """Click probabilities of a batch.

        Args:
            dense_x: ``(B, num_dense)`` float dense features (already preprocessed, see
                :func:`sdm.model.preprocess_dense`); cast to float32.
            sparse: one ``(indices, offsets)`` per table, in table order (or a mapping by
                table name): ``indices (nnz,)`` int ids, ``offsets (B + 1,)`` int64 CSR.
            embeddings: an :class:`sdm.Store` holding the model's tables (any hierarchy), or
                None to pool from the tables the model holds.
            profile: a :class:`Profiler` that receives this call's :class:`StageTimes`.
            overlap: run lookups in a worker thread beside the bottom MLP; default
                ``self.overlap``.

        Returns:
            ``(B,)`` float32 probabilities.

        Raises:
            InvalidArgumentError: a wrong dense width, table count or batch size (named).
            InvalidOffsetsError, IdOutOfRangeError: malformed bags (naming the table).
            ConfigError: a store whose tables do not match the model's.
        """
        return self._forward(dense_x, sparse, embeddings, profile, overlap)[0]

    __call__ = forward

    def forward_profiled(self, dense_x, sparse, *, embeddings: Store | None = None,
                         overlap: bool | None = None) -> tuple[np.ndarray, StageTimes]:
        """:meth:`forward` that also returns the call's :class:`StageTimes`."""
        return self._forward(dense_x, sparse, embeddings, None, overlap)

    def pooled(self, sparse, *, batch: int, embeddings: Store | None = None) -> np.ndarray:
        """The sparse arch alone: ``(t, B, dim)`` float32 pooled embeddings of one batch."""
        checked = self.sparse.check(sparse, batch)
        if embeddings is not None:
            self.sparse.check_store(embeddings)
        out = np.empty((self.num_tables, batch, self.sparse.dim), dtype=np.float32)
        self._collect(self._submit(checked, embeddings, out, numba.get_num_threads(), inline=True))
        return out

    def _check_dense(self, dense_x) -> np.ndarray:
        x = np.asarray(dense_x)
        if x.ndim != 2 or x.shape[1] != self.num_dense:
            raise InvalidArgumentError(
                f"dense_x must have shape (B, {self.num_dense}) for this model, got {x.shape}")
        if x.dtype == np.bool_ or not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
            raise InvalidArgumentError(f"dense_x must be numeric, got dtype {x.dtype}")
        return np.ascontiguousarray(x, dtype=np.float32)

    def _jobs(self, checked, embeddings, out, nthreads) -> list:
        """Callables that together pool every table of the batch into ``out``; each returns
        the ``(start, end)`` perf_counter span of its work."""
        if embeddings is not None:
            # One store call per batch keeps the store's batch counters meaningful.
            return [partial(_timed, nthreads, self.sparse.pool_store_into, embeddings, checked, out)]
        workers = min(nthreads, self.num_tables) if self.table_parallel else 1
        if workers <= 1:
            return [partial(_timed, nthreads, self.sparse.pool_into, checked, out)]
        # Largest tables first, each worker taking the next one: the span is balanced
        # even when one core is slowed by another process.
        queue = iter(sorted(range(self.num_tables), key=lambda k: -checked[k][0].shape[0]))
        lock = threading.Lock()
        per_worker = max(1, nthreads // workers)

        def drain():
            while True:
                with lock:
                    k = next(queue, None)
                if k is None:
                    return
                self.sparse.pool_table(k, checked[k], out[k])
        return [partial(_timed, per_worker, drain)] * workers

    def _submit(self, checked, embeddings, out, nthreads, *, inline: bool):
        """Start the lookups: worker futures, or (``inline`` and a single job) the finished
        span. Returns a list of futures or spans for :meth:`_collect`."""
        jobs = self._jobs(checked, embeddings, out, nthreads)
        if inline and len(jobs) == 1:
            return [_Done(jobs[0]())]
        executor = self._workers()
        return [executor.submit(job) for job in jobs]

    @staticmethod
    def _collect(pending) -> float:
        """Wait for every lookup job (none may still write into the output when this
        returns or raises), re-raise the first error, and return the lookups' span."""
        wait([p for p in pending if not isinstance(p, _Done)])
        spans = [p.result() for p in pending]
        return max(e for _, e in spans) - min(s for s, _ in spans)

    def _workers(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            # A forked child inherits the executor object but not its threads.
            if self._executor is None or self._executor_pid != os.getpid():
                self._executor = ThreadPoolExecutor(max_workers=numba.config.NUMBA_NUM_THREADS,
                                                    thread_name_prefix="sdm-lookups")
                self._executor_pid = os.getpid()
            return self._executor

    def _forward(self, dense_x, sparse, embeddings, profile, overlap):
        t_start = time.perf_counter()
        x = self._check_dense(dense_x)
        batch = x.shape[0]
        checked = self.sparse.check(sparse, batch)
        if embeddings is not None:
            self.sparse.check_store(embeddings)
        else:
            self.sparse.tables  # raises now, in the caller's thread, if not materialized
        overlap = self.overlap if overlap is None else bool(overlap)
        pooled = np.empty((self.num_tables, batch, self.sparse.dim), dtype=np.float32)
        nthreads = numba.get_num_threads()
        times = StageTimes(batches=1, samples=batch, overlapped=overlap)

        lookup_threads = self.lookup_threads or nthreads
        if overlap:
            pending = self._submit(checked, embeddings, pooled, lookup_threads, inline=False)
            try:
                t0 = time.perf_counter()
                h = self.bottom(x)
                times.bottom_s = time.perf_counter() - t0
            finally:
                t0 = time.perf_counter()
                times.embeddings_s = self._collect(pending)  # re-raises a lookup error here
                times.wait_s = time.perf_counter() - t0
        else:
            try:
                times.embeddings_s = self._collect(
                    self._submit(checked, embeddings, pooled, lookup_threads, inline=True))
            finally:
                numba.set_num_threads(nthreads)  # an inline job may have changed the caller's count
            t0 = time.perf_counter()
            h = self.bottom(x)
            times.bottom_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        z = interact(h, pooled, self.interaction, self.self_interaction)
        t1 = time.perf_counter()
        p = self.top(z)
        t2 = time.perf_counter()
        times.interaction_s = t1 - t0
        times.top_s = t2 - t1
        times.wall_s = t2 - t_start
        if profile is not None:
            profile.record(times)
        return p.reshape(batch), times

    def close(self) -> None:
        """Stop the lookup worker threads (a later forward starts new ones)."""
        with self._pool_lock:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None


def _timed(nthreads: int, fn, *args) -> tuple[float, float]:
    """Run ``fn(*args)`` with ``nthreads`` Numba threads in this thread (Numba's count is per
    thread, so a worker must be told); return its ``(start, end)`` perf_counter span."""
    numba.set_num_threads(nthreads)
    t0 = time.perf_counter()
    fn(*args)
    return t0, time.perf_counter()


class _Done:
    """A finished job's span, standing in for a future."""

    def __init__(self, span):
        self._span = span

    def result(self):
        return self._span

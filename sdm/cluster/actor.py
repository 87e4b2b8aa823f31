"""The Ray actor that serves one worker's shard store (imported only where Ray is)."""

from __future__ import annotations

import warnings

import ray

import sdm


class ShardServer:
    """One worker's store directory, opened when the actor starts and again whenever Ray
    restarts it. Every method answers for all of the worker's shards at once, so a batch
    costs one call per worker.

    Reads retry until Ray gives up on the actor (``max_task_retries=-1``): a restarted actor
    reopens its store and serves them again. Writes never retry: the caller learns that a
    shard failed instead of applying an update twice.
    """

    def __init__(self, worker: int, path: str, config):
        self.worker = worker
        self.store = sdm.Store.open(path, config=config)
        with warnings.catch_warnings():  # Ray 2.60 warns about its own use of a deprecated id
            warnings.simplefilter("ignore")
            self.restarted = bool(ray.get_runtime_context().was_current_actor_reconstructed)

    @ray.method(max_task_retries=-1)
    def warm(self, bags: list) -> int:
        """Pool and read every table with each of ``bags`` (``(ids, offsets[, weights])``
        sent by the caller, so they arrive read-only like a batch's, and Numba compiles, or
        loads from its cache, the kernels a batch will use before the first batch has a
        deadline). Counted in :meth:`stats` like any bag."""
        for bag in bags:
            for name in self.store.tables:
                self.store.embedding_bags({name: bag})
                self.store.lookup_raw(name, bag[0])
        return self.worker

    @ray.method(max_task_retries=-1)
    def serve(self, bags: dict, rows: dict, mode: str) -> tuple[dict, dict]:
        """Pool ``bags`` (``{table: (indices, offsets[, weights])}``, as
        :meth:`sdm.Store.embedding_bags`) and read ``rows`` (``{table: (n,) ids}``).

        Returns ``({table: (B, dim) float32}, {table: (n, row_bytes) uint8 raw rows}``)."""
        pooled = self.store.embedding_bags(bags, mode=mode) if bags else {}
        return pooled, {name: self.store.lookup_raw(name, ids) for name, ids in rows.items()}

    @ray.method(max_task_retries=0)
    def update(self, updates: dict) -> int:
        """Apply ``{table: (ids, rows)}`` with :meth:`sdm.Store.update_rows` (a worker holds
        one shard of a table, so one update is atomic here). Returns the store's version."""
        return max(self.store.update_rows(name, ids, rows) for name, (ids, rows) in updates.items())

    @ray.method(max_task_retries=-1)
    def stats(self) -> dict:
        """The store's :meth:`sdm.Store.stats`, with ``worker``, ``path`` and ``restarted``
        (whether Ray restarted this actor since launch)."""
        return {"worker": self.worker, "path": self.store.path, "restarted": self.restarted, **self.store.stats()}


ShardActor = ray.remote(ShardServer)

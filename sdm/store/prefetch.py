"""Lookahead prefetch: read the rows of upcoming batches into the DRAM cache before they are used.

A server that knows its next batches (a request queue, a trace) can issue their cache
misses while it is still busy with the current one. :class:`Lookahead` does that with
:meth:`sdm.Store.prefetch`: batch ``i + depth`` is prefetched when batch ``i`` starts, its
rows pinned in the cache until it has been served and :meth:`sdm.Store.release` called, so
no eviction between prefetch and use can throw the work away (FBGEMM's prefetch had bugs of
exactly this class: rows evicted after prefetch and before their batch ran).

Time is modeled, as everywhere in ``sdm`` (the device time each call charged to the store's
simulated clock), on one timeline:

* the device serves one request queue; a prefetch issued at time ``a`` starts when the
  device is free and takes the modeled time of its reads;
* demand reads go ahead of queued prefetches (they are on the critical path), pushing the
  queued prefetch work back by their own time;
* batch ``i`` starts when batch ``i - 1`` finished plus ``compute_ns`` (the work the caller
  does per batch, e.g. the DLRM MLPs, which is what prefetch hides IO behind); it first waits
  for its own prefetch to complete (a *stall*), then does its remaining (demand) reads.

A batch's latency is its stall plus its demand read time. With ``depth=0`` nothing is
prefetched and the latency is the demand time alone, so the two are directly comparable.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from sdm.errors import InvalidArgumentError
from sdm.validate import check_int

__all__ = ["Lookahead", "LookaheadStep"]

MAX_DEPTH = 64


@dataclass(frozen=True)
class LookaheadStep:
    """One served batch: its pooled ``outputs`` (``{table: (B, dim) float32}``), the modeled
    ``demand_ns`` of its own reads, the ``stall_ns`` it waited for its prefetch, and its
    modeled ``latency_ns`` (stall + demand)."""

    outputs: dict
    demand_ns: int
    stall_ns: int

    @property
    def latency_ns(self) -> int:
        return self.stall_ns + self.demand_ns


class Lookahead:
    """Serve batches through ``store`` with each batch prefetched ``depth`` batches ahead.

    Args:
        store: an open :class:`sdm.Store`.
        depth: batches of lookahead, ``[0, 64]``; 0 serves without prefetch.
        compute_ns: modeled time the caller spends per batch between lookups, ``>= 0``.
        mode: pooling mode of every batch, ``"sum"`` or ``"mean"``.
    """

    def __init__(self, store, depth: int = 1, *, compute_ns: int = 0, mode: str = "sum"):
        depth = check_int(depth, "lookahead depth", lo=0, hi=MAX_DEPTH)
        compute_ns = check_int(compute_ns, "compute_ns", lo=0)
        if not all(hasattr(store, m) for m in ("prefetch", "release", "embedding_bags", "modeled_ns")):
            raise InvalidArgumentError(f"store must be an open sdm.Store, got {type(store).__name__}")
        self.store = store
        self.depth = depth
        self.compute_ns = compute_ns
        self.mode = mode
        self.batches = 0
        self.prefetch_ns = 0
        self.stall_ns = 0
        self.pinned_rows = 0

    def serve(self, batches: Iterable[Mapping[str, tuple]]) -> Iterator[LookaheadStep]:
        """Yield a :class:`LookaheadStep` per batch of ``batches`` (each a request mapping as
        :meth:`sdm.Store.embedding_bags` takes), in order."""
        store = self.store
        if not isinstance(batches, Iterable):
            raise InvalidArgumentError(f"batches must be an iterable of request mappings, got "
                                       f"{type(batches).__name__}")
        upcoming = iter(batches)
        window: deque = deque()  # (batch, ticket, modeled time its prefetch completes)
        now = 0  # the modeled timeline: when the next batch may start
        device_free = 0  # when the device has finished all issued work

        def issue(batch, at):
            nonlocal device_free
            before = store.modeled_ns()
            ticket = store.prefetch(batch)
            took = store.modeled_ns() - before
            self.prefetch_ns += took
            self.pinned_rows += ticket.num_rows
            device_free = max(at, device_free) + took
            return batch, ticket, device_free

        try:
            for _ in range(self.depth):
                batch = next(upcoming, None)
                if batch is None:
                    break
                window.append(issue(batch, now))
            while True:
                nxt = next(upcoming, None)
                if self.depth == 0:
                    if nxt is None:
                        break
                    window.append((nxt, None, now))
                elif nxt is not None:
                    window.append(issue(nxt, now))
                if not window:
                    break
                batch, ticket, ready = window.popleft()
                start = max(now, ready)
                stall = start - now
                before = store.modeled_ns()
                try:
                    outputs = store.embedding_bags(batch, mode=self.mode)
                finally:
                    if ticket is not None:
                        store.release(ticket)
                demand = store.modeled_ns() - before
                # demand reads go ahead of queued prefetches, which finish that much later
                device_free = device_free + demand if device_free > start else start + demand
                now = start + demand + self.compute_ns
                self.batches += 1
                self.stall_ns += stall
                yield LookaheadStep(outputs, demand, stall)
        finally:
            for _, ticket, _ in window:  # a consumer that stopped early leaves no pins behind
                if ticket is not None and not ticket.released:
                    store.release(ticket)

    def stats(self) -> dict:
        """``batches``, ``depth``, ``pinned_rows`` (rows pinned by prefetches, cached or
        read), ``prefetch_ns`` (modeled device time of prefetches), ``stall_ns``, and the
        first cache tier's ``prefetched``, ``prefetch_used``, ``prefetch_wasted``,
        ``prefetch_coverage`` (share of rows the demand path needed from below that
        prefetch had read) and ``prefetch_accuracy`` (share of prefetched rows a batch used)."""
        out = {"batches": self.batches, "depth": self.depth, "pinned_rows": self.pinned_rows,
               "prefetch_ns": self.prefetch_ns, "stall_ns": self.stall_ns}
        for tier in self.store.stats()["tiers"]:
            if tier["kind"] == "cache":
                out.update({k: v for k, v in tier.items() if k.startswith("prefetch")})
                break
        return out

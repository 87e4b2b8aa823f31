"""The store: tables on disk, the hierarchy that serves them, and what sits on top of it.

* :mod:`sdm.store.store`: :class:`Store`, the lookup API (batches, updates, versions).
* :mod:`sdm.store.config`: hierarchy configurations (presets, TOML) as frozen dataclasses.
* :mod:`sdm.store.hierarchy`: the tiers of a config, fast to slow, each metered.
* :mod:`sdm.store.placement`: a :class:`~sdm.store.placement.Placement` value and its file.
* :mod:`sdm.store.pooled`: the pooled-embedding cache.
* :mod:`sdm.store.prefetch`: lookahead prefetch over a modeled timeline.
"""

from sdm.store.store import PrefetchTicket, Store, TableSpec

__all__ = ["Store", "TableSpec", "PrefetchTicket"]

"""Typed errors of the sharded store, each a subclass of an :mod:`sdm.errors` class."""

from __future__ import annotations

from sdm.errors import ConfigError, StoreError

__all__ = ["PlanError", "CapacityError", "ShardUnavailableError"]


class PlanError(ConfigError):
    """A sharding plan that cannot be made or used: bad planner input, a damaged or foreign
    plan file, a plan that does not match the store it is applied to."""


class CapacityError(PlanError):
    """Tables that do not fit the workers. ``shortfall_bytes`` is how many bytes more capacity
    the plan would need; ``table`` names the table that could not be placed, when one is to
    blame (None when the tables together exceed the workers)."""

    def __init__(self, message: str, *, shortfall_bytes: int, table: str | None = None):
        super().__init__(message)
        self.shortfall_bytes = int(shortfall_bytes)
        self.table = table


class ShardUnavailableError(StoreError):
    """Shards that gave no answer before the call's deadline, or whose actor is gone for good.
    ``workers`` lists their worker numbers (the plan's), ``reasons`` what was seen for each.
    No result of the call is returned, so no caller ever sees partial or zero-filled rows."""

    def __init__(self, message: str, *, workers, reasons=None):
        super().__init__(message)
        self.workers = tuple(workers)
        self.reasons = dict(reasons or {})

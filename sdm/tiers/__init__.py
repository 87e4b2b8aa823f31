"""Tiers: places rows live. Each implements :class:`sdm.tiers.base.Tier`."""

from sdm.tiers.base import Tier
from sdm.tiers.dram import DramTier
from sdm.tiers.lmdb import LmdbTier

__all__ = ["Tier", "DramTier", "LmdbTier"]

"""Tiers: places rows live. Each implements :class:`sdm.tiers.base.Tier`; a
:class:`~sdm.tiers.metered.Metered` wrapper puts a device model around any of them."""

from sdm.tiers.base import Tier
from sdm.tiers.dram import DramTier
from sdm.tiers.dram_cache import DramCacheTier
from sdm.tiers.lmdb import LmdbTier
from sdm.tiers.metered import Metered
from sdm.tiers.mmap import MmapTier

__all__ = ["Tier", "DramTier", "LmdbTier", "MmapTier", "DramCacheTier", "Metered"]

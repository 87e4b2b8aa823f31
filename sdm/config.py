"""Hierarchy configuration: frozen dataclasses, named presets, TOML files.

A hierarchy is a tuple of tiers ordered fast to slow. Wherever a ``config`` is accepted it
may be a preset name (:data:`HIERARCHY_PRESETS`), a path to a ``.toml`` file, or a
:class:`HierarchyConfig`.

TOML layout::

    name = "my-hierarchy"      # optional, defaults to the file's stem
    io_mode = "modeled"        # optional: modeled | paced | direct

    [[tiers]]
    kind = "dram"              # one of TIER_KINDS
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field

from sdm.errors import ConfigError

__all__ = [
    "TierConfig", "HierarchyConfig", "HIERARCHY_PRESETS", "TIER_KINDS", "IO_MODES",
    "resolve_config", "load_toml",
]

TIER_KINDS = ("dram", "lmdb")
IO_MODES = ("modeled", "paced", "direct")


@dataclass(frozen=True)
class TierConfig:
    """One tier of a hierarchy.

    ``kind``: ``dram`` holds every row of every table in RAM (loaded from the durable LMDB
    copy on first use); ``lmdb`` reads rows from the store's LMDB environment on demand.
    """

    kind: str

    def __post_init__(self):
        if self.kind not in TIER_KINDS:
            raise ConfigError(f"tier kind {self.kind!r} is not one of {TIER_KINDS}")


@dataclass(frozen=True)
class HierarchyConfig:
    """Tiers ordered fast to slow, and how device time is charged (``io_mode``)."""

    name: str
    tiers: tuple[TierConfig, ...] = field(default_factory=tuple)
    io_mode: str = "modeled"

    def __post_init__(self):
        if not self.tiers:
            raise ConfigError(f"hierarchy {self.name!r} needs at least one tier, got none")
        if self.io_mode not in IO_MODES:
            raise ConfigError(f"io_mode {self.io_mode!r} is not one of {IO_MODES}")
        object.__setattr__(self, "tiers", tuple(self.tiers))


HIERARCHY_PRESETS: dict[str, HierarchyConfig] = {
    "dram": HierarchyConfig("dram", (TierConfig("dram"),)),
    "ssd": HierarchyConfig("ssd", (TierConfig("lmdb"),)),
}


def _build(cls, data: dict, where: str):
    """Build a dataclass from a TOML table, naming any unknown or missing key."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(names)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load_toml(path) -> HierarchyConfig:
    """Read a hierarchy from a TOML file (layout in this module's docstring)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path!r} is not valid TOML: {exc}") from None
    data.setdefault("name", os.path.splitext(os.path.basename(path))[0])
    tiers = data.get("tiers", [])
    if not isinstance(tiers, list) or not all(isinstance(t, dict) for t in tiers):
        raise ConfigError(f"{path}: 'tiers' must be an array of tables ([[tiers]])")
    data["tiers"] = tuple(_build(TierConfig, t, f"{path}: tiers[{i}]") for i, t in enumerate(tiers))
    return _build(HierarchyConfig, data, path)


def resolve_config(config) -> HierarchyConfig:
    """Turn ``None`` (the ``dram`` preset), a preset name, a TOML path or a
    :class:`HierarchyConfig` into a :class:`HierarchyConfig`."""
    if config is None:
        return HIERARCHY_PRESETS["dram"]
    if isinstance(config, HierarchyConfig):
        return config
    if isinstance(config, (str, os.PathLike)):
        text = os.fspath(config)
        if text in HIERARCHY_PRESETS:
            return HIERARCHY_PRESETS[text]
        if text.endswith(".toml"):
            return load_toml(text)
        raise ConfigError(
            f"config {text!r} is neither a preset {sorted(HIERARCHY_PRESETS)} nor a .toml file"
        )
    raise ConfigError(f"config must be a preset name, a .toml path or a HierarchyConfig, got {type(config).__name__}")

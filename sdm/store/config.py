"""Hierarchy configuration: frozen dataclasses, named presets, TOML files.

A hierarchy is a tuple of tiers ordered fast to slow. Wherever a ``config`` is accepted it
may be a preset name (:data:`HIERARCHY_PRESETS`), a path to a ``.toml`` file, or a
:class:`HierarchyConfig`.

TOML layout (tiers fast to slow; unknown keys are errors)::

    name = "my-hierarchy"          # optional, defaults to the file's stem
    io_mode = "modeled"            # optional: modeled (default) | paced | direct
    io_submission = "aio"          # optional, direct mode: aio | threads (default: aio where
                                   # the machine has kernel AIO, see sdm.tiers.io_engine)
    pooled_cache_bytes = 8388608   # optional: a pooled-embedding cache of this many bytes
    placement = "placement.npz"    # optional: a placement (``sdm place``), relative to this file

    [[tiers]]
    kind = "cache"                 # dram | cache | mmap | lmdb  (TIER_KINDS)
    device = "dram"                # a preset of sdm.DEVICES (default per kind), or a device file
                                   # from `sdm devices calibrate -o disk.toml`
    capacity_bytes = 67108864      # or capacity_rows = 1000000; a cache needs one
    policy = "lru"                 # caches only: a name of sdm.POLICIES except belady
    admission = "tinylfu"          # caches only, optional: threshold | tinylfu

    [[tiers]]
    kind = "mmap"
    queue_depth = 4                # reads in flight per batch (default 1)

    [tiers.device]                 # a device of your own: every DeviceSpec field
    name = "my-nand"
    media = "TLC Nand"
    access_bytes = 4096
    read_latency_us = 90.0
    max_read_iops = 400000
    read_bandwidth_gbps = 3.0
    active_watts = 10.0
    idle_watts = 4.0
    capacity_gb = 4000
    usd_per_gb = 0.2
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field

from sdm.devices import DeviceSpec, get_device
from sdm.errors import ConfigError
from sdm.policies import ADMISSIONS, POLICIES
from sdm.tiers.io_engine import SUBMISSIONS
from sdm.tiers.metered import IO_MODES, MAX_QUEUE_DEPTH
from sdm.validate import check_choice, check_int

__all__ = [
    "TierConfig", "HierarchyConfig", "HIERARCHY_PRESETS", "TIER_KINDS", "IO_MODES",
    "resolve_config", "load_toml", "load_device", "with_io_mode", "with_options", "DEFAULT_DEVICES", "CACHE_POLICIES",
]

TIER_KINDS = ("dram", "cache", "mmap", "lmdb")
CACHE_POLICIES = tuple(p for p in POLICIES if p != "belady")  # belady needs the future
# The device each kind is metered by when a tier names none.
DEFAULT_DEVICES = {"dram": "dram", "cache": "dram", "mmap": "optane-p4800x-4k", "lmdb": "nand-p4500"}


@dataclass(frozen=True)
class TierConfig:
    """One tier of a hierarchy.

    ``kind``:

    * ``dram`` — every row of every table in RAM (loaded from the durable LMDB copy on
      first use);
    * ``cache`` — a fixed number of rows of any tables (needs ``capacity_rows`` or
      ``capacity_bytes``), misses read from the next tier and admitted through ``policy``
      (:data:`CACHE_POLICIES`, default ``lru``) and an optional ``admission`` filter
      (``threshold`` or ``tinylfu``);
    * ``mmap`` — the SCM row file of each table (derived from LMDB, rebuilt when stale),
      read through mmap, or with O_DIRECT in ``direct`` mode;
    * ``lmdb`` — the store's LMDB environment, read a block at a time.

    ``device``: a preset name of ``sdm.DEVICES`` or a :class:`~sdm.devices.DeviceSpec`
    (default per kind: :data:`DEFAULT_DEVICES`). ``capacity_rows`` / ``capacity_bytes``
    (at most one): the rows a cache holds; for other kinds an upper bound on the bytes of
    rows they serve, checked when the store opens. ``queue_depth``: reads in flight per
    batch in the device model, ``[1, 1024]``.
    """

    kind: str
    device: object = None
    capacity_rows: int | None = None
    capacity_bytes: int | None = None
    policy: str | None = None
    admission: str | None = None
    queue_depth: int = 1

    def __post_init__(self):
        check_choice(self.kind, "tier kind", TIER_KINDS, error=ConfigError)
        where = f"{self.kind} tier"
        device = DEFAULT_DEVICES[self.kind] if self.device is None else self.device
        if isinstance(device, str) and device.endswith(".toml"):  # `sdm devices calibrate -o`
            device = load_device(device)
        if isinstance(device, dict):  # an inline TOML table describing a custom device
            device = _build(DeviceSpec, device, f"{where}: device")
        try:
            device = get_device(device)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        object.__setattr__(self, "device", device)
        for name in ("capacity_rows", "capacity_bytes"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, check_int(value, f"{where}: {name}", lo=1, error=ConfigError))
        if self.capacity_rows is not None and self.capacity_bytes is not None:
            raise ConfigError(f"{where}: give capacity_rows or capacity_bytes, not both "
                              f"(got {self.capacity_rows!r} and {self.capacity_bytes!r})")
        if self.kind == "cache":
            if self.capacity_rows is None and self.capacity_bytes is None:
                raise ConfigError(f"{where}: a cache needs capacity_rows or capacity_bytes (>= 1), got neither")
            policy = "lru" if self.policy is None else self.policy
            object.__setattr__(self, "policy", check_choice(policy, f"{where}: policy", CACHE_POLICIES,
                                                            error=ConfigError))
            if self.admission is not None:
                check_choice(self.admission, f"{where}: admission", ADMISSIONS, error=ConfigError)
        else:
            for name in ("policy", "admission"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"{where}: {name} {getattr(self, name)!r} applies only to kind 'cache'")
        object.__setattr__(self, "queue_depth", check_int(self.queue_depth, f"{where}: queue_depth", lo=1,
                                                          hi=MAX_QUEUE_DEPTH, error=ConfigError))

    @property
    def holds_all_rows(self) -> bool:
        return self.kind != "cache"


@dataclass(frozen=True)
class HierarchyConfig:
    """Tiers ordered fast to slow, and how device time is charged (``io_mode``).

    Every ``cache`` tier must be followed by a tier holding all rows; the first tier holding
    all rows must be the last (nothing below it would ever be read).

    ``pooled_cache_bytes``: bytes of the pooled-embedding cache in front of the hierarchy
    (0, the default, for none). ``placement``: a :class:`sdm.store.placement.Placement` or the
    path of one (``sdm place``): tables pinned whole in DRAM, hot rows pinned in the first
    cache, and the row order of the SCM row files; pinned bytes come out of the first
    cache's capacity. ``io_submission``: how ``direct`` mode submits device reads, one of
    :data:`sdm.tiers.io_engine.SUBMISSIONS` (None, the default: kernel AIO where the machine
    has it, else reader threads).
    """

    name: str
    tiers: tuple[TierConfig, ...] = field(default_factory=tuple)
    io_mode: str = "modeled"
    io_submission: str | None = None
    pooled_cache_bytes: int = 0
    placement: object = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"hierarchy name must be a non-empty string, got {self.name!r}")
        if isinstance(self.tiers, (str, bytes)) or not isinstance(self.tiers, (tuple, list)):
            raise ConfigError(f"hierarchy {self.name!r}: tiers must be a sequence of TierConfig, "
                              f"got {type(self.tiers).__name__}")
        object.__setattr__(self, "tiers", tuple(self.tiers))
        if not self.tiers:
            raise ConfigError(f"hierarchy {self.name!r} needs at least one tier, got none")
        for i, tier in enumerate(self.tiers):
            if not isinstance(tier, TierConfig):
                raise ConfigError(f"hierarchy {self.name!r}: tiers[{i}] must be a TierConfig, "
                                  f"got {type(tier).__name__}")
        check_choice(self.io_mode, "io_mode", IO_MODES, error=ConfigError)
        if self.io_submission is not None:
            check_choice(self.io_submission, f"hierarchy {self.name!r}: io_submission", SUBMISSIONS, error=ConfigError)
        object.__setattr__(self, "pooled_cache_bytes", check_int(
            self.pooled_cache_bytes, f"hierarchy {self.name!r}: pooled_cache_bytes", lo=0, error=ConfigError))
        if isinstance(self.placement, os.PathLike):
            object.__setattr__(self, "placement", os.fspath(self.placement))
        if self.placement is not None and not isinstance(self.placement, str):
            from sdm.store.placement import Placement

            if not isinstance(self.placement, Placement):
                raise ConfigError(f"hierarchy {self.name!r}: placement must be a file path or a "
                                  f"sdm.store.placement.Placement, got {self.placement!r}")
        full = [i for i, t in enumerate(self.tiers) if t.holds_all_rows]
        if not full:
            raise ConfigError(f"hierarchy {self.name!r}: the last tier must hold all rows "
                              f"(kind dram, mmap or lmdb), got only caches")
        if full[0] != len(self.tiers) - 1:
            raise ConfigError(f"hierarchy {self.name!r}: tiers[{full[0]}] ({self.tiers[full[0]].kind}) "
                              f"holds all rows, so tiers below it would never be read; it must be last")


def with_io_mode(config, io_mode: str) -> HierarchyConfig:
    """``config`` (anything :func:`resolve_config` takes) with another ``io_mode``."""
    return dataclasses.replace(resolve_config(config), io_mode=io_mode)


def with_options(config, **changes) -> HierarchyConfig:
    """``config`` (anything :func:`resolve_config` takes) with hierarchy fields replaced
    (``io_mode``, ``io_submission``, ``pooled_cache_bytes``, ``placement``) and, through ``cache_bytes``,
    ``policy`` and ``admission``, its first cache tier changed (ConfigError without one)."""
    config = resolve_config(config)
    cache = {k: changes.pop(k) for k in ("cache_bytes", "policy", "admission") if k in changes}
    if cache:
        first = next((i for i, t in enumerate(config.tiers) if t.kind == "cache"), None)
        if first is None:
            raise ConfigError(f"hierarchy {config.name!r} has no cache tier to set {sorted(cache)} on")
        tc = config.tiers[first]
        if "cache_bytes" in cache:
            tc = dataclasses.replace(tc, capacity_bytes=cache.pop("cache_bytes"), capacity_rows=None)
        tc = dataclasses.replace(tc, **cache)
        changes["tiers"] = config.tiers[:first] + (tc,) + config.tiers[first + 1:]
    try:
        return dataclasses.replace(config, **changes)
    except TypeError as exc:
        raise ConfigError(f"hierarchy {config.name!r}: {exc}") from None


_MiB = 1 << 20
# SCM and SSD tiers read a batch's misses 16 at a time: the queue depth the P3700 and P4800X
# figures were measured at, and a depth an io_uring path keeps easily.
_QD = 16
# DRAM reads of a gather are independent, so a core keeps several cache-line misses in
# flight: one per line fill buffer, 10 on Intel cores since Nehalem (12 on Skylake-SP), per
# Intel's optimization manual. Serial (1) would model a pointer chase, not a gather.
DRAM_QUEUE_DEPTH = 10
HIERARCHY_PRESETS: dict[str, HierarchyConfig] = {
    "dram": HierarchyConfig("dram", (TierConfig("dram", queue_depth=DRAM_QUEUE_DEPTH),)),
    "ssd": HierarchyConfig("ssd", (TierConfig("lmdb", "nand-p4500", queue_depth=_QD),)),
    # A DRAM row cache over Nand flash SCM (the SDM paper's first configuration).
    "sdm-nand": HierarchyConfig("sdm-nand", (
        TierConfig("cache", "dram", capacity_bytes=64 * _MiB, queue_depth=DRAM_QUEUE_DEPTH),
        TierConfig("mmap", "nand-p4500", queue_depth=_QD))),
    # A DRAM row cache over Optane SSD read in 512 B sectors (smaller access granularity).
    "sdm-3dxp": HierarchyConfig("sdm-3dxp", (
        TierConfig("cache", "dram", capacity_bytes=64 * _MiB, queue_depth=DRAM_QUEUE_DEPTH),
        TierConfig("mmap", "optane-p4800x-512", queue_depth=_QD))),
    # DRAM cache over a larger 3DXP cache over the Nand SSD holding the durable copy. The
    # 3DXP tier's rows live in RAM here; its device model charges their time.
    "three-tier": HierarchyConfig("three-tier", (
        TierConfig("cache", "dram", capacity_bytes=16 * _MiB, queue_depth=DRAM_QUEUE_DEPTH),
        TierConfig("cache", "optane-p4800x-512", capacity_bytes=256 * _MiB, queue_depth=_QD),
        TierConfig("lmdb", "nand-p4500", queue_depth=_QD))),
}


def _build(cls, data: dict, where: str):
    """Build a dataclass from a TOML table, naming any unknown or missing key."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(names)}")
    try:
        return cls(**data)
    except (TypeError, ConfigError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def read_toml(path, what: str) -> tuple[str, dict]:
    """``(path as text, its TOML table)``; ConfigError naming ``what`` and the path for a
    non-path, a missing or unreadable file, or text that is not UTF-8 TOML."""
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"{what} must be a path, got {type(path).__name__}")
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            return path, tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{what} {path!r} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path!r} cannot be read: it is a directory") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} {path!r} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path!r} is not UTF-8 text: {exc}") from None
    except (OSError, ValueError) as exc:  # no permission, a NUL in the path
        raise ConfigError(f"{what} {path!r} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None


def load_device(path) -> DeviceSpec:
    """A device from a TOML file's ``[device]`` table (what ``sdm devices calibrate -o`` writes)."""
    path, data = read_toml(path, "device file")
    table = data.get("device")
    if not isinstance(table, dict) or set(data) != {"device"}:
        raise ConfigError(f"{path}: a device file holds one [device] table, got keys {sorted(data)}")
    if "unverified" in table:
        table = {**table, "unverified": frozenset(table["unverified"])}
    return _build(DeviceSpec, table, f"{path}: device")


def load_toml(path) -> HierarchyConfig:
    """Read a hierarchy from a TOML file (layout in this module's docstring). A tier's
    ``device`` may name a device TOML file, relative to this file."""
    path, data = read_toml(path, "config file")
    data.setdefault("name", os.path.splitext(os.path.basename(path))[0])
    tiers = data.get("tiers", [])
    if not isinstance(tiers, list) or not all(isinstance(t, dict) for t in tiers):
        raise ConfigError(f"{path}: 'tiers' must be an array of tables ([[tiers]])")
    for t in tiers:
        if isinstance(t.get("device"), str) and t["device"].endswith(".toml"):
            t["device"] = os.path.join(os.path.dirname(os.path.abspath(path)), t["device"])
    data["tiers"] = tuple(_build(TierConfig, t, f"{path}: tiers[{i}]") for i, t in enumerate(tiers))
    placement = data.get("placement")
    if placement is not None:
        if not isinstance(placement, str):
            raise ConfigError(f"{path}: placement must be a file path string, got {placement!r}")
        data["placement"] = os.path.join(os.path.dirname(os.path.abspath(path)), placement)
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

"""A serving host as the host model sees it: cores, DRAM, and the SCM devices of each tier.

Wherever a host is accepted it may be a preset name (:data:`HOST_PRESETS`, plus
``this-machine``), a path to a ``.toml`` file, or a :class:`HostSpec`. TOML layout (every
key optional except ``cores``; unknown keys are errors)::

    name = "my-host"               # default: the file's stem
    cores = 40                     # cores serving requests
    core_speed = 1.0               # a core's speed relative to one of this machine's
    dram_cache_bytes = 68719476736 # the DRAM row cache (default: the hierarchy's own) ...
    dram_cache_fraction = 0.1      # ... or as a share of the table bytes (not both)
    dram_bandwidth_gbps = 51.0     # default: the hierarchy's DRAM device's
    direct_device = "disk.toml"    # the device direct IO reads (sdm devices calibrate -o)

    [[scm]]                        # one per SCM tier of the hierarchy, fast to slow
    device = "nand-p4500"          # default: the hierarchy's own device for that tier
    count = 8                      # devices the tier's blocks are striped over

    [platform]                     # stalls and wake-ups (sdm.host.platform); default none
    stall_rate_per_s = 460.0
    stall_us = [25.0, 48.0, 950.0]
    wakeup_us = [12.0, 140.0, 2000.0]

    [sources]                      # where each number comes from
    cores = "..."
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field

from sdm.devices import DeviceSpec, get_device
from sdm.errors import ConfigError
from sdm.host.platform import PlatformNoise, measure_platform
from sdm.store.config import load_device, read_toml
from sdm.validate import check_int, check_number

__all__ = ["HostSpec", "ScmSlot", "HOST_PRESETS", "resolve_host", "this_machine", "load_host"]

MAX_CORES = 4096
MAX_DEVICES = 1024


@dataclass(frozen=True)
class ScmSlot:
    """The devices of one SCM tier: ``count`` x ``device`` (None: the hierarchy's own)."""

    device: DeviceSpec | None = None
    count: int = 1

    def __post_init__(self):
        device = self.device
        if isinstance(device, str) and device.endswith(".toml"):
            device = load_device(device)
        if device is not None:
            object.__setattr__(self, "device", get_device(device))
        object.__setattr__(self, "count", check_int(self.count, "scm count (devices of a tier)", lo=1,
                                                    hi=MAX_DEVICES, error=ConfigError))


@dataclass(frozen=True)
class HostSpec:
    """One serving host.

    ``cores``: cores serving requests; ``core_speed``: a core's speed relative to one of this
    machine's (CPU costs measured here are divided by it); ``dram_cache_bytes`` or
    ``dram_cache_fraction`` (of the table bytes): the DRAM row cache, None for the
    hierarchy's own; ``dram_bandwidth_gbps``: None for the hierarchy's DRAM device's;
    ``scm``: per SCM tier, fast to slow, its devices; ``direct_device``: the device that
    serves ``direct`` IO (this machine's calibrated disk), None when direct IO is not
    modeled; ``platform``: the stalls and wake-ups the machine itself adds
    (:class:`~sdm.host.platform.PlatformNoise`), None for none; ``sources``: field name ->
    where its number comes from.
    """

    name: str
    cores: int
    core_speed: float = 1.0
    dram_cache_bytes: int | None = None
    dram_cache_fraction: float | None = None
    dram_bandwidth_gbps: float | None = None
    scm: tuple[ScmSlot, ...] = ()
    direct_device: DeviceSpec | None = None
    platform: PlatformNoise | None = field(default=None, repr=False)
    sources: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"host name must be a non-empty string, got {self.name!r}")
        where = f"host {self.name!r}"
        object.__setattr__(self, "cores", check_int(self.cores, f"{where}: cores", lo=1, hi=MAX_CORES,
                                                    error=ConfigError))
        object.__setattr__(self, "core_speed", check_number(self.core_speed, f"{where}: core_speed", lo=0,
                                                            hi=1000, lo_open=True, error=ConfigError))
        if self.dram_cache_bytes is not None and self.dram_cache_fraction is not None:
            raise ConfigError(f"{where}: give dram_cache_bytes or dram_cache_fraction, not both "
                              f"(got {self.dram_cache_bytes!r} and {self.dram_cache_fraction!r})")
        if self.dram_cache_bytes is not None:
            object.__setattr__(self, "dram_cache_bytes", check_int(
                self.dram_cache_bytes, f"{where}: dram_cache_bytes", lo=1, error=ConfigError))
        if self.dram_cache_fraction is not None:
            object.__setattr__(self, "dram_cache_fraction", check_number(
                self.dram_cache_fraction, f"{where}: dram_cache_fraction", lo=0, hi=1, lo_open=True,
                error=ConfigError))
        if self.dram_bandwidth_gbps is not None:
            object.__setattr__(self, "dram_bandwidth_gbps", check_number(
                self.dram_bandwidth_gbps, f"{where}: dram_bandwidth_gbps", lo=0, hi=1e6, lo_open=True,
                error=ConfigError))
        slots = self.scm if isinstance(self.scm, (tuple, list)) else None
        if slots is None or not all(isinstance(s, ScmSlot) for s in slots):
            raise ConfigError(f"{where}: scm must be a sequence of ScmSlot, got {self.scm!r}")
        object.__setattr__(self, "scm", tuple(slots))
        device = self.direct_device
        if isinstance(device, str) and device.endswith(".toml"):
            device = load_device(device)
        if device is not None:
            object.__setattr__(self, "direct_device", get_device(device))
        if isinstance(self.platform, dict):
            object.__setattr__(self, "platform", _platform_of(self.platform, where))
        if self.platform is not None and not isinstance(self.platform, PlatformNoise):
            raise ConfigError(f"{where}: platform must be a PlatformNoise or a table, got {self.platform!r}")
        sources = tuple(self.sources.items()) if isinstance(self.sources, dict) else tuple(self.sources)
        object.__setattr__(self, "sources", tuple((str(k), str(v)) for k, v in sources))

    def source(self, name: str) -> str:
        return dict(self.sources).get(name, "")

    def to_json(self) -> dict:
        return {"name": self.name, "cores": self.cores, "core_speed": self.core_speed,
                "dram_cache_bytes": self.dram_cache_bytes, "dram_cache_fraction": self.dram_cache_fraction,
                "dram_bandwidth_gbps": self.dram_bandwidth_gbps,
                "scm": [{"device": None if s.device is None else s.device.name, "count": s.count}
                        for s in self.scm],
                "direct_device": None if self.direct_device is None else self.direct_device.name,
                "platform": None if self.platform is None else self.platform.summary(),
                "sources": dict(self.sources)}


def _platform_of(table: dict, where: str) -> PlatformNoise:
    allowed = {"stall_rate_per_s", "stall_us", "wakeup_us", "source"}
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"{where}: platform: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    return PlatformNoise(table.get("stall_rate_per_s", 0.0), table.get("stall_us", ()), table.get("wakeup_us", ()),
                         str(table.get("source", "")))


_SCENARIO = "scenarios/*.toml [host]"
#: Named hosts. Every number carries its source; most are the scenarios' assumptions.
HOST_PRESETS: dict[str, HostSpec] = {h.name: h for h in (
    HostSpec("2-socket", cores=40, core_speed=1.0, dram_cache_fraction=0.1, dram_bandwidth_gbps=51.0,
             scm=(ScmSlot(None, 8),), sources={
                 "cores": "assumption: 2 sockets x 20 cores serving requests (the scenarios' "
                          "'2-socket inference server' names no core count; not in REFERENCES.md)",
                 "core_speed": "assumption: a server core as fast as one core of the machine the "
                               "costs were measured on (unverified)",
                 "dram_cache_fraction": f"{_SCENARIO}: configs dram_fraction = 0.1 (a DRAM row cache "
                                        f"of 10% of the table bytes)",
                 "dram_bandwidth_gbps": "REFERENCES.md Devices: ~51 GB/s per host (TorchRec planner "
                                        "constant)",
                 "scm": f"{_SCENARIO}: ssd_slots = 8 (8 NVMe bays), each holding the hierarchy's "
                        f"SCM device",
                 "platform": "none modeled: a bare-metal server's stalls and wake-ups are not measured "
                             "here (this machine's are a VM's: see this-machine)"}),
)}
THIS_MACHINE = "this-machine"


@functools.lru_cache(maxsize=1)
def _this_platform() -> PlatformNoise:
    return measure_platform()  # about 1.5 s, once per process


def this_machine(disk=None, *, platform_s: float | None = None) -> HostSpec:
    """The machine this runs on: ``os.cpu_count()`` cores at speed 1, the hierarchy's own
    DRAM cache and devices (one each, as a live store models them), ``disk`` (a device
    TOML from ``sdm devices calibrate -o``, or a :class:`DeviceSpec`) as the device that
    serves ``direct`` IO, and the machine's stalls and wake-ups
    (:func:`sdm.host.platform.measure_platform`): spinning ``platform_s`` seconds, or by
    default 1 s once per process. Rare long stalls need a longer measurement to be seen."""
    platform = _this_platform() if platform_s is None else measure_platform(platform_s)
    return HostSpec(THIS_MACHINE, cores=os.cpu_count() or 1, direct_device=disk, platform=platform, sources={
        "cores": "os.cpu_count() on this machine",
        "core_speed": "1: costs are measured on this machine",
        "platform": platform.source,
        "direct_device": "sdm devices calibrate on this machine's disk" if disk is not None else
                         "none given (pass the TOML of `sdm devices calibrate DIR -o disk.toml`)"})


def load_host(path) -> HostSpec:
    """A host from a TOML file (layout in this module's docstring)."""
    path, data = read_toml(path, "host file")
    data.setdefault("name", os.path.splitext(os.path.basename(path))[0])
    names = {f.name for f in dataclasses.fields(HostSpec)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown}; allowed: {sorted(names)}")
    if "cores" not in data:
        raise ConfigError(f"{path}: a host needs cores (an integer >= 1)")
    here = os.path.dirname(os.path.abspath(path))

    def near(device):  # device files are relative to the host file
        if isinstance(device, str) and device.endswith(".toml"):
            return os.path.join(here, device)
        return device

    slots = data.get("scm", [])
    if not isinstance(slots, list) or not all(isinstance(s, dict) for s in slots):
        raise ConfigError(f"{path}: 'scm' must be an array of tables ([[scm]])")
    built = []
    for i, s in enumerate(slots):
        extra = sorted(set(s) - {"device", "count"})
        if extra:
            raise ConfigError(f"{path}: scm[{i}]: unknown key(s) {extra}; allowed: ['count', 'device']")
        built.append(ScmSlot(near(s.get("device")), s.get("count", 1)))
    data["scm"] = tuple(built)
    if "direct_device" in data:
        data["direct_device"] = near(data["direct_device"])
    sources = data.get("sources", {})
    if not isinstance(sources, dict):
        raise ConfigError(f"{path}: [sources] must be a table of field = text")
    data["sources"] = sources
    try:
        return HostSpec(**data)
    except TypeError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def resolve_host(host, *, disk=None) -> HostSpec:
    """A :class:`HostSpec` from a preset name, ``this-machine`` (with ``disk``, see
    :func:`this_machine`), a ``.toml`` path, or a spec (returned as is)."""
    if isinstance(host, HostSpec):
        return host
    if isinstance(host, (str, os.PathLike)):
        text = os.fspath(host)
        if text == THIS_MACHINE:
            return this_machine(disk)
        if text in HOST_PRESETS:
            return HOST_PRESETS[text]
        if text.endswith(".toml"):
            return load_host(text)
        raise ConfigError(f"host {text!r} is neither a preset {sorted([THIS_MACHINE, *HOST_PRESETS])} "
                          f"nor a .toml file")
    raise ConfigError(f"host must be a preset name, a .toml path or a HostSpec, got {type(host).__name__}")

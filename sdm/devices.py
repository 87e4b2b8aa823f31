"""Device specs and the device model: what a block read costs in time and energy.

A :class:`DeviceSpec` holds a device's published figures with units in the field names and
the source of every number (``REFERENCES.md``, Devices table); figures no public source here
confirms are listed in ``unverified`` and kept as parameters. :data:`DEVICES` names the
presets.

The model (DESIGN.md §3), for ``k`` block reads issued ``q`` at a time:

* a read's latency at queue depth ``c = min(q, k)`` is ``max(read_latency, c / max_read_iops)``
  (Little's law: ``c`` reads in flight complete at most ``max_read_iops`` per second; checks
  out against the P4800X at QD16: 16 / 585K = 27 µs modeled, 25.5 µs measured);
* the batch completes in ``ceil(k / c)`` waves of that latency, and never faster than its
  bytes allow: ``k * access_bytes / read_bandwidth``;
* reads are whole blocks of ``access_bytes``: a row costs every block it touches
  (:func:`count_blocks`), so read amplification is ``bytes read / useful bytes``;
* energy is ``active_watts`` over busy time plus ``idle_watts`` over the rest.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from sdm.kernels.jit import jit
from sdm.errors import ConfigError
from sdm.validate import check_int, check_number

__all__ = ["DeviceSpec", "DEVICES", "get_device", "count_blocks", "block_ranges"]

_NUMBERS = ("read_latency_us", "max_read_iops", "read_bandwidth_gbps", "active_watts",
            "idle_watts", "capacity_gb", "usd_per_gb")
# Fields that must be strictly positive (a zero would divide by zero or make reads free);
# the rest may be zero (a device drawing no idle power, a free device).
_POSITIVE = ("read_latency_us", "max_read_iops", "read_bandwidth_gbps", "capacity_gb")
MAX_ACCESS_BYTES = 1 << 24


@dataclass(frozen=True)
class DeviceSpec:
    """A storage or memory device as the model sees it.

    Units are in the names: ``read_latency_us`` (mean random-read latency at queue depth 1,
    microseconds), ``max_read_iops`` (random reads of ``access_bytes`` per second at
    saturation), ``read_bandwidth_gbps`` (read bandwidth, 10^9 bytes per second),
    ``access_bytes`` (the block a read fetches: a power of two), ``active_watts`` /
    ``idle_watts``, ``capacity_gb`` (10^9 bytes), ``usd_per_gb``.

    ``sources`` maps a field name to where its number comes from; ``unverified`` names the
    fields no source here confirms (parameters to revisit, shown with ``*`` by
    ``sdm devices``).
    """

    name: str
    media: str
    access_bytes: int
    read_latency_us: float
    max_read_iops: float
    read_bandwidth_gbps: float
    active_watts: float
    idle_watts: float
    capacity_gb: float
    usd_per_gb: float
    sources: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    unverified: frozenset[str] = field(default_factory=frozenset, repr=False)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"device name must be a non-empty string, got {self.name!r}")
        where = f"device {self.name!r}"
        if not isinstance(self.media, str):
            raise ConfigError(f"{where}: media must be a string, got {self.media!r}")
        ab = check_int(self.access_bytes, f"{where}: access_bytes", lo=1, hi=MAX_ACCESS_BYTES, error=ConfigError)
        if ab & (ab - 1):
            raise ConfigError(f"{where}: access_bytes must be a power of two in [1, 2**24], got {ab}")
        object.__setattr__(self, "access_bytes", ab)
        for name in _NUMBERS:
            object.__setattr__(self, name, check_number(getattr(self, name), f"{where}: {name}", lo=0,
                                                        lo_open=name in _POSITIVE, error=ConfigError))
        sources = tuple(self.sources.items()) if isinstance(self.sources, dict) else tuple(self.sources)
        known = set(_NUMBERS) | {"access_bytes"}
        for entry in sources:
            if not (isinstance(entry, tuple) and len(entry) == 2 and entry[0] in known):
                raise ConfigError(f"{where}: sources must pair a numeric field {sorted(known)} "
                                  f"with its source text, got {entry!r}")
        object.__setattr__(self, "sources", tuple((str(k), str(v)) for k, v in sources))
        unverified = frozenset(self.unverified)
        if not unverified <= known:
            raise ConfigError(f"{where}: unverified names unknown field(s) {sorted(unverified - known)}")
        object.__setattr__(self, "unverified", unverified)

    # -- the model -------------------------------------------------------------------

    def latency_ns(self, queue_depth: int) -> float:
        """Latency of one read with ``queue_depth`` reads in flight: ``max(L, qd / IOPS)``."""
        return max(self.read_latency_us * 1e3, queue_depth * 1e9 / self.max_read_iops)

    def service_ns(self, reads: int, queue_depth: int) -> int:
        """Modeled time for ``reads`` block reads issued ``queue_depth`` at a time (ns)."""
        if reads <= 0:
            return 0
        inflight = min(queue_depth, reads)
        waves = -(-reads // inflight)
        latency = waves * self.latency_ns(inflight)
        transfer = reads * self.access_bytes / self.read_bandwidth_gbps  # bytes / (B/ns)
        return int(round(max(latency, transfer)))

    def iops(self, queue_depth: int) -> float:
        """Sustained reads per second at ``queue_depth``: the model's throughput."""
        per_read = max(self.latency_ns(queue_depth) / queue_depth,
                       self.access_bytes / self.read_bandwidth_gbps)
        return 1e9 / per_read

    def energy_j(self, busy_ns: float, elapsed_ns: float) -> float:
        """Joules over ``elapsed_ns`` of which ``busy_ns`` were spent serving reads."""
        busy = min(busy_ns, elapsed_ns)
        return (self.active_watts * busy + self.idle_watts * (elapsed_ns - busy)) / 1e9

    # -- description -----------------------------------------------------------------

    def source(self, name: str) -> str:
        """Where field ``name``'s number comes from ("" when not recorded)."""
        return dict(self.sources).get(name, "")

    def to_json(self) -> dict:
        data = asdict(self)
        data["sources"] = dict(self.sources)
        data["unverified"] = sorted(self.unverified)
        return data


def _spec(name, media, access_bytes, latency_us, iops, gbps, active_w, idle_w, capacity_gb,
          usd_per_gb, sources, unverified=()):
    return DeviceSpec(name, media, access_bytes, latency_us, iops, gbps, active_w, idle_w,
                      capacity_gb, usd_per_gb, tuple(sources.items()), frozenset(unverified))


_INTEL_P4500 = "Intel SSD DC P4500 product specification (REFERENCES.md Devices)"
_P3700 = "AnandTech Intel SSD DC P3700 review, measured (REFERENCES.md Devices)"
_P4800X_SPEC = "Intel Optane SSD DC P4800X specification (REFERENCES.md Devices)"
_P4800X_MEAS = "AnandTech Optane SSD DC P4800X review, measured (REFERENCES.md Devices)"
_PARAM = "parameter: no public figure recorded in REFERENCES.md"

#: Device presets by name. Every number carries its source; ``unverified`` fields are
#: parameters (choose your own with a TOML inline device, see ``sdm.store.config``).
DEVICES: dict[str, DeviceSpec] = {d.name: d for d in (
    _spec("nand-p4500", "TLC Nand SSD, NVMe", 4096, 85.0, 645_000, 3.2, 12.0, 5.0, 2000, 0.25, {
        "access_bytes": "4 KiB Nand page read (REFERENCES.md Devices)",
        "read_latency_us": _INTEL_P4500 + ": 85 us (1-2 TB models; 115 us at 4 TB)",
        "max_read_iops": _INTEL_P4500 + ": top of its 280K-645K 4K random-read range",
        "read_bandwidth_gbps": _INTEL_P4500 + ": 3.2 GB/s",
        "active_watts": "parameter within the ~10-15 W of REFERENCES.md",
        "idle_watts": _PARAM, "capacity_gb": "parameter (2 TB model)", "usd_per_gb": _PARAM},
        ("max_read_iops", "active_watts", "idle_watts", "capacity_gb", "usd_per_gb")),
    _spec("nand-p3700", "MLC Nand SSD, NVMe", 4096, 77.9, 167_000, 2.8, 12.0, 4.0, 1600, 0.5, {
        "access_bytes": "4 KiB Nand page read (REFERENCES.md Devices)",
        "read_latency_us": _P3700 + ": 77.9 us mean at QD1",
        "max_read_iops": _P3700 + ": 167K 4K random reads at QD16 (model: 95.8 us at QD16, "
                                  "93.9 us measured)",
        "read_bandwidth_gbps": _PARAM, "active_watts": _PARAM, "idle_watts": _PARAM,
        "capacity_gb": _PARAM, "usd_per_gb": _PARAM},
        ("read_bandwidth_gbps", "active_watts", "idle_watts", "capacity_gb", "usd_per_gb")),
    _spec("optane-p4800x-4k", "3D XPoint SSD, NVMe", 4096, 8.9, 585_000, 2.4, 9.0, 5.5, 375, 2.5, {
        "access_bytes": _P4800X_SPEC + ": 4 KiB sectors",
        "read_latency_us": _P4800X_MEAS + ": 8.9 us mean at QD1 (spec < 10 us)",
        "max_read_iops": _P4800X_MEAS + ": 585K 4K random reads at QD16 (spec 550K)",
        "read_bandwidth_gbps": _P4800X_SPEC + ": 2.4 GB/s read",
        "active_watts": _P4800X_SPEC + ": 8-10 W active read (midpoint)",
        "idle_watts": _P4800X_SPEC + ": 5-6 W idle (midpoint)",
        "capacity_gb": "parameter (375 GB model)", "usd_per_gb": _PARAM},
        ("capacity_gb", "usd_per_gb")),
    _spec("optane-p4800x-512", "3D XPoint SSD, NVMe, 512 B sectors", 512, 8.9, 585_000, 2.4, 9.0, 5.5,
          375, 2.5, {
        "access_bytes": _P4800X_SPEC + ": 512 B sector format",
        "read_latency_us": _P4800X_MEAS + ": 8.9 us mean at QD1 (4K reads; assumed for 512 B)",
        "max_read_iops": _P4800X_MEAS + ": 585K at QD16 for 4K reads; assumed for 512 B",
        "read_bandwidth_gbps": _P4800X_SPEC + ": 2.4 GB/s read",
        "active_watts": _P4800X_SPEC + ": 8-10 W active read (midpoint)",
        "idle_watts": _P4800X_SPEC + ": 5-6 W idle (midpoint)",
        "capacity_gb": "parameter (375 GB model)", "usd_per_gb": _PARAM},
        ("read_latency_us", "max_read_iops", "capacity_gb", "usd_per_gb")),
    _spec("optane-p5800x", "3D XPoint SSD, PCIe 4", 4096, 5.0, 1_500_000, 7.0, 12.0, 5.0, 800, 3.0, {
        "access_bytes": "4 KiB (512 B also offered; REFERENCES.md Devices)",
        "read_latency_us": "vendor claim ~5 us (REFERENCES.md, unverified)",
        "max_read_iops": "vendor claim ~1.5M 4K (REFERENCES.md, unverified)",
        "read_bandwidth_gbps": "vendor claim ~7 GB/s (REFERENCES.md, unverified)",
        "active_watts": _PARAM, "idle_watts": _PARAM, "capacity_gb": _PARAM, "usd_per_gb": _PARAM},
        ("read_latency_us", "max_read_iops", "read_bandwidth_gbps", "active_watts", "idle_watts",
         "capacity_gb", "usd_per_gb")),
    _spec("optane-pmem", "3D XPoint DIMM (Optane PMem)", 256, 0.305, 39.4e9 / 256, 39.4, 15.0, 5.0,
          768, 4.0, {
        "access_bytes": "256 B XPLine (Yang et al., FAST'20)",
        "read_latency_us": "305 ns random load (Izraelevitz et al. 2019)",
        "max_read_iops": "derived: read bandwidth / 256 B",
        "read_bandwidth_gbps": "39.4 GB/s read over 6 DIMMs (Yang et al., FAST'20)",
        "active_watts": _PARAM, "idle_watts": _PARAM,
        "capacity_gb": "parameter (6 x 128 GB DIMMs)", "usd_per_gb": _PARAM},
        ("max_read_iops", "active_watts", "idle_watts", "capacity_gb", "usd_per_gb")),
    _spec("dram", "DDR4/5 DRAM", 64, 0.1, 51e9 / 64, 51.0, 0.4 * 256, 0.05 * 256, 256, 3.0, {
        "access_bytes": "64 B cache line",
        "read_latency_us": "~100 ns (REFERENCES.md Devices)",
        "max_read_iops": "derived: read bandwidth / 64 B",
        "read_bandwidth_gbps": "~51 GB/s per host (TorchRec planner constant, REFERENCES.md)",
        "active_watts": "0.4 W/GB x 256 GB (top of the 0.05-0.4 W/GB parameter range)",
        "idle_watts": "0.05 W/GB x 256 GB (bottom of the 0.05-0.4 W/GB parameter range)",
        "capacity_gb": "parameter (256 GB host)", "usd_per_gb": _PARAM},
        ("max_read_iops", "active_watts", "idle_watts", "capacity_gb", "usd_per_gb")),
)}


def get_device(device) -> DeviceSpec:
    """A :class:`DeviceSpec` from a preset name or a spec (returned as is)."""
    if isinstance(device, DeviceSpec):
        return device
    if isinstance(device, str) and device in DEVICES:
        return DEVICES[device]
    raise ConfigError(f"device {device!r} is not a preset; presets: {sorted(DEVICES)}")


# -- blocks ------------------------------------------------------------------------------

@jit
def blocks_of(offsets, row_bytes, block_bytes):
    """:func:`count_blocks` on trusted arguments (the hot path of every metered read):
    ``offsets`` ``(n,)`` int64 C-contiguous in any order, sizes >= 1."""
    for i in range(1, offsets.shape[0]):
        if offsets[i] < offsets[i - 1]:
            return _count_sorted_blocks(np.sort(offsets), row_bytes, block_bytes)
    return _count_sorted_blocks(offsets, row_bytes, block_bytes)


@jit
def _count_sorted_blocks(offsets, row_bytes, block_bytes):
    # offsets ascending: a block is new unless an earlier row already reached it.
    count = 0
    reached = -1
    for i in range(offsets.shape[0]):
        first = offsets[i] // block_bytes
        last = (offsets[i] + row_bytes - 1) // block_bytes
        if first <= reached:
            first = reached + 1
        if last >= first:
            count += last - first + 1
        if last > reached:
            reached = last
    return count


def count_blocks(offsets: np.ndarray, row_bytes: int, block_bytes: int) -> int:
    """Distinct ``block_bytes`` blocks covered by rows ``[offset, offset + row_bytes)``.

    Args:
        offsets: ``(n,)`` int64 byte offsets of the rows in a medium (any order; rows read
            in one batch share the blocks they have in common).
        row_bytes: bytes per row, >= 1.
        block_bytes: the device's access unit, >= 1.

    Returns:
        The number of whole blocks a device reads for the batch (a row straddling a block
        boundary costs two).
    """
    row_bytes, block_bytes = check_int(row_bytes, "row_bytes", lo=1), check_int(block_bytes, "block_bytes", lo=1)
    return int(blocks_of(np.ascontiguousarray(offsets, dtype=np.int64), np.int64(row_bytes),
                         np.int64(block_bytes)))


def block_ranges(offsets: np.ndarray, row_bytes: int, block_bytes: int) -> np.ndarray:
    """The distinct blocks covered by the rows, ascending: ``(m,) int64`` block numbers."""
    offsets = np.asarray(offsets, dtype=np.int64)
    first = offsets // block_bytes
    span = (offsets + row_bytes - 1) // block_bytes - first + 1
    if offsets.size and span.max() == 1:
        return np.unique(first)
    starts = np.repeat(first, span)
    within = np.arange(starts.size) - np.repeat(np.cumsum(span) - span, span)
    return np.unique(starts + within)

"""What the machine itself takes from a serving process: stalls while it runs, late wake-ups.

A request's latency on a real machine is more than its CPU work and device reads. The
operating system, and on a virtual machine the hypervisor, takes the core from a running
thread now and then (interrupts, other tasks, steal time), and a thread that blocked on a
device or an idle queue wakes some time after it could have run. On this project's 2-core VMs
both are large: a spinning thread loses 3-5% of its time in ~460 gaps a second, a few of them
tens of milliseconds long, and a 1-3 ms wait wakes a median 0.1 ms and a p99 2 ms late
(bench/RESULTS.md, the host model). They set the p99 of a lightly loaded host.

:func:`measure_platform` measures both, the way jHiccup measures a JVM's: a thread spins on
the clock and records every gap longer than :data:`GAP_NS` (the time it was not running), then
waits for short deadlines the way a paced store waits for its devices
(:func:`sdm.tiers.clock.wait_until_ns`) and records how late each wait returned.
:class:`PlatformNoise` holds the result, and :meth:`PlatformNoise.draw` turns it into the
stalls and wake-ups the host simulation adds to each request
(:func:`sdm.kernels.hostsim.simulate_host`): stalls arrive as a Poisson process over a CPU
task's running time, at the measured rate, each as long as a measured gap drawn at random;
wake-ups are measured lateness drawn at random.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from sdm.errors import ConfigError
from sdm.tiers.clock import wait_until_ns
from sdm.validate import check_number

__all__ = ["PlatformNoise", "measure_platform", "GAP_NS"]

#: A gap in a spinning thread's clock reads longer than this is a stall (the loop itself turns
#: in well under a microsecond).
GAP_NS = 20_000
_KEEP = 512  # samples kept of each distribution: evenly spaced order statistics
_WAITS_NS = (500_000, 3_000_000)  # the waits measured are uniform in this range


@dataclass(frozen=True)
class PlatformNoise:
    """Stalls and wake-ups of one machine.

    ``stall_rate_per_s``: stalls per second of a thread's running time; ``stall_us``: their
    lengths (µs, ascending: an even sample of the measured ones); ``wakeup_us``: how late a
    blocked thread runs after its wait ends (µs, ascending); ``source``: how they were found.
    """

    stall_rate_per_s: float
    stall_us: tuple[float, ...]
    wakeup_us: tuple[float, ...]
    source: str = ""

    def __post_init__(self):
        object.__setattr__(self, "stall_rate_per_s", check_number(
            self.stall_rate_per_s, "platform stall_rate_per_s", lo=0, hi=1e6, error=ConfigError))
        for name in ("stall_us", "wakeup_us"):
            values = getattr(self, name)
            if not isinstance(values, (tuple, list)) or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= 1e7
                    for v in values):
                raise ConfigError(f"platform {name} must be a list of microseconds in [0, 1e7], got {values!r}")
            object.__setattr__(self, name, tuple(sorted(float(v) for v in values)))
        if self.stall_rate_per_s > 0 and not self.stall_us:
            raise ConfigError(f"platform stall_rate_per_s is {self.stall_rate_per_s:g} but stall_us is empty")

    @property
    def stolen_share(self) -> float:
        """The share of a running thread's time taken by stalls."""
        return self.stall_rate_per_s * (float(np.mean(self.stall_us)) if self.stall_us else 0.0) * 1e-6

    def draw(self, rng: np.random.Generator, cpu_ns: np.ndarray, n_wakes: int) -> tuple[np.ndarray, np.ndarray]:
        """Stalls of the CPU tasks ``cpu_ns`` ``(N, k)`` float64 ns (a task of 0 ns stalls 0)
        and ``(N, n_wakes)`` wake-ups, both float64 ns, for N arrivals."""
        cpu_ns = np.asarray(cpu_ns, dtype=np.float64)
        stall = np.zeros(cpu_ns.size)
        counts = rng.poisson(self.stall_rate_per_s * 1e-9 * cpu_ns.ravel()) if self.stall_us else None
        if counts is not None and counts.any():
            lengths = np.asarray(self.stall_us)[rng.integers(0, len(self.stall_us), int(counts.sum()))] * 1e3
            stall = np.bincount(np.repeat(np.arange(cpu_ns.size), counts), weights=lengths, minlength=cpu_ns.size)
        wake = np.zeros((cpu_ns.shape[0], n_wakes))
        if self.wakeup_us:
            wake = np.asarray(self.wakeup_us)[rng.integers(0, len(self.wakeup_us), wake.shape)] * 1e3
        return stall.reshape(cpu_ns.shape), wake

    def summary(self) -> dict:
        def q(values, p):
            return float(np.percentile(values, p)) if values else 0.0

        return {"stall_rate_per_s": self.stall_rate_per_s, "stolen_share": self.stolen_share,
                "stall_us": {"p50": q(self.stall_us, 50), "p99": q(self.stall_us, 99),
                             "max": max(self.stall_us, default=0.0)},
                "wakeup_us": {"p50": q(self.wakeup_us, 50), "p99": q(self.wakeup_us, 99),
                              "max": max(self.wakeup_us, default=0.0)},
                "source": self.source}

    def to_json(self) -> dict:
        return {"stall_rate_per_s": self.stall_rate_per_s, "stall_us": list(self.stall_us),
                "wakeup_us": list(self.wakeup_us), "source": self.source}


def _spaced(values: np.ndarray) -> tuple[float, ...]:
    """At most :data:`_KEEP` evenly spaced order statistics of ``values`` (µs), max included."""
    values = np.sort(values)
    if values.size > _KEEP:
        values = values[np.linspace(0, values.size - 1, _KEEP).round().astype(np.int64)]
    return tuple(float(v) for v in values)


def measure_platform(spin_s: float = 1.0, waits: int = 250, *, seed: int = 0) -> PlatformNoise:
    """Measure this machine's :class:`PlatformNoise`: spin ``spin_s`` seconds on the clock,
    then take ``waits`` paced waits of 0.5-3 ms (about 0.45 s per 250)."""
    spin_s = check_number(spin_s, "spin_s (seconds)", lo=0, hi=600, lo_open=True)
    if isinstance(waits, bool) or not isinstance(waits, int) or not 1 <= waits <= 100_000:
        raise ConfigError(f"waits must be an integer in [1, 100000], got {waits!r}")
    clock = time.perf_counter_ns
    gaps = []
    start = last = clock()
    end = start + int(spin_s * 1e9)
    while last < end:
        now = clock()
        if now - last > GAP_NS:
            gaps.append(now - last)
        last = now
    spun_s = (last - start) / 1e9
    running_s = spun_s - sum(gaps) / 1e9
    late = []
    for wait in np.random.default_rng(seed).uniform(*_WAITS_NS, waits):
        deadline = clock() + int(wait)
        late.append(wait_until_ns(deadline) - deadline)
    return PlatformNoise(
        stall_rate_per_s=len(gaps) / running_s, stall_us=_spaced(np.asarray(gaps, dtype=np.float64) / 1e3),
        wakeup_us=_spaced(np.asarray(late, dtype=np.float64) / 1e3),
        source=f"measured on this machine: {len(gaps)} gaps over {GAP_NS / 1e3:g} us in {spun_s:.2f} s of "
               f"spinning, the lateness of {waits} paced waits of 0.5-3 ms")

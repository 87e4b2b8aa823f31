"""The latency model of a replay: request latency percentiles and the QPS a latency SLA allows.

Each replayed request has a modeled *service time*: the device time its
``Store.embedding_bags`` call charged to the store's simulated clock (every tier's reads,
issued in waves at the tier's queue depth; the request is done when its slowest lookup is).
The store's clock serves one request after another, so the hierarchy is modeled as a single
FCFS server:

* requests arrive open-loop, as a Poisson process of rate ``lambda`` (seeded exponential
  gaps; the same unit gaps are scaled for every rate, so the response times grow
  monotonically with the rate and a bisection is well defined);
* the measured service times are served in trace order, cycled whole until at least
  ``min_arrivals`` requests have arrived (so a short trace still gives a stable p99);
* response time = wait + service, the wait from Lindley's recursion
  ``W[n+1] = max(0, W[n] + S[n] - A[n+1])`` (a Numba kernel);
* the *QPS at SLA* is the highest ``lambda`` whose response-time percentile (p99 by
  default) stays within the SLA, found by bisection to a relative tolerance.

Every percentile here, reported or searched, is the nearest-rank one
(:func:`percentile_of`): a value some request really took, and unchanged by cycling the
service times, so the p99 a replay prints is exactly the zero-load p99 the SLA search
starts from. A zero-load percentile above the SLA means no rate meets it (the devices alone
are too slow): the result says so, with QPS 0 and the reason.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from fractions import Fraction

import numpy as np

from sdm.kernels.jit import jit
from sdm.devices import get_device
from sdm.errors import InvalidArgumentError
from sdm.validate import check_int, check_number
from sdm.tiers.metered import DeviceQueue

__all__ = ["SlaError", "SlaResult", "DEFAULT_SLA_US", "PERCENTILES", "percentile_of", "latency_percentiles_us",
           "response_times_ns", "response_percentile_ns", "qps_at_sla", "check_sla_us",
           "service_ns_array"]

#: Default latency SLA, microseconds, at the 99th percentile: MLPerf Inference's DLRM server
#: scenario bound of 30 ms (a parameter: not checked against a source in REFERENCES.md).
DEFAULT_SLA_US = 30_000.0
#: The percentiles reported, by JSON key.
PERCENTILES = {"p50": 50.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}
_MIN_ARRIVALS = 100_000


class SlaError(InvalidArgumentError):
    """An SLA that is not a number > 0, or one that does not bound the rate at all."""


def check_sla_us(sla_us) -> float:
    """``sla_us`` as a float, or :class:`SlaError` unless it is a finite number > 0."""
    return check_number(sla_us, "the SLA (microseconds)", lo=0, lo_open=True, error=SlaError)


def _check_service(service_ns) -> np.ndarray:
    s = np.asarray(service_ns)
    if s.ndim != 1 or s.dtype == np.bool_ or not (np.issubdtype(s.dtype, np.integer)
                                                  or np.issubdtype(s.dtype, np.floating)):
        raise InvalidArgumentError(f"service times must be a 1-D numeric array of nanoseconds, "
                                   f"got {s.dtype} {s.shape}")
    s = np.ascontiguousarray(s, dtype=np.float64)
    if s.size and (not np.all(np.isfinite(s)) or s.min() < 0):
        raise InvalidArgumentError("service times must be finite and >= 0 ns")
    return s


def _rank_index(n: int, q: float) -> int:
    """The 0-based position of the nearest-rank ``q`` percentile among ``n`` sorted values:
    ``ceil(q n / 100) - 1``, computed exactly (``99.9 * 1000`` is not 99900 in floats)."""
    return max(0, math.ceil(Fraction(repr(float(q))) * n / 100) - 1)


def percentile_of(values, q: float) -> float:
    """The nearest-rank ``q`` percentile of a non-empty ``(n,)`` array: the smallest value
    that at least ``q`` % of the values do not exceed. The one definition sdm reports."""
    a = np.asarray(values)
    k = _rank_index(a.shape[0], q)
    return float(np.partition(a, k)[k])


def latency_percentiles_us(latency_ns) -> dict:
    """``{"p50", "p95", "p99", "p999"}`` of ``(n,)`` latencies in ns, in microseconds
    (nearest rank, :func:`percentile_of`; zeros for an empty array)."""
    s = _check_service(latency_ns)
    if s.size == 0:
        return {k: 0.0 for k in PERCENTILES}
    return {k: percentile_of(s, q) / 1e3 for k, q in PERCENTILES.items()}


@jit
def _lindley(service, gaps, scale, limit, out):
    """Response times of a FCFS queue: ``out[i] = W[i] + service[i]``, with arrivals
    ``gaps[i] * scale`` ns after the previous one (``gaps[0]`` unused). Returns how many
    exceed ``limit``."""
    w = 0.0
    over = 0
    for i in range(service.shape[0]):
        if i > 0:
            w = w + service[i - 1] - gaps[i] * scale
            if w < 0.0:
                w = 0.0
        r = w + service[i]
        out[i] = r
        if r > limit:
            over += 1
    return over


class _Queue:
    """Cycled service times and seeded unit-mean exponential gaps, reused across rates."""

    def __init__(self, service_ns, min_arrivals: int, seed: int):
        s = _check_service(service_ns)
        if s.size == 0:
            raise InvalidArgumentError("no requests: the queueing model needs at least one service time")
        min_arrivals = check_int(min_arrivals, "min_arrivals", lo=1)
        cycles = -(-min_arrivals // s.size)
        self.service = np.tile(s, cycles)
        self.gaps = np.random.default_rng(seed).standard_exponential(self.service.size)
        self.out = np.empty_like(self.service)
        self.mean_ns = float(s.mean())

    def _run(self, rate_per_s: float, limit: float) -> int:
        if rate_per_s <= 0:
            self.out[:] = self.service
            return int(np.count_nonzero(self.service > limit))
        return int(_lindley(self.service, self.gaps, 1e9 / rate_per_s, limit, self.out))

    def percentile(self, rate_per_s: float, q: float) -> float:
        self._run(rate_per_s, np.inf)
        return percentile_of(self.out, q)

    def within(self, rate_per_s: float, q: float, limit: float) -> bool:
        """Whether the ``q`` percentile (:func:`percentile_of`) is ``<= limit``: the sorted
        responses' value at the rank index is, exactly when no more responses than those
        after it exceed ``limit``."""
        over = self._run(rate_per_s, limit)
        n = self.out.shape[0]
        return over <= n - 1 - _rank_index(n, q)


def response_times_ns(service_ns, rate_per_s: float, *, min_arrivals: int = _MIN_ARRIVALS,
                      seed: int = 0) -> np.ndarray:
    """Response times ``(m,)`` float64 ns of the queue at ``rate_per_s`` arrivals per second
    (``m`` = the service times cycled to at least ``min_arrivals``)."""
    q = _Queue(service_ns, min_arrivals, seed)
    q._run(float(rate_per_s), np.inf)
    return q.out.copy()


def response_percentile_ns(service_ns, rate_per_s: float, percentile: float = 99.0, *,
                           min_arrivals: int = _MIN_ARRIVALS, seed: int = 0) -> float:
    """The ``percentile`` of response times at ``rate_per_s`` (0: zero load), ns."""
    return _Queue(service_ns, min_arrivals, seed).percentile(float(rate_per_s), percentile)


@dataclass(frozen=True)
class SlaResult:
    """Outcome of :func:`qps_at_sla`.

    ``qps``: the highest arrival rate meeting the SLA (``inf`` when every service time is 0);
    ``latency_at_qps_us``: the percentile reached there; ``zero_load_us``: the percentile
    with no queueing; ``saturation_qps``: ``1 / mean service`` (utilization 1);
    ``utilization``: ``qps`` x mean service; ``reason``: why ``qps`` is 0 when no rate
    meets the SLA (None when one does).
    """

    sla_us: float
    percentile: float
    qps: float
    latency_at_qps_us: float
    zero_load_us: float
    saturation_qps: float
    utilization: float
    arrivals: int
    reason: str | None = None

    def to_json(self) -> dict:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in asdict(self).items()}


def qps_at_sla(service_ns, sla_us, *, percentile: float = 99.0, min_arrivals: int = _MIN_ARRIVALS,
               seed: int = 0, rtol: float = 1e-4) -> SlaResult:
    """The highest Poisson arrival rate whose response-time ``percentile`` stays within
    ``sla_us``, for requests with service times ``service_ns`` ``(n,)`` (ns). An SLA below
    the zero-load percentile is met by no rate: ``qps`` 0, and ``reason`` names both.

    Raises:
        SlaError: ``sla_us`` not > 0, or met at every rate.
        InvalidArgumentError: no service times, or negative / non-finite ones.
    """
    sla_us = check_sla_us(sla_us)
    if not 0.0 < float(percentile) < 100.0:
        raise InvalidArgumentError(f"percentile must be in (0, 100), got {percentile!r}")
    queue = _Queue(service_ns, min_arrivals, seed)
    # A latency meets the SLA when its microseconds (ns / 1e3, as reported) do; sla_us x 1e3 can
    # round one ulp below a latency printed equal to the SLA (1.001 us x 1e3 < 1001 ns).
    sla_ns = sla_us * 1e3 * (1 + 1e-12)
    zero = queue.percentile(0.0, percentile)
    n = int(queue.service.size)
    saturation = 1e9 / queue.mean_ns if queue.mean_ns else float("inf")
    if zero > sla_ns:
        why = (f"SLA {sla_us:g} us is below the devices' own p{percentile:g} latency of "
               f"{zero / 1e3:,.1f} us per request at zero load; no request rate meets it")
        return SlaResult(sla_us, float(percentile), 0.0, zero / 1e3, zero / 1e3, saturation, 0.0, n, why)
    if queue.mean_ns == 0.0:
        return SlaResult(sla_us, float(percentile), float("inf"), 0.0, 0.0, saturation, 0.0, n)
    lo, hi = 0.0, saturation
    for _ in range(64):  # beyond saturation the queue grows without bound, but a finite run may still fit
        if not queue.within(hi, percentile, sla_ns):
            break
        lo, hi = hi, hi * 2.0
    else:
        raise SlaError(f"SLA {sla_us:g} us is met even at {hi:.3g} requests/s; it does not bound the rate")
    while hi - lo > rtol * hi:
        mid = 0.5 * (lo + hi)
        if queue.within(mid, percentile, sla_ns):
            lo = mid
        else:
            hi = mid
    at = queue.percentile(lo, percentile)
    return SlaResult(sla_us, float(percentile), lo, at / 1e3, zero / 1e3, saturation,
                     lo * queue.mean_ns / 1e9, n)


def service_ns_array(device, reads, queue_depth: int) -> np.ndarray:
    """How long each batch of ``reads`` ``(n,)`` int64 block reads takes alone on ``device``
    at ``queue_depth``, ``(n,)`` int64 ns: the shared device queue's charge for a serial
    stream (:meth:`sdm.tiers.metered.DeviceQueue.lone_ns`), rounded as the store rounds it."""
    queue_depth = check_int(queue_depth, "queue_depth", lo=1)
    took = DeviceQueue(get_device(device)).lone_ns(np.asarray(reads, dtype=np.int64), queue_depth)
    return np.rint(took).astype(np.int64)

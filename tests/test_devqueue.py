"""The shared device queue (sdm.kernels.devqueue, sdm.tiers.metered.DeviceQueue): against a
plain-Python transcription of its rules, the static form of a lone batch, a c-server FCFS queue
when every batch is one read on integer units, the M/D/1 closed form (Pollaczek-Khinchine) on
one unit, and requests that leave units idle running side by side."""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_devqueue import ReferenceDevice
from sdm.devices import get_device
from sdm.kernels.devqueue import grow_device_state, make_device_state, reserve
from sdm.tiers.metered import DeviceQueue


def run(batches, latency, units, capacity=2):
    """``(took, in_device)`` of each ``(issue_ns, reads, queue_depth)`` through the kernel, in
    the order given, each with the watermark of the earliest issue still to come, on arrays
    grown as :class:`DeviceQueue` grows them (from a tiny capacity, to exercise it)."""
    state = make_device_state(capacity)
    out = []
    for k, (issue, reads, qd) in enumerate(batches):
        state = grow_device_state(state)
        times, used, count, _ = state
        keep_from = min(float(b[0]) for b in batches[k:])
        out.append(reserve(*state, keep_from, float(issue), reads, qd, latency, units))
        assert count[0] == 0 or used[count[0] - 1] == 0.0  # the last step frees every unit
        assert np.all(np.diff(times[:count[0]]) > 0) and np.all(used[:count[0]] <= units)
    return out


_batches = st.lists(st.tuples(st.floats(0, 1e6), st.integers(0, 200), st.integers(1, 64)), max_size=30)


@settings(max_examples=300, deadline=None)
@given(_batches, st.floats(1, 1e5), st.floats(0.3, 100))
def test_kernel_equals_the_rules(batches, latency, units):
    batches = sorted(batches)  # requests arrive in time order
    ref = ReferenceDevice(latency, units)
    want = [ref.submit(*b) for b in batches]
    got = run(batches, latency, units)
    assert [t for t, _ in got] == pytest.approx(want, rel=1e-9, abs=1e-6)
    assert sum(d for _, d in got) == pytest.approx(ref.in_device, rel=1e-9, abs=1e-6)


@settings(max_examples=300, deadline=None)
@given(_batches, st.floats(1, 1e5), st.floats(0.3, 100), st.randoms(use_true_random=False))
def test_batches_out_of_issue_order_see_every_earlier_reservation(batches, latency, units, rng):
    """Submitted out of issue order (as one request's later tables come after the next
    request's first), with the watermark of the earliest issue still to come: still the rules."""
    rng.shuffle(batches)
    ref = ReferenceDevice(latency, units)
    want = [ref.submit(*b) for b in batches]
    assert [t for t, _ in run(batches, latency, units)] == pytest.approx(want, rel=1e-9, abs=1e-6)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 5000)), max_size=60), st.integers(1, 8),
       st.integers(1, 10**4))
def test_one_read_batches_on_integer_units_are_a_c_server_fcfs_queue(batches, units, latency):
    """One read per batch holds one whole unit: the device is then exactly c servers taking
    reads first come first served in submission order (a heap of when each server frees)."""
    batches = sorted(batches)
    free = [0.0] * units
    want = []
    for issue, _ in batches:
        start = max(issue, heapq.heappop(free))
        heapq.heappush(free, start + latency)
        want.append(start + latency - issue)
    got = run([(t, 1, qd) for t, qd in batches], float(latency), float(units))
    assert [t for t, _ in got] == pytest.approx(want, rel=1e-12, abs=1e-6)


@pytest.mark.parametrize("device", ["nand-p4500", "optane-p4800x-512", "optane-p4800x-4k", "dram"])
@pytest.mark.parametrize("reads, qd", [(1, 1), (7, 16), (16, 16), (64, 16), (100, 1), (1000, 32)])
def test_a_lone_batch_reproduces_the_static_form(device, reads, qd):
    dev = get_device(device)
    q = DeviceQueue(dev)
    took = q.submit(0.0, reads, qd)
    latency = dev.read_latency_us * 1e3
    c = min(qd, reads)
    if c * q.spacing_ns <= latency:  # latency-bound: waves of the latency
        assert took == pytest.approx(math.ceil(reads / c) * latency)
    else:  # throughput-bound: the device's work, plus at most one latency of pipeline fill
        assert reads * q.spacing_ns * (1 - 1e-12) <= took <= reads * q.spacing_ns + latency
    if reads <= qd:  # one wave: exactly max(latency, k x spacing), DESIGN.md's static form
        assert took == pytest.approx(max(latency, reads * q.spacing_ns))


def test_lone_batches_are_what_an_idle_queue_charges():
    q = DeviceQueue("optane-p4800x-512")
    reads = np.array([0, 1, 7, 16, 17, 100, 1000])
    lone = q.lone_ns(reads, 16)
    for k, want in zip(reads, lone):
        busy = DeviceQueue("optane-p4800x-512")
        busy.submit(5e9, 3, 4)  # an earlier batch, long finished by 1e10
        assert busy.submit(1e10, int(k), 16) == want  # exactly: times are relative inside


def test_units_come_from_iops_and_latency_or_an_override():
    nand = DeviceQueue("nand-p4500")
    dev = get_device("nand-p4500")
    assert nand.units == pytest.approx(dev.max_read_iops * dev.read_latency_us * 1e-6)
    assert 50 < nand.units < 60  # ~55 for the P4500 (REFERENCES.md)
    assert 5 < DeviceQueue("optane-p4800x-4k").units < 5.5
    eight = DeviceQueue("nand-p4500", units=8)
    assert eight.units == pytest.approx(8)
    # with 8 units, 64 reads at queue depth 64 take 8 waves of the latency
    assert eight.submit(0.0, 64, 64) == pytest.approx(8 * dev.read_latency_us * 1e3)


def test_requests_queue_behind_each_other():
    q = DeviceQueue("nand-p4500", units=4)
    latency = q.latency_ns
    first = q.submit(0.0, 4, 4)
    second = q.submit(0.0, 4, 4)  # same instant: waits for the first's work
    assert first == pytest.approx(latency) and second == pytest.approx(2 * latency)
    later = q.submit(10 * latency, 4, 4)  # the device is idle again
    assert later == pytest.approx(latency)
    reads, in_device = q.counters()
    # the second batch's reads wait a whole latency for the first's units, then take one
    assert reads == 12 and in_device == pytest.approx((4 + 4 * 2 + 4) * latency)


def test_one_unit_is_an_md1_queue():
    """With latency == spacing (one unit) and one read per request, a read's response is an
    M/D/1 queue's: mean wait rho * s / (2 (1 - rho)) (Pollaczek-Khinchine)."""
    q = DeviceQueue("nand-p4500", units=1)
    s = q.spacing_ns
    assert q.latency_ns == pytest.approx(s)
    rng = np.random.default_rng(0)
    rho = 0.7
    arrivals = np.cumsum(rng.exponential(s / rho, 400_000))
    response = np.array([q.submit(t, 1, 1) for t in arrivals])[20_000:]
    want = s + rho * s / (2 * (1 - rho))
    assert response.mean() == pytest.approx(want, rel=0.02)


def test_batches_that_leave_units_idle_run_side_by_side():
    """A P4500 (~55 units) at queue depth 16: three requests of 64 reads hold 48 units and
    overlap completely, as a drive with tens of reads outstanding does; a fourth finds only
    the ~7 units left and waits for the first's to free."""
    q = DeviceQueue("nand-p4500")
    lone = 4 * q.latency_ns  # 64 reads in waves of 16
    took = [q.submit(i * 1000.0, 64, 16) for i in range(4)]
    assert took[:3] == pytest.approx([lone] * 3)
    # the fourth, issued at 3 us: the free units until the first batch ends at 4 latencies,
    # then its full 16 lanes for the rest of its 64 latencies of unit-ns
    free, first_ends = q.units - 48, lone - 3000.0
    assert took[3] == pytest.approx(first_ends + (64 * q.latency_ns - free * first_ends) / 16)


@pytest.mark.parametrize("device", ["nand-p4500", "optane-p4800x-4k", "dram"])
def test_a_saturated_device_serves_units_over_latency(device):
    """However the reads come (here 2000 batches of 1-9 reads at once, queue depths 1-16), a
    device kept busy completes them at its throughput, units / latency."""
    q = DeviceQueue(device)
    rng = np.random.default_rng(1)
    reads = rng.integers(1, 10, 2000)
    last = max(q.submit(0.0, int(k), int(d)) for k, d in zip(reads, rng.integers(1, 17, 2000)))
    assert last == pytest.approx(reads.sum() * q.latency_ns / q.units, rel=0.01)

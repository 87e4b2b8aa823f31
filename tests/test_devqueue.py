"""The shared device queue (sdm.kernels.devqueue, sdm.tiers.metered.DeviceQueue): against a
plain-Python transcription of its rules, the static form of a lone batch, and the M/D/1
closed form (Pollaczek-Khinchine) when the device has one unit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdm.devices import get_device
from sdm.kernels.devqueue import queue_reads
from sdm.tiers.metered import DeviceQueue


def reference(batches, latency, spacing, in_device=None):
    """Completion of each batch ``(issue_ns, reads, queue_depth)``, submitted in order: every
    read individually, FCFS on the device's work, ``queue_depth`` of a batch in flight.
    ``in_device`` (a list) gets the summed time each read spent issued and not complete."""
    work = 0.0
    out = []
    total = 0.0
    for issue, reads, qd in batches:
        done_of = []
        last = issue
        for i in range(reads):
            at = issue if i < qd else done_of[i - qd]  # issued when its lane's read completes
            work = max(work, at) + spacing
            done_of.append(max(at + latency, work))
            total += done_of[-1] - at
            last = done_of[-1]
        out.append(last)
    if in_device is not None:
        in_device.append(total)
    return out


def run(batches, latency, spacing, in_device=None):
    work = np.zeros(1)
    lanes = np.empty(1024)
    acc = np.zeros(1)
    out = [i + queue_reads(work, float(i), r, q, latency, spacing, lanes, acc) for i, r, q in batches]
    if in_device is not None:
        in_device.append(float(acc[0]))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e6), st.integers(0, 200), st.integers(1, 64)), max_size=30),
       st.floats(1, 1e5), st.floats(0.1, 1e4))
def test_kernel_equals_the_rules(batches, latency, spacing):
    batches = sorted(batches)  # requests arrive in time order
    assert run(batches, latency, spacing) == pytest.approx(reference(batches, latency, spacing))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e7), st.integers(0, 5000), st.integers(1, 64)), max_size=8),
       st.floats(1, 1e5), st.floats(0.1, 1e4))
def test_long_batches_and_time_in_device_equal_the_rules(batches, latency, spacing):
    """Long batches take the kernel's closed-form steady states: still the rules, read by read."""
    batches = sorted(batches)
    got, want = [], []
    assert run(batches, latency, spacing, got) == pytest.approx(reference(batches, latency, spacing, want))
    assert got == pytest.approx(want)


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
    # the second batch's reads finish a quarter latency apart as the device's work allows
    assert reads == 12 and in_device == pytest.approx((4 + (1.25 + 1.5 + 1.75 + 2) + 4) * latency)


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

"""CPU slots (sdm.tiers.slots): at most n lookup calls of a store run their CPU work at once,
the rest queue first come first served, and a call that waits gives its slot up. Every wait
has a timeout, so a deadlock fails instead of hanging."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import sdm
from sdm.errors import InvalidArgumentError
from sdm.tiers.clock import wait_until_ns
from sdm.tiers.slots import CpuSlots, default_cpu_slots, give_up

TIMEOUT = 60


def _start(fn, *args):
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t


def _until(cond, what):
    end = time.monotonic() + TIMEOUT
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.001)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_at_most_n_hold_a_slot_under_stress(n):
    slots = CpuSlots(n)
    inside, most, lock = [0], [0], threading.Lock()

    def work():
        for _ in range(200):
            with slots.held():
                with lock:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0)  # let the others try
                with lock:
                    inside[0] -= 1

    threads = [_start(work) for _ in range(8)]
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive(), "a holder never finished: deadlock"
    # never passed; that n are reached is the next test's (here it rests on the scheduler: on
    # a busy machine 8 threads that sleep(0) need not overlap 3 at a time)
    assert 1 <= most[0] <= n
    assert slots._free == n and not slots._waiters


@pytest.mark.parametrize("n", [1, 2, 3])
def test_n_hold_a_slot_at_once_and_the_next_waits(n):
    slots = CpuSlots(n)
    meet = threading.Barrier(n + 1, timeout=TIMEOUT)  # the n holders and this thread
    leave = threading.Event()
    entered = []

    def hold(i):
        with slots.held():
            entered.append(i)
            if i < n:
                meet.wait()  # breaks (and fails the test below) unless n hold at once
                leave.wait(TIMEOUT)

    holders = [_start(hold, i) for i in range(n)]
    meet.wait()
    late = _start(hold, n)
    _until(lambda: len(slots._waiters) == 1, "the next call to queue")
    assert sorted(entered) == list(range(n))  # it waits for a slot, not inside one
    leave.set()
    for t in holders + [late]:
        t.join(TIMEOUT)
        assert not t.is_alive(), "a holder never finished: deadlock"
    assert sorted(entered) == list(range(n + 1))
    assert slots._free == n and not slots._waiters


def test_waiters_are_served_first_come_first_served():
    slots = CpuSlots(1)
    order = []
    release = threading.Event()

    def first():
        with slots.held():
            release.wait(TIMEOUT)

    def waiter(i):
        with slots.held():
            order.append(i)

    threads = [_start(first)]
    _until(lambda: slots._free == 0, "the first holder")
    for i in range(6):  # queue them one at a time, so their arrival order is known
        threads.append(_start(waiter, i))
        _until(lambda: len(slots._waiters) == i + 1, f"waiter {i} to queue")
    release.set()
    for t in threads:
        t.join(TIMEOUT)
    assert order == list(range(6))


def test_give_up_frees_the_slot_for_the_rest_of_the_call():
    slots = CpuSlots(1)
    gave, second_in, done = threading.Event(), threading.Event(), threading.Event()

    def first():
        with slots.held():
            give_up()
            give_up()  # a second call changes nothing
            gave.set()
            assert second_in.wait(TIMEOUT)  # the other call ran while this one still "waits"
        done.set()

    def second():
        assert gave.wait(TIMEOUT)
        with slots.held():
            second_in.set()

    a, b = _start(first), _start(second)
    a.join(TIMEOUT)
    b.join(TIMEOUT)
    assert done.is_set() and second_in.is_set()
    assert slots._free == 1  # the slot given up was not released twice


def test_nested_calls_share_the_outer_slot_and_waits_outside_a_call_do_nothing():
    slots = CpuSlots(1)
    with slots.held():
        with slots.held():  # would deadlock if it took a second slot
            pass
        assert slots._free == 0
    assert slots._free == 1
    give_up()  # no call in progress
    wait_until_ns(time.perf_counter_ns() + 1000)
    assert slots._free == 1


def test_a_paced_wait_gives_the_slot_up():
    slots = CpuSlots(1)
    with slots.held():
        wait_until_ns(time.perf_counter_ns() + 2_000_000)
        assert slots._free == 1


def test_default_is_the_cores_this_process_may_use():
    assert 1 <= default_cpu_slots() <= len(os.sched_getaffinity(0))


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_a_bad_slot_count_is_a_clear_error(tmp_path, bad):
    path = tmp_path / "s"
    sdm.Store.create(path, [sdm.TableSpec("t", 10, 4, "fp32")]).close()
    with pytest.raises(InvalidArgumentError, match="cpu_slots"):
        sdm.Store.open(path, cpu_slots=bad)
    with pytest.raises(InvalidArgumentError, match="cpu_slots"):
        CpuSlots(0 if bad == -1 else bad)


@pytest.fixture(scope="module")
def nand_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("slots") / "s"
    rows = np.arange(4000 * 8, dtype=np.float32).reshape(4000, 8)
    with sdm.Store.create(path, [sdm.TableSpec("t", 4000, 8, "fp32")]) as store:
        store.write_table("t", rows)
    return path, rows


@pytest.mark.parametrize("cpu_slots", [1, 2, 0])
def test_threads_over_a_bounded_store_equal_a_serial_run(nand_store, cpu_slots):
    path, rows = nand_store
    from sdm.store.config import HIERARCHY_PRESETS, with_options
    config = with_options(HIERARCHY_PRESETS["sdm-nand"], cache_bytes=300 * 64)  # misses and waits
    rng = np.random.default_rng(1)
    batches = []
    for _ in range(200):
        ids = (rng.zipf(1.2, 40) % 4000).astype(np.int64)
        batches.append({"t": (ids, np.arange(0, 41, 4, dtype=np.int64))})
    results = [None] * len(batches)
    with sdm.Store.open(path, config=config, cpu_slots=cpu_slots) as store:
        def work(k):
            for i in range(k, len(batches), 8):
                results[i] = store.embedding_bags(batches[i])["t"]

        threads = [_start(work, k) for k in range(8)]
        for t in threads:
            t.join(TIMEOUT)
            assert not t.is_alive(), "a lookup never finished: deadlock"
    for b, got in zip(batches, results):
        ids, off = b["t"]
        np.testing.assert_array_equal(got, sdm.embedding_bag(rows, ids, off))


def test_a_bounded_store_still_overlaps_paced_device_waits(nand_store):
    """One slot, four threads, each call paced reads of a slow device with units to spare:
    the waits come after the slot is returned, so they overlap (in turn they would take 4x
    as long as one call)."""
    import dataclasses
    from sdm.store.config import HierarchyConfig, TierConfig
    path, _ = nand_store
    slow = dataclasses.replace(sdm.DEVICES["nand-p4500"], name="slow", read_latency_us=20_000.0,
                               max_read_iops=64 / 0.02)  # 64 units of 20 ms
    config = HierarchyConfig("slow", (TierConfig("cache", capacity_rows=64),
                                      TierConfig("mmap", slow, queue_depth=64)), io_mode="paced")
    with sdm.Store.open(path, config=config, cpu_slots=1) as store:
        def call(seed):
            ids = np.random.default_rng(seed).choice(4000, 16, replace=False).astype(np.int64)
            store.embedding_bags({"t": (ids, np.array([0, 16]))})

        call(0)  # compile and warm
        t0 = time.perf_counter()
        call(1)
        alone = time.perf_counter() - t0
        t0 = time.perf_counter()
        threads = [_start(call, 2 + k) for k in range(4)]
        for t in threads:
            t.join(TIMEOUT)
        together = time.perf_counter() - t0
    assert alone >= 0.02  # one round of reads on the slow device
    assert together < 2.5 * alone, (alone, together)

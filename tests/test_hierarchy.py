"""Stores through every hierarchy preset and IO mode return what the ``dram`` preset returns;
caches hit, miss and forward; stats report every tier's device counters."""

from __future__ import annotations

import numpy as np
import pytest

import sdm
from helpers import rows_of
from sdm.store.config import HIERARCHY_PRESETS, IO_MODES, HierarchyConfig, TierConfig, with_io_mode

SPECS = [sdm.TableSpec("f32", 800, 16, "fp32"), sdm.TableSpec("i8", 3000, 64, "int8"),
         sdm.TableSpec("f16", 500, 8, "fp16")]
TIGHT = {  # small caches, so lookups evict and fall through to every level
    "tight-nand": HierarchyConfig("tight-nand", (TierConfig("cache", capacity_rows=30),
                                                 TierConfig("mmap", "nand-p4500", queue_depth=4))),
    "tight-three": HierarchyConfig("tight-three", (
        TierConfig("cache", capacity_rows=20), TierConfig("cache", "optane-p4800x-512", capacity_bytes=256 * 40),
        TierConfig("lmdb", "nand-p3700", queue_depth=16))),
}
CONFIGS = sorted(HIERARCHY_PRESETS) + sorted(TIGHT)
STAT_KEYS = {"name", "kind", "device", "hits", "misses", "reads", "bytes_read", "useful_bytes",
             "read_amplification", "modeled_ns", "energy_j", "wall_ns", "io_mode", "queue_depth"}


def config_of(name, mode):
    return with_io_mode(TIGHT.get(name, name), mode)


@pytest.fixture(scope="module")
def store_path(make_store):
    return make_store(SPECS)


def workload(seed=0):
    """A fixed list of requests: pooled batches over all tables and single-table lookups."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(6):
        batch = {}
        for spec in SPECS:
            lengths = rng.integers(0, 8, 16)
            ids = (rng.zipf(1.2, int(lengths.sum())) - 1) % spec.num_rows
            batch[spec.name] = (ids, np.concatenate([[0], np.cumsum(lengths)]))
        out.append(("bags", batch))
        spec = SPECS[step % len(SPECS)]
        out.append(("lookup", (spec.name, rng.integers(0, spec.num_rows, 25))))
    return out


def run(store):
    results = []
    for kind, request in workload():
        if kind == "bags":
            got = store.embedding_bags(request)
            results.extend(got[name] for name in sorted(got))
        else:
            results.append(store.lookup(*request))
    return results


@pytest.fixture(scope="module")
def expected(store_path):
    with sdm.Store.open(store_path, config="dram") as store:
        return run(store)


@pytest.mark.parametrize("mode", IO_MODES)
@pytest.mark.parametrize("name", CONFIGS)
def test_every_preset_and_io_mode_returns_the_dram_results(store_path, expected, name, mode):
    with sdm.Store.open(store_path, config=config_of(name, mode)) as store:
        got = run(store)
        stats = store.stats()
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)
    tiers = stats["tiers"]
    assert [t["kind"] for t in tiers] == [t.kind for t in config_of(name, mode).tiers]
    for t in tiers:
        assert STAT_KEYS <= set(t), STAT_KEYS - set(t)
        # each tier's true mode: only the SCM row files read with O_DIRECT (issue 21)
        assert t["io_mode"] == ("modeled" if mode == "direct" and t["kind"] != "mmap" else mode)
        assert t["bytes_read"] == t["reads"] * sdm.DEVICES[t["device"]].access_bytes
        if t["useful_bytes"]:
            assert t["read_amplification"] == pytest.approx(t["bytes_read"] / t["useful_bytes"])
    last = tiers[-1]
    assert last["reads"] > 0 and last["modeled_ns"] > 0 and last["energy_j"] > 0
    if name in TIGHT:  # every level served something
        assert all(t["hits"] > 0 for t in tiers)
        assert all(t["misses"] > 0 for t in tiers[:-1])


def test_modeled_time_is_deterministic_and_mode_independent(store_path):
    seen = []
    for mode in ("modeled", "modeled", "paced", "direct"):
        with sdm.Store.open(store_path, config=config_of("tight-three", mode)) as store:
            run(store)
            seen.append([(t["reads"], t["modeled_ns"], t["hits"]) for t in store.stats()["tiers"]])
    assert seen[0] == seen[1] == seen[2] == seen[3]


def test_cache_hits_are_served_without_reading_below(store_path):
    with sdm.Store.open(store_path, config="sdm-3dxp") as store:
        ids = np.arange(0, 3000, 7)
        first = store.lookup("i8", ids)
        cache, scm = store.stats()["tiers"]
        assert (cache["hits"], cache["misses"]) == (0, len(ids))
        assert scm["hits"] == len(ids) and scm["device"] == "optane-p4800x-512"
        reads = scm["reads"]
        np.testing.assert_array_equal(store.lookup("i8", ids), first)
        cache, scm = store.stats()["tiers"]
        assert cache["hits"] == len(ids) and scm["reads"] == reads


def test_rewrite_through_a_cache_serves_the_new_rows(tmp_path):
    spec = sdm.TableSpec("t", 400, 8, "int8")
    with sdm.Store.create(tmp_path / "s", [spec], config="three-tier") as store:
        store.write_table("t", rows_of(spec))
        before = store.lookup("t", np.arange(50))
        store.write_table("t", rows_of(spec, seed=3))
        after = store.lookup("t", np.arange(50))
    want = sdm.dequantize_rows(sdm.quantize_rows(rows_of(spec, seed=3)[:50], "int8"), "int8", 8)
    np.testing.assert_array_equal(after, want)
    assert not np.array_equal(before, after)


def test_direct_mode_reads_the_row_file(store_path):
    with sdm.Store.open(store_path, config=config_of("sdm-nand", "direct")) as store:
        store.lookup("i8", np.arange(0, 3000, 11))
        scm = store.stats()["tiers"][1]
    assert scm["kind"] == "mmap" and scm["wall_ns"] > 0 and scm["reads"] > 0


def test_stats_of_the_dram_preset_charge_dram_lines(store_path):
    with sdm.Store.open(store_path, config="dram") as store:
        store.lookup("i8", [1, 2, 3])  # 72-byte rows: two 64 B lines each, counted aligned
        (dram,) = store.stats()["tiers"]
    assert (dram["device"], dram["hits"], dram["reads"], dram["useful_bytes"]) == ("dram", 3, 6, 216)
    assert dram["modeled_ns"] == 100  # six 100 ns line reads, all in flight at once (queue depth 10)


def test_paced_store_lookups_take_at_least_the_modeled_time(store_path):
    import time

    with sdm.Store.open(store_path, config=config_of("ssd", "paced")) as store:
        ids = np.arange(0, 3000, 150)  # 20 rows in 20 distinct LMDB blocks
        start = time.perf_counter_ns()
        store.lookup("i8", ids)
        wall = time.perf_counter_ns() - start
        (ssd,) = store.stats()["tiers"]
    assert ssd["reads"] == 20 and ssd["queue_depth"] == 16
    assert ssd["modeled_ns"] == 2 * 85_000  # two waves of 16 and 4 reads, 85 us each
    assert wall >= ssd["modeled_ns"]

"""The sharding planner (no Ray needed): balance, the greedy baseline, capacity, typed errors,
the sharding types, trace profiles and the versioned JSON plan."""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import pytest

import sdm
from sdm.cluster import CapacityError, CostModel, Plan, PlanError, WorkerSpec, plan
from sdm.cluster.planner import PLAN_VERSION, SHARDING_TYPES
from sdm.trace import Batch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
from bench_cluster import zipf_tables  # noqa: E402  (the bench's tables: Zipf rows and pooling)




def meta_tables(count: int):
    """meta-2021-shaped tables: the profile's 2M rows and pooling 2..36, repeated."""
    profile = sdm.trace.get_profile("meta-2021")
    specs, pooling = [], {}
    for i in range(count):
        k = i % len(profile.table_sizes)
        specs.append(sdm.TableSpec(f"m{i}", profile.table_sizes[k], 64, "fp16"))
        pooling[f"m{i}"] = profile.pooling[k]
    return specs, pooling


HOSTS = {"default": WorkerSpec(), "dram-resident": WorkerSpec(dram_bytes=1 << 40)}
MODELS = {"measured": CostModel(), "no-call": CostModel(ray_call_us=0.0)}


def check_invariants(p: Plan):
    """Distinct workers per table, capacity kept, table-row-wise on one host."""
    for t in p.tables:
        workers = [s.worker for s in t.shards]
        assert len(set(workers)) == len(workers)
        if t.sharding == "table-row-wise":
            assert len({w // p.workers_per_host for w in workers}) == 1
    assert (p.worker_bytes <= p.worker.capacity_bytes).all()


@pytest.mark.parametrize("host", sorted(HOSTS))
@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("count,workers,seed", [(32, 2, 0), (32, 16, 1), (64, 4, 2), (64, 8, 3),
                                                (128, 16, 4), (128, 2, 5), (32, 12, 1), (48, 12, 6)])
def test_zipf_tables_balance_and_beat_greedy(count, workers, seed, host, model):
    specs, pooling = zipf_tables(count, seed)
    kw = dict(pooling=pooling, worker=HOSTS[host], cost_model=MODELS[model])
    best = plan(specs, workers, **kw)
    greedy = plan(specs, workers, search="greedy", **kw)
    assert best.score_ns <= greedy.score_ns * (1 + 1e-12)
    assert best.greedy_score_ns == pytest.approx(greedy.score_ns, rel=1e-12)
    check_invariants(best)
    check_invariants(greedy)
    if (host, model) != ("dram-resident", "no-call"):
        assert best.balance <= 1.10
        return
    # Rows all in DRAM and Ray calls free: splitting an int8 table costs more than it saves
    # (its raw rows outweigh its pooled sums), so the lowest max need not be within 10% of
    # the mean; then no whole table on the most loaded worker is worth splitting.
    if best.balance > 1.10:
        top = int(np.argmax(best.worker_cost_ns))
        for t in best.tables:
            if t.sharding == "table-wise" and t.shards[0].worker == top:
                for kind in ("row-wise", "column-wise")[:1 if t.spec.fmt == "int8" else 2]:
                    forced = plan(specs, workers, sharding={t.spec.name: kind}, **kw)
                    assert forced.score_ns >= best.score_ns * (1 - 1e-12)


@pytest.mark.parametrize("count,workers", [(32, 2), (64, 8), (128, 16)])
def test_meta_shaped_tables_balance(count, workers):
    specs, pooling = meta_tables(count)
    best = plan(specs, workers, pooling=pooling, batch_size=16384, cost_model=MODELS["no-call"])
    assert best.balance <= 1.10
    assert best.score_ns <= plan(specs, workers, pooling=pooling, batch_size=16384, search="greedy",
                                 cost_model=MODELS["no-call"]).score_ns * (1 + 1e-12)


def test_capacity_never_exceeded_when_tight():
    specs, pooling = zipf_tables(64, 7)
    total = sum(s.num_rows * s.row_bytes for s in specs)
    for slack in (1.02, 1.1, 1.5):
        worker = WorkerSpec(disk_bytes=int(total / 8 * slack))
        p = plan(specs, 8, pooling=pooling, worker=worker)
        check_invariants(p)
        assert p.worker_bytes.sum() == total


def test_planning_128_tables_under_a_second():
    specs, pooling = zipf_tables(128, 8)
    plan(specs, 16, pooling=pooling)  # warm
    start = time.process_time()  # CPU time: the 2-core CI machine is shared
    plan(specs, 16, pooling=pooling)
    assert time.process_time() - start < 1.0


def test_tables_that_cannot_fit_name_the_shortfall():
    specs = [sdm.TableSpec("a", 1000, 4), sdm.TableSpec("b", 1000, 4)]  # 16,000 + 16,000 bytes
    with pytest.raises(CapacityError) as err:
        plan(specs, 2, worker=WorkerSpec(disk_bytes=15_000))
    assert err.value.shortfall_bytes == 2_000 and err.value.table is None
    assert "short by 2,000 bytes" in str(err.value)
    assert isinstance(err.value, ValueError) and isinstance(err.value, sdm.errors.ConfigError)
    # a one-row int8 table of 208 bytes fits no worker whole and cannot be split
    with pytest.raises(CapacityError) as err:
        plan([sdm.TableSpec("big", 1, 200, "int8"), sdm.TableSpec("small", 2, 4)], 2,
             worker=WorkerSpec(scm_bytes=150, disk_bytes=1000))
    assert err.value.shortfall_bytes == 58 and err.value.table == "big"
    # a forced table-wise table larger than a worker
    with pytest.raises(CapacityError, match="'a'"):
        plan(specs, 4, worker=WorkerSpec(disk_bytes=10_000), sharding={"a": "table-wise"})


def test_a_table_larger_than_a_worker_is_split():
    specs = [sdm.TableSpec("big", 10_000, 8), sdm.TableSpec("small", 100, 8)]
    p = plan(specs, 4, worker=WorkerSpec(disk_bytes=100_000))
    assert p.table("big").sharding in ("row-wise", "column-wise")
    check_invariants(p)


def test_sharding_types_cut_as_named():
    specs = [sdm.TableSpec("tw", 50, 8), sdm.TableSpec("rw", 103, 8, "int8"),
             sdm.TableSpec("twrw", 40, 8, "fp16"), sdm.TableSpec("cw", 30, 10)]
    forced = {"tw": "table-wise", "rw": "row-wise", "twrw": "table-row-wise", "cw": "column-wise"}
    p = plan(specs, 4, workers_per_host=2, sharding=forced)
    assert [t.sharding for t in p.tables] == ["table-wise", "row-wise", "table-row-wise", "column-wise"]
    assert [s.rows for s in p.table("rw").shards] == [(0, 26), (26, 52), (52, 78), (78, 103)]
    assert [s.rows for s in p.table("twrw").shards] == [(0, 20), (20, 40)]
    assert len({s.worker // 2 for s in p.table("twrw").shards}) == 1
    assert [s.columns for s in p.table("cw").shards] == [(0, 2), (2, 5), (5, 8), (8, 10)]
    assert all(s.rows == (0, 30) for s in p.table("cw").shards)
    check_invariants(p)
    with pytest.raises(PlanError, match="int8"):
        plan(specs, 4, sharding={"rw": "column-wise"})
    # nothing int8 is ever cut by columns when the planner chooses
    specs, pooling = zipf_tables(64, 9)
    for host in HOSTS.values():
        p = plan(specs, 8, pooling=pooling, worker=host)
        assert all(t.sharding != "column-wise" for t in p.tables if t.spec.fmt == "int8")


def test_costs_follow_the_cost_model():
    model = CostModel(ray_call_us=100.0)
    spec = sdm.TableSpec("a", 1000, 16)  # 64-byte rows, 64,000 bytes
    p = plan([spec], 1, pooling={"a": 4.0}, batch_size=10, worker=WorkerSpec(dram_bytes=16_000), cost_model=model)
    shard = p.tables[0].shards[0]
    want = model.shard_cost_ns(rows_read=40.0, row_bytes=64, hit_rate=0.25, out_bytes=10 * 16 * 4)
    assert shard.cost_ns == pytest.approx(want)
    assert p.score_ns == pytest.approx(want + 100e3)
    nand = sdm.DEVICES["nand-p4500"]
    assert want == pytest.approx(40 * 0.25 * 64 / 51.0 + 40 * 0.75 * 1e9 / nand.iops(16) + 640 / 12.5)


class MemTrace:
    """An in-memory trace: ``batches[i][t]`` the ids of table ``t``, one id per bag."""

    def __init__(self, table_sizes, batches):
        self.table_sizes = np.asarray(table_sizes, dtype=np.int64)
        self._batches = batches

    def __iter__(self):
        for b in self._batches:
            ids = [np.asarray(x, dtype=np.int64) for x in b]
            yield Batch(ids, [np.arange(len(x) + 1, dtype=np.int64) for x in ids])


def test_trace_profile_locates_reads():
    # table 0: every read in rows [0, 10) of 100; table 1 uniform
    batches = [[[i % 10 for i in range(40)], list(range(b * 40 % 100, b * 40 % 100 + 40))] for b in range(5)]
    trace = MemTrace([100, 140], batches)
    specs = [sdm.TableSpec("hot", 100, 8), sdm.TableSpec("flat", 140, 8)]
    p = plan(specs, 4, trace=trace, sharding={"hot": "row-wise", "flat": "row-wise"}, cost_model=MODELS["no-call"])
    hot = [s.cost_ns for s in p.table("hot").shards]
    assert hot[0] > 0 and hot[1:] == [0.0, 0.0, 0.0]  # rows 0..24 hold every read
    assert p.batch_size == 40
    with pytest.raises(PlanError, match="table sizes"):
        plan([sdm.TableSpec("hot", 99, 8), specs[1]], 2, trace=trace)


def test_plan_from_a_store_path(tmp_path):
    specs = [sdm.TableSpec("a", 100, 4), sdm.TableSpec("b", 50, 8, "int8")]
    sdm.Store.create(tmp_path / "s", specs).close()
    p = plan(tmp_path / "s", 2)
    assert [t.spec for t in p.tables] == specs


def test_json_round_trip_and_version(tmp_path):
    specs, pooling = zipf_tables(32, 10)
    p = plan(specs, 4, pooling=pooling, workers_per_host=2, sharding={"t0": "table-row-wise"})
    data = json.loads(json.dumps(p.to_json()))
    assert data["format"] == "sdm-shard-plan" and data["version"] == PLAN_VERSION
    assert {t["sharding"] for t in data["tables"]} <= set(SHARDING_TYPES)
    assert [w["cost_ns"] for w in data["workers"]] == p.worker_cost_ns.tolist()
    assert [w["bytes"] for w in data["workers"]] == p.worker_bytes.tolist()
    assert Plan.from_json(data) == p
    assert Plan.load(p.save(tmp_path / "plan.json")) == p


def _mutated(p: Plan, change):
    data = json.loads(json.dumps(p.to_json()))
    change(data)
    return data


@pytest.mark.parametrize("change,match", [
    (lambda d: d.update(version=99), "version 99"),
    (lambda d: d.update(format="other"), "not an sdm shard plan"),
    (lambda d: d.pop("tables"), "'tables'"),
    (lambda d: d["tables"][0]["shards"][0].update(worker=7), "worker 7"),
    (lambda d: d["tables"][1]["shards"][0].update(rows=[1, 13]), "continue from 0"),
    (lambda d: d["tables"][1]["shards"].pop(), "cover rows"),
    (lambda d: d["tables"][0].update(sharding="diagonal"), "diagonal"),
    (lambda d: d["worker"].update(dram_bytes=-1), "dram_bytes"),
    (lambda d: d.update(num_workers=0), "num_workers"),
    (lambda d: d["tables"][0].update(fmt="int4"), "int4"),
])
def test_damaged_plans_are_refused(change, match):
    p = plan([sdm.TableSpec("a", 10, 4), sdm.TableSpec("b", 50, 4)], 4, sharding={"b": "row-wise"})
    with pytest.raises(PlanError, match=match):
        Plan.from_json(_mutated(p, change))


def test_unreadable_plan_files(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    for path in (tmp_path / "bad.json", tmp_path / "missing.json", tmp_path):
        with pytest.raises(PlanError):
            Plan.load(path)


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_workers=0), "num_workers"),
    (dict(num_workers=True), "num_workers"),
    (dict(tables=[]), "non-empty"),
    (dict(tables=["a"]), "TableSpec"),
    (dict(tables={"a": 1}), "list of sdm.TableSpec"),
    (dict(tables=[sdm.TableSpec("a", 4, 4)] * 2), "distinct"),
    (dict(pooling={"zz": 1.0}), "'zz'"),
    (dict(pooling={"a": -1.0}), "> 0"),
    (dict(pooling={"a": float("nan")}), "> 0"),
    (dict(sharding={"a": "diagonal"}), "diagonal"),
    (dict(sharding={"zz": "row-wise"}), "'zz'"),
    (dict(sharding={"a": "table-row-wise"}), "workers per host"),
    (dict(search="anneal"), "anneal"),
    (dict(workers_per_host=3), "divide"),
    (dict(batch_size=0), "batch_size"),
    (dict(worker="big"), "WorkerSpec"),
])
def test_bad_input_gets_typed_errors(kwargs, match):
    args = dict(tables=[sdm.TableSpec("a", 100, 4)], num_workers=4, workers_per_host=1)
    args.update(kwargs)
    with pytest.raises(PlanError, match=match):
        plan(args.pop("tables"), **args)


@pytest.mark.parametrize("make,match", [
    (lambda: WorkerSpec(dram_bytes=-1), "dram_bytes"),
    (lambda: WorkerSpec(disk_bytes=1.5), "disk_bytes"),
    (lambda: CostModel(network_gbps=0), "network_gbps"),
    (lambda: CostModel(ray_call_us=float("inf")), "ray_call_us"),
    (lambda: CostModel(miss_device="floppy"), "floppy"),
    (lambda: CostModel(queue_depth=0), "queue_depth"),
])
def test_bad_specs_get_typed_errors(make, match):
    with pytest.raises(PlanError, match=match):
        make()

"""Shard stores cut from a store (no Ray needed): bitwise rows for every sharding type and
row format, the int8 preimage, ``Store.lookup_raw``, ``sdm shard plan | build`` and their
typed errors."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sdm
from sdm.cli import main
from sdm.cluster import Plan, PlanError, build, plan
from sdm.cluster.build import PLAN_FILE, int8_preimage, worker_dir
from sdm.cluster.planner import shard_table_name

TYPES = {"fp32": ("table-wise", "row-wise", "table-row-wise", "column-wise"),
         "fp16": ("table-wise", "row-wise", "table-row-wise", "column-wise"),
         "int8": ("table-wise", "row-wise", "table-row-wise")}


def make_store(path, seed=0):
    """A store with one table per (format, sharding type), odd sizes so ranges are uneven."""
    rng = np.random.default_rng(seed)
    specs, sharding, rows = [], {}, {}
    for f, kinds in TYPES.items():
        for i, kind in enumerate(kinds):
            spec = sdm.TableSpec(f"{f}-{kind}", 37 + 11 * i, 5 + 3 * i, f)
            specs.append(spec)
            sharding[spec.name] = kind
            scale = rng.uniform(1e-6, 1e3, (spec.num_rows, 1))
            rows[spec.name] = (rng.standard_normal((spec.num_rows, spec.dim)) * scale).astype(np.float32)
    with sdm.Store.create(path, specs) as store:
        for name, x in rows.items():
            store.write_table(name, x)
    return specs, sharding


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster-build")
    specs, sharding = make_store(root / "store")
    return root, specs, sharding


def test_lookup_raw_is_what_lookup_decodes(source):
    root, specs, _ = source
    for config in ("dram", "ssd"):  # a resident table, and rows read from a tier
        with sdm.Store.open(root / "store", config=config) as store:
            for spec in specs:
                ids = np.array([0, spec.num_rows - 1, 3, 3, 0])
                raw = store.lookup_raw(spec.name, ids)
                assert raw.dtype == np.uint8 and raw.shape == (5, spec.row_bytes)
                decoded = sdm.dequantize_rows(raw, spec.fmt, spec.dim)
                assert (decoded.view(np.uint32) == store.lookup(spec.name, ids).view(np.uint32)).all()
                assert store.lookup_raw(spec.name, []).shape == (0, spec.row_bytes)
            with pytest.raises(sdm.errors.IdOutOfRangeError):
                store.lookup_raw(specs[0].name, [specs[0].num_rows])
            with pytest.raises(sdm.errors.UnknownTableError):
                store.lookup_raw("nope", [0])


def test_build_cuts_every_type_and_format_bitwise(source):
    root, specs, sharding = source
    p = plan(root / "store", 4, workers_per_host=2, sharding=sharding)
    out = build(root / "store", p, root / "shards")
    assert sorted(os.listdir(out)) == [PLAN_FILE] + [f"w{w}" for w in sorted({s.worker for s in p.shards})]
    assert Plan.load(os.path.join(out, PLAN_FILE)) == p
    with sdm.Store.open(root / "store") as src:
        for i, s in enumerate(p.shards):
            spec = src.tables[s.table]
            with sdm.Store.open(worker_dir(out, s.worker), config="ssd", readonly=True) as shard:
                got = shard.lookup_raw(shard_table_name(i), np.arange(s.rows[1] - s.rows[0]))
            want = src.lookup_raw(s.table, np.arange(*s.rows))
            if spec.fmt != "int8":
                item = 4 if spec.fmt == "fp32" else 2
                want = want[:, s.columns[0] * item:s.columns[1] * item]
            assert np.array_equal(got, want), (s.table, s.rows, s.columns)


def test_build_refuses_what_it_cannot_do(source, tmp_path):
    root, specs, sharding = source
    p = plan(root / "store", 2)
    os.mkdir(tmp_path / "taken")
    with pytest.raises(sdm.errors.StoreExistsError):
        build(root / "store", p, tmp_path / "taken")
    with pytest.raises(sdm.errors.StoreNotFoundError):
        build(root / "store", p, tmp_path / "no" / "such")
    other = plan([sdm.TableSpec("x", 10, 4)], 2)
    with pytest.raises(PlanError, match="not the store's"):
        build(root / "store", other, tmp_path / "out")
    assert sorted(os.listdir(tmp_path)) == ["taken"]  # nothing left behind


@st.composite
def int8_rows(draw):
    n = draw(st.integers(1, 20))
    dim = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.uniform(-38, 37, (n, 1))
    shift = 10.0 ** rng.uniform(-38, 37, (n, 1)) * rng.choice([-1, 0, 1], (n, 1))
    x = rng.standard_normal((n, dim)) * scale + shift
    x[rng.random(n) < 0.1] = shift[0]  # some constant rows
    with np.errstate(over="ignore"):
        x = x.astype(np.float32)
    x[~np.isfinite(x)] = 0
    x = x[np.isfinite(x.max(axis=1) - x.min(axis=1))]
    return x, dim


@given(int8_rows())
def test_int8_preimage_encodes_to_the_same_bytes(case):
    x, dim = case
    raw = sdm.quantize_rows(x, "int8")
    y = int8_preimage(raw, dim)
    assert np.array_equal(sdm.quantize_rows(y, "int8"), raw)


def test_int8_preimage_where_decoding_does_not_round_trip():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((20_000, 16)) * 1e-6).astype(np.float32)  # most rows drift by an ulp
    raw = sdm.quantize_rows(x, "int8")
    assert (sdm.quantize_rows(sdm.dequantize_rows(raw, "int8", 16), "int8") != raw).any()
    assert np.array_equal(sdm.quantize_rows(int8_preimage(raw, 16), "int8"), raw)


def test_cli_plan_and_build(source, tmp_path, capsys):
    root, specs, sharding = source
    out = tmp_path / "plan.json"
    args = ["shard", "plan", str(root / "store"), "--workers", "3", "--dram-bytes", "1K", "--disk-bytes", "1G",
            "--sharding", "fp32-row-wise=row-wise", "-o", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "score" in text and re.search(r"^fp32-row-wise +row-wise ", text, re.M)
    p = Plan.load(out)
    assert p.num_workers == 3 and p.table("fp32-row-wise").sharding == "row-wise"
    assert p.worker.dram_bytes == 1024 and p.worker.disk_bytes == 1 << 30
    assert main(args[:-1] + [str(tmp_path / "p2.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "sdm-shard-plan"
    assert main(["shard", "build", str(root / "store"), str(out), "-o", str(tmp_path / "shards"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [w["worker"] for w in report["workers"]] == sorted({s.worker for s in p.shards})
    assert all(os.path.isdir(w["path"]) for w in report["workers"])


def test_cli_plan_from_a_trace(tmp_path, capsys):
    trace = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "traces", "default.npz")
    assert main(["shard", "plan", trace, "--workers", "4", "--dim", "16", "--fmt", "fp16",
                 "-o", str(tmp_path / "p.json"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    sizes = sdm.trace.load(trace).table_sizes
    assert [t["num_rows"] for t in data["tables"]] == sizes.tolist()
    assert {t["fmt"] for t in data["tables"]} == {"fp16"}
    assert data["batch_size"] == sdm.trace.load(trace)[0].batch_size


@pytest.mark.parametrize("argv,words", [
    (["shard"], ["subcommand is needed"]),
    (["shard", "plan", "{store}", "--workers", "0", "-o", "{out}/p.json"], ["num_workers", "0"]),
    (["shard", "plan", "{store}", "--workers", "2", "--dram-bytes", "lots", "-o", "{out}/p.json"],
     ["--dram-bytes", "'lots'"]),
    (["shard", "plan", "{store}", "--workers", "2", "--sharding", "nope", "-o", "{out}/p.json"], ["TABLE=TYPE"]),
    (["shard", "plan", "{store}", "--workers", "2", "--sharding", "fp32-row-wise=diagonal", "-o", "{out}/p.json"],
     ["diagonal"]),
    (["shard", "plan", "{store}", "--workers", "2", "--sharding", "int8-row-wise=column-wise", "-o", "{out}/p.json"],
     ["int8"]),
    (["shard", "plan", "{store}", "--workers", "2", "--disk-bytes", "1K", "-o", "{out}/p.json"], ["short by"]),
    (["shard", "plan", "{out}/missing.npz", "--workers", "2", "-o", "{out}/p.json"], ["missing.npz"]),
    (["shard", "plan", "{store}", "--workers", "2", "-o", "{out}/no/dir/p.json"], ["output directory"]),
    (["shard", "build", "{store}", "{out}/missing.json", "-o", "{out}/s"], ["missing.json"]),
    (["shard", "build", "{store}", "{garbage}", "-o", "{out}/s"], ["cannot read a plan"]),
    (["shard", "build", "{out}/nostore", "{plan}", "-o", "{out}/s"], ["nostore"]),
    (["shard", "build", "{store}", "{plan}", "-o", "{out}"], ["already exists"]),
])
def test_cli_bad_input_names_the_value(source, tmp_path, capsys, argv, words):
    root, specs, _ = source
    plan(root / "store", 2).save(tmp_path / "good.json")
    (tmp_path / "garbage.json").write_text("{")
    fill = {"store": str(root / "store"), "out": str(tmp_path), "plan": str(tmp_path / "good.json"),
            "garbage": str(tmp_path / "garbage.json")}
    argv = [a.format(**fill) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse usage errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    for word in words:
        assert word in err, err
    if len(argv) > 1:
        assert f"sdm shard {argv[1]}: error:" in err or "usage:" in err
    assert sorted(os.listdir(tmp_path)) == ["garbage.json", "good.json"]

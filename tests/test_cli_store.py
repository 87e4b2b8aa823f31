"""`sdm store create | info | verify`: a store from arrays, a DLRM preset or a trace, without
Python; what it holds; every block's checksum walked, damage named."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import sdm
from sdm.cli import main
from sdm.replay.live import replay
from sdm.store.build import build_store, seeded_rows, verify_store

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "traces" / "tiny-zipf.npz")


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_create_from_npy_and_npz_serves_the_arrays(tmp_path, capsys):
    rng = np.random.default_rng(0)
    user = rng.standard_normal((300, 8)).astype(np.float32)
    item, ad = rng.standard_normal((50, 4)), rng.standard_normal((7, 4)).astype(np.float32)
    np.save(tmp_path / "user.npy", user)
    np.savez(tmp_path / "more.npz", item=item, ad=ad)
    code, out, err = run(capsys, "store", "create", tmp_path / "s", "--arrays", tmp_path / "user.npy",
                         tmp_path / "more.npz")
    assert code == 0 and err == "" and "3 tables, 357 rows" in out
    with sdm.Store.open(tmp_path / "s") as store:
        assert list(store.tables) == ["user", "item", "ad"]
        np.testing.assert_array_equal(store.lookup("user", np.arange(300)), user)
        np.testing.assert_array_equal(store.lookup("item", [0, 49]), item[[0, 49]].astype(np.float32))
        np.testing.assert_array_equal(store.lookup("ad", [6]), ad[[6]])


def test_create_from_a_trace_is_the_store_replay_builds(tmp_path, capsys):
    code, out, _ = run(capsys, "store", "create", tmp_path / "s", "--trace", TINY, "--dim", "8", "--json")
    info = json.loads(out)
    assert code == 0 and [t["num_rows"] for t in info["tables"]] == [1000, 1000]
    assert all(t["dim"] == 8 and t["written"] for t in info["tables"])
    built = replay(TINY, "sdm-nand", dim=8, checksum=True, workdir=str(tmp_path))
    given = replay(TINY, "sdm-nand", store=str(tmp_path / "s"), checksum=True)
    assert given.extra["checksum"] == built.extra["checksum"]  # bit for bit the same rows


def test_create_from_a_preset_has_its_tables_and_seeded_rows(tmp_path, capsys, monkeypatch):
    from sdm.model import presets

    tiny = presets.ModelPreset("tiny", 4, (13, 8, 4), (8, 1), (30, 5, 12), 2)
    monkeypatch.setitem(presets.PRESETS, "tiny", tiny)
    code, out, _ = run(capsys, "store", "create", tmp_path / "p", "--preset", "tiny", "--fmt", "fp16",
                       "--seed", "3")
    assert code == 0 and "3 tables, 47 rows of dim 4 fp16" in out
    with sdm.Store.open(tmp_path / "p") as store:
        assert [s.num_rows for s in store.tables.values()] == [30, 5, 12]
        want = next(seeded_rows(5, 4, 3, 1)).astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(store.lookup("emb_1", np.arange(5)), want)


def test_info_lists_tables_and_totals(tmp_path, capsys):
    build_store(tmp_path / "s", [1000, 10], dim=16, fmt="int8")
    code, out, _ = run(capsys, "store", "info", tmp_path / "s")
    assert code == 0
    assert "emb_0" in out and "1,000" in out and "int8" in out and "2 tables, 1,010 rows" in out
    code, out, _ = run(capsys, "store", "info", tmp_path / "s", "--json")
    info = json.loads(out)
    assert info["row_bytes_total"] == 1010 * 24 and info["version"] == 0
    assert info["disk_bytes"] >= info["row_bytes_total"]


def test_verify_walks_every_block_and_names_damage(tmp_path, capsys):
    path = build_store(tmp_path / "s", [5000, 300], dim=16)
    code, out, _ = run(capsys, "store", "verify", path)
    report = verify_store(path)
    assert code == 0 and report["damage"] is None
    assert report["blocks"] == sum(-(-n // (4076 // 64)) for n in (5000, 300)) and "ok" in out
    # flip one byte of a row inside the LMDB data file: its block's CRC must catch it
    data = Path(path) / "rows.lmdb" / "data.mdb"
    raw = bytearray(data.read_bytes())
    needle = np.float32(next(seeded_rows(300, 16, 0, 1))[7, 3]).tobytes()
    at = raw.find(needle)
    assert at > 0
    raw[at] ^= 0x40
    data.write_bytes(bytes(raw))
    code, out, err = run(capsys, "store", "verify", path)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "damaged" in err and "'emb_1'" in err and "checksum" in err


@pytest.mark.parametrize("argv, words", [
    (["create", "{d}/x", "--arrays", "{d}/none.npy"], ["none.npy", "does not exist"]),
    (["create", "{d}/x", "--arrays", "{d}/notes.txt"], ["notes.txt", ".npy or .npz"]),
    (["create", "{d}/x", "--arrays", "{d}/bad.npy"], ["bad", "2-D float", "(5,)"]),
    (["create", "{d}/x", "--arrays", "{d}/nan.npy"], ["finite", "NaN"]),
    (["create", "{d}/x", "--arrays", "{d}/obj.npy"], ["obj.npy", "without pickles"]),
    (["create", "{d}/x", "--arrays", "{d}/ok.npy", "--dim", "4"], ["--dim", "--trace"]),
    (["create", "{d}/x", "--preset", "rm9"], ["'rm9'", "rm2"]),
    (["create", "{d}/x", "--preset", "rm2", "--dim", "8"], ["--dim", "--preset"]),
    (["create", "{d}/x", "--trace", "{d}/none.npz"], ["none.npz"]),
    (["create", "{d}/x", "--trace", TINY, "--fmt", "int4"], ["row format", "'int4'"]),
    (["create", "{d}/x", "--trace", TINY, "--dim", "0"], ["dim", "0"]),
    (["create", "{d}/exists", "--trace", TINY], ["exists", "already exists"]),
    (["create", "{d}/no/such/x", "--trace", TINY], ["not a directory"]),
    (["info", "{d}/none"], ["no sdm store", "none"]),
    (["verify", "{d}"], ["no sdm store"]),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, argv, words):
    np.save(tmp_path / "bad.npy", np.zeros(5, np.float32))
    np.save(tmp_path / "ok.npy", np.zeros((5, 4), np.float32))
    np.save(tmp_path / "nan.npy", np.array([[1.0, np.nan]], np.float32))
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "exists").mkdir()
    before = sorted(os.listdir(tmp_path))
    code, out, err = run(capsys, "store", *[a.format(d=tmp_path) for a in argv])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"sdm store {argv[0]}: error:"), err
    assert "Traceback" not in err and all(w in err for w in words), err
    assert sorted(os.listdir(tmp_path)) == before  # nothing written, not even a hidden temp dir

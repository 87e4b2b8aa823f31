"""A damaged store is detected and reported as a typed error naming the file and table; it
never crashes the interpreter and never returns wrong rows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import sdm
from helpers import ramp_rows
from sdm import errors

SPECS = [sdm.TableSpec("a", 3000, 16, "fp32"), sdm.TableSpec("b", 2000, 32, "int8")]


@pytest.fixture(scope="module")
def pristine(make_store):
    return make_store(SPECS, lambda spec: ramp_rows(spec, 977))


@pytest.fixture
def copy(pristine, tmp_path):
    path = tmp_path / "copy"
    shutil.copytree(pristine, path)
    return path


def data_file(path):
    return os.path.join(path, "rows.lmdb", "data.mdb")


def test_missing_manifest_or_database(copy):
    os.remove(data_file(copy))
    with pytest.raises(errors.CorruptStoreError, match="data.mdb"):
        sdm.Store.open(copy)
    os.remove(os.path.join(copy, "manifest.json"))
    with pytest.raises(errors.StoreNotFoundError):
        sdm.Store.open(copy)


@pytest.mark.parametrize("damage", ["garbage", "edited", "version", "truncated"])
def test_bad_manifest(copy, damage):
    path = os.path.join(copy, "manifest.json")
    text = open(path).read()
    if damage == "garbage":
        text = "\x00{not json"
    elif damage == "edited":  # valid JSON, but not what was written: the checksum fails
        text = text.replace('"num_rows": 3000', '"num_rows": 3001')
    elif damage == "version":
        data = json.loads(text)
        data["schema_version"] = 99
        text = json.dumps(data)
    else:
        text = text[: len(text) // 2]
    with open(path, "w") as f:
        f.write(text)
    with pytest.raises(errors.CorruptStoreError) as info:
        sdm.Store.open(copy)
    assert "manifest.json" in str(info.value) and info.value.path == path


def test_truncated_database(copy):
    size = os.path.getsize(data_file(copy))
    os.truncate(data_file(copy), size // 2)
    with pytest.raises(errors.CorruptStoreError, match="truncated"):
        sdm.Store.open(copy)
    os.truncate(data_file(copy), 100)
    with pytest.raises(errors.CorruptStoreError, match="data.mdb"):
        sdm.Store.open(copy)


def test_overwritten_database_header(copy):
    with open(data_file(copy), "r+b") as f:
        f.write(b"\xff" * 8192)  # both LMDB meta pages
    with pytest.raises(errors.CorruptStoreError, match="data.mdb"):
        sdm.Store.open(copy)


@pytest.mark.parametrize("preset", ["dram", "ssd"])
def test_flipped_row_bytes_fail_their_checksum(copy, preset):
    raw = open(data_file(copy), "rb").read()
    # find the block holding rows 0.. of table "a": row 1 is 16..31 as float32
    needle = np.arange(16, 32, dtype=np.float32).tobytes()
    at = raw.find(needle)
    assert at > 0
    with open(data_file(copy), "r+b") as f:
        f.seek(at + 5)
        f.write(b"\x42")
    with sdm.Store.open(copy, config=preset) as store:
        with pytest.raises(errors.CorruptStoreError) as info:
            store.lookup("a", [1])
        assert info.value.table == "a" and info.value.path == data_file(copy)
        assert "checksum" in str(info.value)
        # rows of an undamaged table are still served
        np.testing.assert_array_equal(store.lookup("b", [0])[0] * 0, np.zeros(32))


FUZZ = textwrap.dedent("""
    import os, shutil, sys
    import numpy as np
    import sdm
    from sdm import errors
    pristine, work, seed, trials = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = np.random.default_rng(seed)
    expected = {}
    with sdm.Store.open(pristine, config="dram") as s:
        for name, spec in s.tables.items():
            expected[name] = s.lookup(name, np.arange(spec.num_rows))
    for trial in range(trials):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(pristine, work)
        target = os.path.join(work, "rows.lmdb", "data.mdb") if rng.random() < 0.85 else os.path.join(work, "manifest.json")
        size = os.path.getsize(target)
        with open(target, "r+b") as f:
            for _ in range(int(rng.integers(1, 40))):
                f.seek(int(rng.integers(0, size)))
                f.write(bytes(rng.integers(0, 256, int(rng.integers(1, 16)), dtype=np.uint8)))
        outcome = []
        for preset in ("ssd", "dram"):
            try:
                with sdm.Store.open(work, config=preset) as s:
                    for name, spec in s.tables.items():
                        for ids in (np.arange(spec.num_rows), rng.integers(0, spec.num_rows, 50)):
                            try:
                                got = s.lookup(name, ids)
                            except errors.CorruptStoreError as exc:
                                outcome.append("detected")
                                continue
                            if not np.array_equal(got, expected[name][ids]):
                                print(f"WRONG ROWS trial {trial} {preset} {name}", flush=True)
                                sys.exit(3)
                            outcome.append("ok")
            except errors.SdmError as exc:
                outcome.append(type(exc).__name__)
        print(trial, sorted(set(outcome)), flush=True)
    print("done")
""")


@pytest.mark.parametrize("seed", [1, 2])
def test_random_byte_damage_never_crashes_or_lies(pristine, tmp_path, seed):
    proc = subprocess.run([sys.executable, "-c", FUZZ, str(pristine), str(tmp_path / "w"), str(seed), "25"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip().endswith("done")

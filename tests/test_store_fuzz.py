"""Damage fuzzer over every file of a store: random byte damage never crashes the process
and never returns a wrong row.

Each trial copies a pristine store (three tables, fp32 / fp16 / int8, SCM row files built),
damages one of its files (flips, overwrites, zeroed runs, truncation), then opens it under a
preset and serves lookups and pooled bags of random ids, in a subprocess so a segfault or
SIGBUS is seen as a crash. Outcomes:

- ``ok``: every row and bag equals the reference;
- ``detected``: an sdm error (a :class:`CorruptStoreError` must name the damaged file, and
  the table when it was raised serving one);
- ``wrong`` / ``crash`` / ``hang`` / a non-sdm exception: failures.

Damage to an SCM row file (derived from LMDB) must give ``ok`` under ``sdm-nand``, with the
file and table in the mmap tier's ``damage`` stats, and ``ok`` elsewhere (unused).

Reproduce a run outside pytest: ``python tests/test_store_fuzz.py SEED PRESET TRIALS``
(prints every trial's spec and outcome as JSON lines).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import traceback

import numpy as np
import pytest

import sdm
from helpers import rows_from, write_store
from sdm import errors

SPECS = [sdm.TableSpec("f32", 1500, 16, "fp32"), sdm.TableSpec("f16", 1200, 24, "fp16"),
         sdm.TableSpec("i8", 2000, 32, "int8")]
PRESETS = ["sdm-nand", "ssd", "dram"]
DEFAULT_SEED = 20261201
SLOW_TRIALS = 300  # per preset and seed
SLOW_SEEDS = (DEFAULT_SEED + 1, DEFAULT_SEED + 2)


def pristine_rows(spec):
    return rows_from(spec, spec.dim)


def reference(spec):
    return sdm.dequantize_rows(sdm.quantize_rows(pristine_rows(spec), spec.fmt), spec.fmt, spec.dim)


def build_pristine(path) -> None:
    write_store(path, SPECS, pristine_rows)
    with sdm.Store.open(path, config="sdm-nand") as store:  # builds the SCM row files
        for spec in SPECS:
            store.lookup(spec.name, [0])


def store_files(path) -> list[str]:
    """Every file of the store, relative to it, sorted."""
    out = []
    for root, _, names in os.walk(path):
        out += [os.path.relpath(os.path.join(root, n), path) for n in names]
    return sorted(out)


def lmdb_structure_pages(data_file) -> list[int]:
    """Meta, branch and leaf pages of an LMDB data file (its B-tree, not its rows)."""
    raw = open(data_file, "rb").read()
    pages = []
    for p in range(len(raw) // 4096):
        flags = struct.unpack_from("<H", raw, p * 4096 + 10)[0]
        if flags & (0x01 | 0x02 | 0x08) and not flags & 0x04:
            pages.append(p)
    return pages


def make_trials(pristine, seed: int, preset: str, n: int, *, round_robin: bool) -> list[dict]:
    """``n`` trial specs for ``preset``, fully determined by ``seed`` and the pristine store."""
    rng = np.random.default_rng([seed, PRESETS.index(preset)])
    files = store_files(pristine)
    structure = lmdb_structure_pages(os.path.join(pristine, "rows.lmdb", "data.mdb"))
    trials = []
    for i in range(n):
        rel = files[i % len(files)] if round_robin else files[int(rng.integers(len(files)))]
        size = os.path.getsize(os.path.join(pristine, rel))
        ops = []
        kinds = ["flip", "overwrite", "zero", "truncate"] if size else ["overwrite"]
        kind = kinds[int(rng.integers(len(kinds)))]
        for _ in range(int(rng.integers(1, 4)) if kind != "truncate" else 1):
            if rel.endswith("data.mdb") and structure and rng.random() < 0.5:
                page = structure[int(rng.integers(len(structure)))]
                at = page * 4096 + int(rng.integers(4096))
            else:
                at = int(rng.integers(max(size, 1)))
            if kind == "flip":
                ops.append(["xor", at, bytes([int(rng.integers(1, 256))]).hex()])
            elif kind == "overwrite":
                ops.append(["write", at, rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8).tobytes().hex()])
            elif kind == "zero":
                ops.append(["write", at, bytes(int(rng.integers(1, 4097))).hex()])
            else:
                ops.append(["truncate", int(rng.integers(size))])
        trials.append({"seed": seed, "preset": preset, "trial": i, "file": rel, "kind": kind,
                       "ops": ops, "ids_seed": int(rng.integers(2**31))})
    return trials


# -- the child: applies damage, opens, serves, reports one JSON line per trial ------------

def apply_damage(path, ops) -> bool:
    """Apply ``ops`` to the file at ``path``; True if its bytes changed."""
    before = open(path, "rb").read()
    with open(path, "r+b") as f:
        for op in ops:
            if op[0] == "truncate":
                f.truncate(op[1])
                continue
            data = bytes.fromhex(op[2])
            if op[0] == "xor":
                f.seek(op[1])
                old = f.read(len(data))
                data = bytes(a ^ b for a, b in zip(old, data))
            f.seek(op[1])
            f.write(data)
    return open(path, "rb").read() != before


def serve(store, expected, bags_ref, rng):
    """Look up and pool random ids of every table; returns (outcome, detail)."""
    for spec in SPECS:
        ids = rng.integers(0, spec.num_rows, 300)
        ids[:5] = [0, spec.num_rows - 1, 0, 1, spec.num_rows // 2]
        table = spec.name
        try:
            got = store.lookup(table, ids)
            if not np.array_equal(got, expected[table][ids]):
                bad = int(np.flatnonzero((got != expected[table][ids]).any(axis=1))[0])
                return "wrong", f"table {table!r}: lookup of row {int(ids[bad])} differs from the reference"
            indices, offsets = bags_ref[table][0], bags_ref[table][1]
            pooled = store.embedding_bags({table: (indices, offsets)})[table]
            if not np.array_equal(pooled, bags_ref[table][2]):
                return "wrong", f"table {table!r}: pooled bags differ from the reference"
            # every row last: SCM pages are checked when first read, so all of them are now
            if not np.array_equal(store.lookup(table, np.arange(spec.num_rows)), expected[table]):
                return "wrong", f"table {table!r}: a full-table lookup differs from the reference"
        except errors.CorruptStoreError as exc:
            return "detected", {"error": type(exc).__name__, "path": exc.path, "table": exc.table,
                                "serving": table, "message": str(exc)[:300]}
        except errors.SdmError as exc:
            return "detected", {"error": type(exc).__name__, "path": None, "table": None,
                                "serving": table, "message": str(exc)[:300]}
    return "ok", None


def run_child(job_file) -> None:
    job = json.load(open(job_file))
    pristine, work = job["pristine"], job["work"]
    expected = {spec.name: reference(spec) for spec in SPECS}
    bag_refs = {}
    for trial in job["trials"]:
        preset = trial["preset"]
        if preset not in bag_refs:  # pooled reference: the pristine store, same preset
            rng = np.random.default_rng(7)
            bag_refs[preset] = {}
            with sdm.Store.open(pristine, config=preset, readonly=True) as store:
                for spec in SPECS:
                    indices = rng.integers(0, spec.num_rows, 400)
                    offsets = np.concatenate([[0], np.sort(rng.integers(0, 401, 39)), [400]])
                    pooled = store.embedding_bag(spec.name, indices, offsets)
                    bag_refs[preset][spec.name] = (indices, offsets, pooled)
        print(json.dumps({"start": trial["trial"]}), flush=True)
        copy = os.path.join(work, f"t{trial['trial']}")
        shutil.copytree(pristine, copy)
        target = os.path.join(copy, trial["file"])
        result = {"trial": trial["trial"], "changed": apply_damage(target, trial["ops"]),
                  "target": target, "damage": []}
        try:
            with sdm.Store.open(copy, config=preset) as store:
                result["outcome"], result["detail"] = serve(store, expected, bag_refs[preset],
                                                            np.random.default_rng(trial["ids_seed"]))
                for tier in store.stats()["tiers"]:
                    result["damage"] += tier.get("damage", [])
        except errors.CorruptStoreError as exc:
            result["outcome"], result["detail"] = "detected", {
                "error": type(exc).__name__, "path": exc.path, "table": exc.table, "serving": None,
                "message": str(exc)[:300]}
        except errors.SdmError as exc:
            result["outcome"], result["detail"] = "detected", {
                "error": type(exc).__name__, "path": None, "table": None, "serving": None,
                "message": str(exc)[:300]}
        except Exception:
            result["outcome"], result["detail"] = "exception", traceback.format_exc()[-2000:]
        shutil.rmtree(copy, ignore_errors=True)
        print(json.dumps(result), flush=True)


# -- the parent: runs trials in subprocesses, classifies --------------------------------

def run_trials(pristine, trials, work, timeout_s=120.0) -> list[dict]:
    """Run ``trials`` in as few subprocesses as possible: a child that dies (signal) or hangs
    marks the trial it had started and the rest go to a new child."""
    results = []
    pending = list(trials)
    while pending:
        job = os.path.join(work, "job.json")
        with open(job, "w") as f:
            json.dump({"pristine": str(pristine), "work": work, "trials": pending}, f)
        started = None
        try:
            proc = subprocess.run([sys.executable, __file__, "--child", job], capture_output=True,
                                  text=True, timeout=timeout_s + 2.0 * len(pending))
            out, code, err = proc.stdout, proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            code, err = "hang", ""
        done = {}
        for line in out.splitlines():
            msg = json.loads(line)
            if "start" in msg:
                started = msg["start"]
            else:
                done[msg["trial"]] = msg
        by_index = {t["trial"]: t for t in pending}
        for t in pending:
            if t["trial"] in done:
                results.append({**t, **done[t["trial"]]})
        if code == 0 and len(done) == len(pending):
            break
        if started is None or started in done:  # died outside a trial
            raise RuntimeError(f"fuzz child failed (exit {code}):\n{err[-3000:]}")
        crash = "hang" if code == "hang" else f"crash (exit {code})"
        results.append({**by_index[started], "outcome": crash, "detail": err[-2000:], "damage": [],
                        "changed": True})
        pending = [t for t in pending if t["trial"] not in done and t["trial"] != started]
        shutil.rmtree(os.path.join(work, f"t{started}"), ignore_errors=True)
    return sorted(results, key=lambda r: r["trial"])


def failure(r) -> str | None:
    """Why trial result ``r`` is a failure, or None."""
    outcome, detail = r["outcome"], r["detail"]
    scm = r["file"].startswith("scm" + os.sep)
    if outcome not in ("ok", "detected"):
        return f"{outcome}: {detail}"
    if scm:
        if outcome != "ok":
            return f"damage to a derived SCM file must still serve rows, got {detail}"
        if r["preset"] == "sdm-nand" and r["changed"]:
            table = SPECS[int(os.path.basename(r["file"])[1:-len(".rows")])].name
            if not any(d["file"] == r["target"] and d["table"] == table and d["action"] == "rebuilt"
                       for d in r["damage"]):
                return f"SCM damage not reported in stats: {r['damage']}"
        return None
    if r["damage"]:
        return f"damage reported for an intact SCM file: {r['damage']}"
    if outcome == "detected" and detail["error"] == "CorruptStoreError":
        if detail["path"] != r["target"]:
            return f"CorruptStoreError names {detail['path']}, the damaged file is {r['target']}: {detail}"
        if detail["serving"] is not None and detail["table"] != detail["serving"]:
            return f"CorruptStoreError serving table {detail['serving']!r} names table {detail['table']!r}"
    if not r["changed"] and outcome != "ok":
        return f"an unchanged store failed to serve: {detail}"
    return None


def summarize(results) -> dict:
    """``{file kind: {outcome: count}}`` (scm files grouped)."""
    out: dict = {}
    for r in results:
        kind = "scm/*.rows" if r["file"].startswith("scm") else r["file"]
        label = r["outcome"] if r["outcome"] != "detected" else f"detected:{r['detail']['error']}"
        if r["file"].startswith("scm") and r["damage"]:
            label = "ok+damage-reported"
        out.setdefault(kind, {}).setdefault(label, 0)
        out[kind][label] += 1
    return out


def check(pristine, tmp_path, seed, preset, n, round_robin):
    trials = make_trials(pristine, seed, preset, n, round_robin=round_robin)
    work = str(tmp_path / "work")
    os.makedirs(work, exist_ok=True)
    results = run_trials(pristine, trials, work)
    print(f"seed {seed} preset {preset}: {json.dumps(summarize(results))}")
    failures = []
    for r in results:
        why = failure(r)
        if why is not None:
            spec = {k: r[k] for k in ("seed", "preset", "trial", "file", "kind", "ops")}
            failures.append(f"{json.dumps(spec)[:600]}\n  -> {why[:1500]}")
    assert len(results) == n
    assert not failures, f"{len(failures)} of {n} trials failed:\n" + "\n".join(failures)
    return results


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "pristine"
    build_pristine(path)
    return path


def test_pristine_store_has_every_kind_of_file(pristine):
    files = store_files(pristine)
    for want in ("manifest.json", "rows.lmdb/data.mdb", "rows.lmdb/lock.mdb", "write.lock",
                 "scm/t0.rows", "scm/t1.rows", "scm/t2.rows"):
        assert want in files
    assert lmdb_structure_pages(os.path.join(pristine, "rows.lmdb", "data.mdb"))


@pytest.mark.parametrize("preset", PRESETS)
def test_damage_fuzz_every_file(pristine, tmp_path, preset):
    """One trial per file of the store (round robin), under each preset."""
    files = store_files(pristine)
    results = check(pristine, tmp_path, DEFAULT_SEED, preset, len(files), round_robin=True)
    if preset == "sdm-nand":  # the SCM files were damaged, detected and rebuilt
        assert any(r["damage"] for r in results if r["file"].startswith("scm") and r["changed"])


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW_SEEDS)
@pytest.mark.parametrize("preset", PRESETS)
def test_damage_fuzz_slow(pristine, tmp_path, preset, seed):
    check(pristine, tmp_path, seed, preset, SLOW_TRIALS, round_robin=False)


def _main(argv) -> None:
    if argv[:1] == ["--child"]:
        run_child(argv[1])
        return
    seed, preset, n = int(argv[0]), argv[1], int(argv[2])
    with tempfile.TemporaryDirectory() as tmp:
        pristine = os.path.join(tmp, "pristine")
        build_pristine(pristine)
        work = os.path.join(tmp, "work")
        os.makedirs(work)
        for r in run_trials(pristine, make_trials(pristine, seed, preset, n, round_robin=False), work):
            print(json.dumps({**r, "failure": failure(r)}))


if __name__ == "__main__":
    _main(sys.argv[1:])

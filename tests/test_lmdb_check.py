"""The LMDB tree check: page numbers that point past the data file are damage reported as
CorruptStoreError when the store opens, never a SIGBUS on the first read that follows them.

Each damaged open runs in a subprocess, so a regression shows as a crash, not a dead run.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time

import lmdb
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sdm
from helpers import ramp_rows
from sdm.tiers.lmdb_check import F_BIGDATA, P_BRANCH, P_LEAF, TreeDamage, check_tree, check_tree_reference

PAGE = 4096
SPEC = sdm.TableSpec("t", 20_000, 16)


@pytest.fixture(scope="module")
def pristine(make_store):
    return make_store([SPEC], ramp_rows)


def data_file(store) -> str:
    return os.path.join(store, "rows.lmdb", "data.mdb")


def tree_pages(raw, kind: int) -> dict[int, list[tuple[int, int]]]:
    """``{page: [(node offset in the file, node flags)]}`` of the pages of ``kind`` in the
    live main tree (walked from the newer meta page: its root at byte 128, txnid at 144)."""
    metas = [raw[:PAGE], raw[PAGE:2 * PAGE]]
    meta = max(metas, key=lambda m: struct.unpack_from("<Q", m, 144)[0])
    todo, out = [struct.unpack_from("<Q", meta, 128)[0]], {}
    while todo:
        p = todo.pop()
        _, _, flags, lower, _ = struct.unpack_from("<QHHHH", raw, p * PAGE)
        offsets = struct.unpack_from(f"<{(lower - 16) // 2}H", raw, p * PAGE + 16)
        nodes = [(p * PAGE + at, struct.unpack_from("<H", raw, p * PAGE + at + 4)[0]) for at in offsets]
        if flags == P_BRANCH:
            todo += [lo | hi << 16 | f << 32 for lo, hi, f in
                     (struct.unpack_from("<HHH", raw, at) for at, _ in nodes)]
        if flags == kind:
            out[p] = nodes
    return out


def damaged_open(pristine, tmp_path, patch) -> subprocess.CompletedProcess:
    """Copy the store, apply ``patch(data file bytes) -> bytes``, open it and read every row
    in a subprocess."""
    copy = tmp_path / "copy"
    shutil.copytree(pristine, copy)
    path = data_file(copy)
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    with open(path, "wb") as f:
        f.write(patch(raw))
    code = (f"import sdm, numpy as np\n"
            f"with sdm.Store.open({str(copy)!r}) as s:\n"
            f"    s.lookup('t', np.arange({SPEC.num_rows}))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def meta_txnid(path) -> tuple[int, int]:
    env = lmdb.open(os.path.dirname(path), readonly=True, lock=False)
    try:
        return env.stat()["psize"], env.info()["last_txnid"]
    finally:
        env.close()


def test_pristine_store_passes(pristine):
    psize, txnid = meta_txnid(data_file(pristine))
    check_tree(data_file(pristine), psize, txnid)
    check_tree_reference(data_file(pristine), psize, txnid)
    raw = open(data_file(pristine), "rb").read()
    assert tree_pages(raw, P_BRANCH) and tree_pages(raw, P_LEAF)  # the cases below have targets


def test_unknown_transaction_is_damage(pristine):
    psize, txnid = meta_txnid(data_file(pristine))
    with pytest.raises(TreeDamage, match="no meta page"):
        check_tree(data_file(pristine), psize, txnid + 100)


def _overflow_refs(raw: bytearray) -> list[int]:
    """Byte offsets of the overflow page numbers held by leaf nodes."""
    return [at + 8 + struct.unpack_from("<H", raw, at + 6)[0]
            for nodes in tree_pages(raw, P_LEAF).values() for at, nflags in nodes if nflags & F_BIGDATA]


def _set_overflow(raw: bytearray, pgno: int) -> bytearray:
    refs = _overflow_refs(raw)
    assert refs, "the store has no overflow values"
    struct.pack_into("<Q", raw, refs[len(refs) // 2], pgno)
    return raw


def _set_branch_child(raw: bytearray, pgno: int | None = None) -> bytearray:
    """Point the last child of the first branch page at ``pgno`` (None: at the page itself)."""
    page, nodes = next(iter(tree_pages(raw, P_BRANCH).items()))
    pgno = page if pgno is None else pgno
    struct.pack_into("<HHH", raw, nodes[-1][0], pgno & 0xFFFF, (pgno >> 16) & 0xFFFF, pgno >> 32)
    return raw


def _set_overflow_span(raw: bytearray) -> bytearray:
    """An overflow value that starts on the file's last page and claims 16 MiB: LMDB bounds
    the page number but not the pages the value spans, so reading it would fault past the
    end of the file (SIGBUS) without the check."""
    node = next(at for nodes in tree_pages(raw, P_LEAF).values() for at, nflags in nodes if nflags & F_BIGDATA)
    ksize = struct.unpack_from("<H", raw, node + 6)[0]
    struct.pack_into("<Q", raw, node + 8 + ksize, len(raw) // PAGE - 1)
    struct.pack_into("<HH", raw, node, 0, 0x100)  # data size lo, hi: 16 MiB
    return raw


@pytest.mark.parametrize("patch, words", [
    (lambda raw: _set_overflow(raw, len(raw) // PAGE + 1000), "past the file"),
    (lambda raw: _set_overflow(raw, 2**40), "past the file"),
    # inside the file but another value's page: the block checksum catches it on read
    (lambda raw: _set_overflow(raw, len(raw) // PAGE - 1), "checksum mismatch"),
    (lambda raw: _set_branch_child(raw, len(raw) // PAGE + 5), "outside the file"),
    (lambda raw: _set_branch_child(raw, 2**47), "outside the file"),
    (_set_overflow_span, "past the file"),
    (lambda raw: _set_overflow(raw, 2**63 - 1), "past the file"),  # first + need wraps int64
], ids=["overflow-past-end", "overflow-huge", "overflow-last-page", "branch-child-past-end", "branch-child-huge",
        "overflow-spans-past-end", "overflow-at-int64-max"])
def test_page_numbers_past_the_file_are_reported_not_fatal(pristine, tmp_path, patch, words):
    proc = damaged_open(pristine, tmp_path, patch)
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stderr[-2000:]}"
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sdm.errors.CorruptStoreError"), last
    assert "data.mdb" in last and words in last, last


def test_branch_child_inside_the_file_pointing_at_itself_is_damage(pristine, tmp_path):
    proc = damaged_open(pristine, tmp_path, _set_branch_child)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "CorruptStoreError" in proc.stderr.strip().splitlines()[-1]


def _verdict(check, path, psize, txnid):
    try:
        check(path, psize, txnid)
        return "ok"
    except TreeDamage:
        return "damage"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_kernel_walk_agrees_with_the_reference(pristine, tmp_path, data):
    """Random byte damage on the live tree pages: the Numba walk and the recursive reference
    reach the same verdict."""
    raw = bytearray(open(data_file(pristine), "rb").read())
    psize, txnid = meta_txnid(data_file(pristine))
    pages = sorted(set(tree_pages(raw, P_BRANCH)) | set(tree_pages(raw, P_LEAF)))
    for _ in range(data.draw(st.integers(1, 3))):
        page = data.draw(st.sampled_from(pages))
        at = page * PAGE + data.draw(st.integers(0, PAGE - 1))
        raw[at] ^= data.draw(st.integers(1, 255))
    path = tmp_path / "data.mdb"
    path.write_bytes(bytes(raw))
    assert _verdict(check_tree, str(path), psize, txnid) == _verdict(check_tree_reference, str(path), psize, txnid)


def test_overflow_number_near_int64_max_is_damage_in_both_walks(pristine, tmp_path):
    raw = _set_overflow(bytearray(open(data_file(pristine), "rb").read()), 2**63 - 1)
    path = tmp_path / "data.mdb"
    path.write_bytes(bytes(raw))
    psize, txnid = meta_txnid(data_file(pristine))
    assert _verdict(check_tree, str(path), psize, txnid) == "damage"
    assert _verdict(check_tree_reference, str(path), psize, txnid) == "damage"


def _update_forever(path, stop):
    rng = np.random.default_rng(0)
    with sdm.Store.open(path) as store:
        while not stop.is_set():
            store.update_rows("t", rng.choice(200_000, 3, replace=False),
                              rng.standard_normal((3, 16)).astype(np.float32))


def test_checks_while_another_process_commits_see_no_damage(tmp_path):
    """The check walks a read transaction's snapshot: a writer committing meanwhile (reusing
    freed pages, overwriting the older meta page) never makes a healthy store look damaged.
    (Walking the newest meta without a reader held failed ~1 in 750 checks here.)"""
    import multiprocessing

    from sdm.tiers.lmdb import check_snapshot

    store = tmp_path / "store"
    with sdm.Store.create(store, [sdm.TableSpec("t", 200_000, 16)]) as s:
        s.write_table("t", np.zeros((200_000, 16), np.float32))
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    writer = ctx.Process(target=_update_forever, args=(str(store), stop))
    writer.start()
    env = lmdb.open(os.path.dirname(data_file(store)), readonly=True, lock=True, map_size=1 << 40)
    try:
        checks, deadline = 0, time.monotonic() + 4.0
        while time.monotonic() < deadline:
            check_snapshot(env, data_file(store), PAGE)  # raises TreeDamage on a false alarm
            checks += 1
        commits = env.info()["last_txnid"]
    finally:
        env.close()
        stop.set()
        writer.join(30)
    assert writer.exitcode == 0 and commits > 50 and checks > 500

"""Importers on small files the tests write, and their typed errors on malformed input."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import peers
from sdm.errors import ConfigError
from sdm.trace import TraceFormatError, TraceNotFoundError, load
from sdm.trace.importers import (import_criteo, import_dlrm_dist, import_dlrm_trace, import_fbgemm,
                                 parse_criteo_line, read_fbgemm)

FIX = Path("/work/shared/fixtures/dlrm_input")


def _fbgemm_arrays(seed=0, ntab=3, bsz=6):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 4, size=(ntab, bsz))
    offsets = np.concatenate([[0], np.cumsum(lengths.ravel())]).astype(np.int64)
    indices = rng.integers(0, 50, size=int(offsets[-1])).astype(np.int64)
    return indices, offsets, lengths


def _check_fbgemm(tr, indices, offsets, lengths, batch_size):
    ntab, bsz = lengths.shape
    got = list(tr)
    assert [b.batch_size for b in got] == [min(batch_size, bsz - s) for s in range(0, bsz, batch_size)]
    for t in range(ntab):
        bags = [bag for b in got for bag in np.split(b.indices[t], b.offsets[t][1:-1])]
        want = [indices[offsets[t * bsz + j]:offsets[t * bsz + j + 1]] for j in range(bsz)]
        assert len(bags) == bsz
        for x, y in zip(bags, want):
            np.testing.assert_array_equal(x, y)


def test_fbgemm_npz(tmp_path):
    ind, off, ln = _fbgemm_arrays()
    np.savez(tmp_path / "b.npz", indices=ind, offsets=off, lengths=ln)
    path = import_fbgemm(tmp_path / "b.npz", tmp_path / "t.npz", batch_size=4)
    tr = load(path)
    _check_fbgemm(tr, ind, off, ln, 4)
    assert tr.table_sizes.tolist() == [int(ind[off[t * 6]:off[(t + 1) * 6]].max()) + 1 for t in range(3)]
    assert tr.metadata["source"] == "fbgemm"
    sized = load(import_fbgemm([tmp_path / "b.npz"] * 2, tmp_path / "u.npz", table_sizes=[60, 60, 60]))
    assert len(sized) == 2 and sized.table_sizes.tolist() == [60, 60, 60]


@pytest.mark.peers
def test_fbgemm_torch(tmp_path):
    torch = peers.require("torch")
    ind, off, ln = _fbgemm_arrays(1)
    torch.save((torch.from_numpy(ind), torch.from_numpy(off), torch.from_numpy(ln)), tmp_path / "b.pt")
    tr = load(import_fbgemm(tmp_path / "b.pt", tmp_path / "t.npz"))
    _check_fbgemm(tr, ind, off, ln, 6)
    torch.save({"not": "a tuple"}, tmp_path / "bad.pt")
    with pytest.raises(TraceFormatError, match="tuple"):
        read_fbgemm(tmp_path / "bad.pt")
    (tmp_path / "cut.pt").write_bytes((tmp_path / "b.pt").read_bytes()[:100])
    with pytest.raises(TraceFormatError, match="not an FBGEMM trace file"):
        read_fbgemm(tmp_path / "cut.pt")


@pytest.mark.parametrize("change, field, match", [
    (lambda i, o, l: (i, o[:-1], l), "offsets", "T \\* B \\+ 1"),
    (lambda i, o, l: (i[:-1], o, l), "offsets", "len\\(indices\\)"),
    (lambda i, o, l: (i, o, l + np.eye(*l.shape, dtype=l.dtype)), "lengths", "disagree with lengths at table 0, sample 0"),
    (lambda i, o, l: (i.astype(float), o, l), "indices", "integer"),
    (lambda i, o, l: (-i - 1, o, l), "indices", "negative"),
])
def test_fbgemm_malformed(tmp_path, change, field, match):
    ind, off, ln = change(*_fbgemm_arrays())
    np.savez(tmp_path / "b.npz", indices=ind, offsets=off, lengths=ln)
    with pytest.raises(TraceFormatError, match=match) as info:
        import_fbgemm(tmp_path / "b.npz", tmp_path / "t.npz")
    assert info.value.field == field
    assert not (tmp_path / "t.npz").exists()


def test_fbgemm_missing_key_and_truncated(tmp_path):
    ind, off, ln = _fbgemm_arrays()
    np.savez(tmp_path / "b.npz", indices=ind, offsets=off)
    with pytest.raises(TraceFormatError, match="no 'lengths' array"):
        read_fbgemm(tmp_path / "b.npz")
    np.savez(tmp_path / "c.npz", indices=ind, offsets=off, lengths=ln)
    data = (tmp_path / "c.npz").read_bytes()
    (tmp_path / "d.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match="not a readable .npz"):
        read_fbgemm(tmp_path / "d.npz")
    with pytest.raises(TraceNotFoundError):
        read_fbgemm(tmp_path / "none.npz")


def test_dlrm_trace_fixture(tmp_path):
    tr = load(import_dlrm_trace(FIX / "trace.log", tmp_path / "t.npz", batch_size=4, pooling=1))
    ids = np.concatenate([b.indices[0] for b in tr])
    assert ids.tolist() == [1, 2, 3, 4, 5, 3, 4, 1, 1, 6, 3]
    assert tr.table_sizes.tolist() == [7] and tr.batch_sizes.tolist() == [4, 4, 3]
    tr2 = load(import_dlrm_trace(FIX / "trace.log", tmp_path / "u.npz", batch_size=2, pooling=3))
    assert tr2[0].offsets[0].tolist() == [0, 3, 6] and tr2[-1].offsets[0].tolist() == [0, 3, 5]


@pytest.mark.parametrize("text, match", [
    ("1, 2, x, 4\n", "line 1, item 3"),
    ("1, 2\n3, -4\n", "line 2, item 2: negative"),
    ("\n", "holds no row ids"),
])
def test_dlrm_trace_malformed(tmp_path, text, match):
    (tmp_path / "t.log").write_text(text)
    with pytest.raises(TraceFormatError, match=match):
        import_dlrm_trace(tmp_path / "t.log", tmp_path / "t.npz")


def test_dlrm_dist_fixture(tmp_path):
    tr = load(import_dlrm_dist(FIX / "dist_emb_0.log", tmp_path / "t.npz", lookups=1000, batch_size=100))
    assert len(tr) == 10 and tr.table_sizes.tolist() == [7]
    ids = np.concatenate([b.indices[0] for b in tr])
    assert set(ids.tolist()) == {1, 2, 3, 4, 5, 6}
    assert ids[:1].tolist() == [1]  # the first reference is the first unique access


# ------------------------------------------------------------------------------- criteo

H_BIG = "fffffff0"  # >= 2**31


def _line(label="1", dense=None, cats=None):
    dense = dense if dense is not None else [str(i) for i in range(13)]
    cats = cats if cats is not None else [f"{i:08x}" for i in range(26)]
    return "\t".join([label] + dense + cats)


def test_parse_criteo_line():
    dense = ["", "-3", "0", "7"] + ["1"] * 9
    cats = [H_BIG, ""] + ["0a1b2c3d"] * 24
    label, raw, hashes = parse_criteo_line(_line("0", dense, cats).encode(), 1)
    assert label == 0.0 and raw[:4].tolist() == [0, -3, 0, 7]
    assert hashes[0] == 0xFFFFFFF0 and hashes[1] == 0 and hashes[2] == 0x0A1B2C3D
    _, _, h = parse_criteo_line(_line(cats=["ffffffffffffffff"] * 26).encode(), 1)
    assert int(h[0]) == 2**64 - 1


def test_criteo_remap_and_hash(tmp_path):
    lines = [
        _line("1", ["", "-3"] + ["2"] * 11, [H_BIG, ""] + ["00000001"] * 24),
        _line("0", ["5"] * 13, ["00000002", "00000abc"] + ["00000001"] * 24),
        _line("1", ["0"] * 13, [H_BIG, ""] + ["00000003"] * 24),
    ]
    src = tmp_path / "train.txt"
    src.write_text("\n".join(lines) + "\n")
    tr = load(import_criteo(src, tmp_path / "r.npz", batch_size=2))
    assert len(tr) == 2 and tr.num_tables == 26
    assert tr.table_sizes[:3].tolist() == [2, 2, 2]
    ids0 = np.concatenate([tr[0].indices[0], tr[1].indices[0]])
    assert ids0.tolist() == [0, 1, 0]  # contiguous per column, first-seen order
    b = tr[0]
    assert b.labels.tolist() == [1.0, 0.0]
    np.testing.assert_allclose(b.dense[0, :3], [0.0, 0.0, np.log(3.0)], rtol=1e-6)  # missing, -3 -> 0
    np.testing.assert_allclose(b.dense[1], np.log(6.0), rtol=1e-6)
    assert all(o.tolist() == [0, 1, 2] for o in b.offsets)
    sizes = [7] * 26
    th = load(import_criteo(src, tmp_path / "h.npz", table_sizes=sizes, limit=2))
    assert len(th) == 1 and th.batch_sizes.tolist() == [2] and th.table_sizes.tolist() == sizes
    assert th[0].indices[0].tolist() == [0xFFFFFFF0 % 7, 2 % 7]
    assert th[0].indices[1].tolist() == [0, 0xABC % 7]
    tk = load(import_criteo(src, tmp_path / "k.npz", table_sizes="criteo-kaggle"))
    assert tk.table_sizes[2] == 10131227
    assert tk[0].indices[0].tolist() == [0xFFFFFFF0 % 1460, 2 % 1460, 0xFFFFFFF0 % 1460]


@pytest.mark.parametrize("bad, match", [
    (_line() + "\textra", "line 2 has 41 tab-separated columns; Criteo lines have 40"),
    ("\t".join(_line().split("\t")[:30]), "line 2 has 30 tab-separated columns"),
    (_line(cats=["zz"] + ["00000001"] * 25), "line 2, column 15: b'zz' is not a hexadecimal"),
    (_line(cats=["-1f"] + ["00000001"] * 25), "line 2, column 15"),
    (_line(cats=["1" * 17] + ["00000001"] * 25), "at most 64 bits"),
    (_line(dense=["x"] + ["1"] * 12), "line 2, column 2: b'x' is not an integer"),
    (_line(label="yes"), "line 2, column 1: b'yes' is not an integer label"),
    (_line(cats=[" 1f"] + ["00000001"] * 25), "line 2, column 15"),
    (_line(cats=["0x1f"] + ["00000001"] * 25), "line 2, column 15"),
])
def test_criteo_malformed(tmp_path, bad, match):
    src = tmp_path / "t.txt"
    src.write_text(_line() + "\n" + bad + "\n")
    with pytest.raises(TraceFormatError, match=match) as info:
        import_criteo(src, tmp_path / "t.npz")
    assert info.value.field == "line 2"
    assert not (tmp_path / "t.npz").exists()


def test_criteo_truncated_file(tmp_path):
    src = tmp_path / "t.txt"
    whole = _line() + "\n" + _line()
    src.write_text(whole[: len(whole) - 20])  # the last line cut mid-way
    with pytest.raises(TraceFormatError, match=r"line 2 has 3\d tab-separated columns"):
        import_criteo(src, tmp_path / "t.npz")


def test_criteo_bad_sizes_and_empty(tmp_path):
    src = tmp_path / "t.txt"
    src.write_text(_line() + "\n")
    with pytest.raises(ConfigError, match="26 sizes"):
        import_criteo(src, tmp_path / "t.npz", table_sizes=[5, 5])
    (tmp_path / "e.txt").write_text("")
    with pytest.raises(TraceFormatError, match="no Criteo lines"):
        import_criteo(tmp_path / "e.txt", tmp_path / "e.npz")


_dense_field = st.one_of(st.just(""), st.integers(-5, 10**6).map(str))
_hash_field = st.one_of(st.just(""), st.integers(0, 2**64 - 1).map(lambda h: f"{h:x}"),
                        st.integers(0, 2**32 - 1).map(lambda h: f"{h:08X}"))
_row = st.tuples(st.sampled_from(["0", "1"]), st.lists(_dense_field, min_size=13, max_size=13),
                 st.lists(_hash_field, min_size=26, max_size=26))


@settings(max_examples=25)
@given(st.lists(_row, min_size=1, max_size=12), st.integers(1, 5))
def test_criteo_import_matches_a_naive_parser(tmp_path_factory, rows, batch_size):
    d = tmp_path_factory.mktemp("c")
    (d / "t.txt").write_text("".join("\t".join([lab] + den + cat) + "\n" for lab, den, cat in rows))
    sizes = [1 + (j * 7919) % 1000 for j in range(26)]
    tr = load(import_criteo(d / "t.txt", d / "t.npz", table_sizes=sizes, batch_size=batch_size))
    got = list(tr)
    ids = np.concatenate([np.stack(b.indices, 1) for b in got])
    dense = np.concatenate([b.dense for b in got])
    labels = np.concatenate([b.labels for b in got])
    for i, (lab, den, cat) in enumerate(rows):
        assert labels[i] == int(lab)
        want = [np.log(max(int(x), 0) + 1) if x else 0.0 for x in den]
        np.testing.assert_allclose(dense[i], want, rtol=1e-6)
        assert ids[i].tolist() == [(int(h, 16) if h else 0) % sizes[j] for j, h in enumerate(cat)]
    remap = load(import_criteo(d / "t.txt", d / "r.npz", batch_size=batch_size))
    rid = np.concatenate([np.stack(b.indices, 1) for b in remap])
    for j in range(26):
        seen = {}
        want = [seen.setdefault(int(r[2][j], 16) if r[2][j] else 0, len(seen)) for r in rows]
        assert rid[:, j].tolist() == want
        assert remap.table_sizes[j] == len(seen)

"""Placement from a trace profile: the greedy pin rule against a slow reference, row orders,
blocks per lookup against a set-of-blocks reference, the held-out layout gain, the file, the
typed errors and ``sdm place``."""

from __future__ import annotations

import json
import os
import zipfile
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sdm
from sdm.cli import main as cli_main
from sdm.errors import ConfigError, InvalidArgumentError
from sdm.replay.planner import blocks_per_lookup, plan
from sdm.store.placement import Placement, inverse_permutation
from sdm.trace import Batch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TRACE = os.path.join(ROOT, "traces", "default.npz")


class MemTrace:
    """A trace held in memory: ``batches[i][t]`` is the id list of table ``t`` in batch ``i``,
    cut into bags of ``bag`` ids (every table of a batch holds as many ids, as a batch has
    one B)."""

    def __init__(self, table_sizes, batches, bag=1):
        self.table_sizes = np.asarray(table_sizes, dtype=np.int64)
        self._batches = batches
        self._bag = bag

    def __len__(self):
        return len(self._batches)

    def __getitem__(self, i):
        ids = [np.asarray(b, dtype=np.int64) for b in self._batches[i]]
        offsets = np.minimum(np.arange(0, len(ids[0]) + self._bag, self._bag), len(ids[0]))
        return Batch(ids, [np.unique(offsets).astype(np.int64)] * len(ids))


def specs_for(sizes, dims, fmts=None):
    fmts = fmts or ["fp32"] * len(sizes)
    return {f"t{i}": sdm.TableSpec(f"t{i}", int(n), int(d), f) for i, (n, d, f) in enumerate(zip(sizes, dims, fmts))}


@st.composite
def workloads(draw, max_tables=3, max_rows=40, max_batches=5):
    ntab = draw(st.integers(1, max_tables))
    sizes = [draw(st.integers(1, max_rows)) for _ in range(ntab)]
    dims = [draw(st.sampled_from([1, 4, 16, 64])) for _ in range(ntab)]
    nb = draw(st.integers(1, max_batches))
    batches = []
    for _ in range(nb):
        bsz = draw(st.integers(0, 12))
        # skewed ids: squares of uniform draws crowd towards 0
        batches.append([[min(n - 1, draw(st.integers(0, n - 1)) ** 2 // max(1, n - 1)) for _ in range(bsz)]
                        for n in sizes])
    return MemTrace(sizes, batches), specs_for(sizes, dims)


# -- slow references ---------------------------------------------------------------------

def reference_pins(trace, tables, budget):
    """The documented greedy rule, one candidate at a time with exact fractions."""
    specs = list(tables.values())
    counts = [Counter() for _ in specs]
    for i in range(len(trace)):
        for t, ix in enumerate(trace[i].indices):
            counts[t].update(int(x) for x in ix)
    cands = []
    for t, spec in enumerate(specs):
        total = sum(counts[t].values())
        if total:
            cands.append((Fraction(total, spec.num_rows * spec.row_bytes), 0, t, -1))
        for row, c in counts[t].items():
            cands.append((Fraction(c, spec.row_bytes), 1, t, row))
    cands.sort(key=lambda c: (-c[0], c[1], c[2], c[3]))
    left, whole, rows = budget, set(), [set() for _ in specs]
    for _, kind, t, row in cands:
        if t in whole:
            continue
        if kind == 0:
            cost = specs[t].num_rows * specs[t].row_bytes - len(rows[t]) * specs[t].row_bytes
            if cost <= left:
                whole.add(t)
                left -= cost
                rows[t] = set()
        elif specs[t].row_bytes <= left:
            rows[t].add(row)
            left -= specs[t].row_bytes
    return ({specs[t].name for t in whole},
            {specs[t].name: sorted(rows[t]) for t in range(len(specs)) if rows[t]})


def reference_blocks(trace, tables, order, block_bytes, whole=(), pinned=None):
    pinned = pinned or {}
    blocks = {name: 0 for name in tables}
    for i in range(len(trace)):
        for t, (name, spec) in enumerate(tables.items()):
            if name in whole:
                continue
            pos = {int(r): p for p, r in enumerate(order[name])} if name in order else None
            seen = set()
            for row in set(int(x) for x in trace[i].indices[t]) - set(pinned.get(name, ())):
                p = row if pos is None else pos[row]
                start = p * spec.row_bytes
                seen.update(range(start // block_bytes, (start + spec.row_bytes - 1) // block_bytes + 1))
            blocks[name] += len(seen)
    return blocks


def pinned_bytes(p, tables):
    return (sum(tables[n].num_rows * tables[n].row_bytes for n in p.pinned_tables)
            + sum(len(ids) * tables[n].row_bytes for n, ids in p.pinned_rows.items()))


# -- the pin rule ------------------------------------------------------------------------

@settings(max_examples=80)
@given(w=st.one_of(workloads(), workloads(max_rows=6, max_batches=3)), dram=st.integers(0, 6000),
       frac=st.sampled_from([0.0, 0.25, 0.5, 1.0]), layout=st.sampled_from([None, "frequency", "coaccess"]))
def test_pins_follow_the_greedy_rule(w, dram, frac, layout):
    trace, tables = w
    p = plan(trace, tables, dram_bytes=dram, pin_fraction=frac, layout=layout, holdout=0)
    budget = int(frac * dram)
    assert pinned_bytes(p, tables) <= budget
    assert p.info["pinned_bytes"] == pinned_bytes(p, tables) and p.info["pin_budget_bytes"] == budget
    whole, rows = reference_pins(trace, tables, budget)
    assert set(p.pinned_tables) == whole
    assert {n: ids.tolist() for n, ids in p.pinned_rows.items()} == rows
    p.validate(tables)
    for name, spec in tables.items():
        decision = p.info["tables"][name]["decision"]
        assert (decision == "pinned whole") == (name in whole)


@settings(max_examples=60)
@given(w=workloads(), dram=st.integers(0, 5000), layout=st.sampled_from(["frequency", "coaccess"]))
def test_row_order_is_a_permutation_with_pins_first_and_untouched_rows_last(w, dram, layout):
    trace, tables = w
    p = plan(trace, tables, dram_bytes=dram, layout=layout, holdout=0)
    for t, (name, spec) in enumerate(tables.items()):
        touched = sorted({int(x) for i in range(len(trace)) for x in trace[i].indices[t]})
        if not touched:
            assert name not in p.row_order
            continue
        order = p.row_order[name]
        assert order.dtype == np.int64 and sorted(order.tolist()) == list(range(spec.num_rows))
        k = len(touched)
        assert sorted(order[:k].tolist()) == touched
        assert order[k:].tolist() == sorted(set(range(spec.num_rows)) - set(touched))
        pins = p.pinned_rows.get(name, np.empty(0, np.int64))
        assert sorted(order[:len(pins)].tolist()) == pins.tolist()
        pos = p.inverse_order(name)
        np.testing.assert_array_equal(pos[order], np.arange(spec.num_rows))
        assert p.inverse_order(name) is pos  # cached


def test_frequency_layout_orders_by_lookups():
    trace = MemTrace([10], [[[7, 7, 7, 3, 3, 9]], [[7, 3, 1]]])
    p = plan(trace, specs_for([10], [4]), dram_bytes=0, layout="frequency", holdout=0)
    assert p.row_order["t0"].tolist() == [7, 3, 1, 9, 0, 2, 4, 5, 6, 8]


def test_no_layout_means_identity_and_no_orders():
    trace = MemTrace([10], [[[7, 3]], [[7]]])
    p = plan(trace, specs_for([10], [4]), dram_bytes=0, layout=None, holdout=0)
    assert p.row_order == {} and p.inverse_order("t0") is None
    assert p.info["blocks_per_lookup"]["reduction"] == 1.0


def test_plan_profiles_only_the_first_part_of_the_trace():
    batches = [[[1, 1, 1]], [[1, 2]], [[5, 5, 5, 5]], [[5, 6]]]
    tables = specs_for([8], [4])
    p = plan(MemTrace([8], batches), tables, dram_bytes=16, pin_fraction=1.0, layout="frequency")
    assert p.pinned_rows["t0"].tolist() == [1]  # row 5 is hot only in the held-out half
    assert p.info["profile_batches"] == [0, 2] and p.info["measured_batches"] == [2, 4]
    assert p.info["held_out"] is True
    single = plan(MemTrace([8], batches[:1]), tables, dram_bytes=0)
    assert single.info["held_out"] is False and "in-sample" in single.info["measured_on"]


def test_pinning_a_table_whole_frees_its_row_pins():
    # t0: 4 rows of 16 B, row 0 hot; t1: 100 rows, row 0 a little less dense than t0 as a whole.
    # Densest first: t0 row 0 (10/16), t0 whole (13/64, costs 64 - 16), t1 row 0 (3/16).
    trace = MemTrace([4, 100], [[[0] * 10 + [1, 2, 3], [0, 0, 0] + list(range(50, 60))]])
    tables = specs_for([4, 100], [4, 4])
    p = plan(trace, tables, dram_bytes=64, pin_fraction=1.0, layout=None, holdout=0)
    assert p.pinned_tables == ("t0",) and p.pinned_rows == {}
    assert p.info["pinned_bytes"] == 64
    p = plan(trace, tables, dram_bytes=47, pin_fraction=1.0, layout=None, holdout=0)
    assert p.pinned_tables == () and p.pinned_rows["t0"].tolist() == [0]
    assert p.pinned_rows["t1"].tolist() == [0]


def test_a_small_hot_table_is_pinned_whole_and_its_rows_are_not():
    # table 0: 4 rows, hot; table 1: big and cold; budget fits table 0 whole
    batches = [[[0, 1, 2, 3, 0, 1], [i]] for i in range(6)]
    tables = specs_for([4, 1000], [4, 4])
    p = plan(MemTrace([4, 1000], batches), tables, dram_bytes=2 * 4 * 16 + 32, pin_fraction=0.5,
             layout=None, holdout=0)
    assert p.pinned_tables == ("t0",) and "t0" not in p.pinned_rows
    assert p.pinned_rows["t1"].tolist() == [0]  # 16 bytes left: one row of table 1
    assert p.info["tables"]["t0"]["decision"] == "pinned whole"
    assert p.info["tables"]["t1"]["decision"] == "1 rows pinned"


# -- blocks per lookup ------------------------------------------------------------------

@settings(max_examples=60)
@given(w=workloads(max_rows=300), block=st.sampled_from([16, 64, 512, 4096]), seed=st.integers(0, 99),
       exclude=st.booleans())
def test_blocks_per_lookup_matches_sets_of_blocks(w, block, seed, exclude):
    trace, tables = w
    rng = np.random.default_rng(seed)
    order = {name: rng.permutation(spec.num_rows) for name, spec in list(tables.items())[::2]}
    pins = plan(trace, tables, dram_bytes=3000, layout=None, holdout=0) if exclude else None
    got = blocks_per_lookup(trace, tables, row_order=order, block_bytes=block, exclude=pins)
    want = reference_blocks(trace, tables, order, block, pins.pinned_tables if pins else (),
                            {n: ids.tolist() for n, ids in pins.pinned_rows.items()} if pins else None)
    lookups = 0
    for t, name in enumerate(tables):
        n = sum(len(trace[i].indices[t]) for i in range(len(trace)))
        lookups += n
        assert got["tables"][name]["blocks"] == want[name]
        assert got["tables"][name]["lookups"] == n
        assert got["tables"][name]["blocks_per_lookup"] == (want[name] / n if n else 0.0)
    assert got["total"]["blocks"] == sum(want.values()) and got["total"]["lookups"] == lookups
    assert got["batches"] == len(trace)


def test_blocks_per_lookup_on_a_batch_range():
    trace = MemTrace([64], [[[0, 1]], [[0, 40]], [[63]]])
    tables = specs_for([64], [16])  # 64 B rows: 4 per 256 B block
    got = blocks_per_lookup(trace, tables, block_bytes=256, batches=range(1, 3))
    assert got["total"] == {"blocks": 3, "rows": 3, "lookups": 3, "blocks_per_lookup": 1.0}
    got = blocks_per_lookup(trace, tables, row_order={"t0": np.r_[40, 0, np.arange(1, 40), np.arange(41, 64)]},
                            block_bytes=256, batches=slice(1, 2))
    assert got["total"]["blocks"] == 1


def test_coaccess_layout_reduces_blocks_per_lookup_on_held_out_batches():
    # Skewed (Zipf-like, hot rows scattered over the id space): planned on batches 0-15,
    # measured on 16-31 of the bundled trace.
    with sdm.trace.load(DEFAULT_TRACE) as trace:
        tables = {f"t{i}": sdm.TableSpec(f"t{i}", int(n), 64, "fp32") for i, n in enumerate(trace.table_sizes)}
        p = plan(trace, tables, dram_bytes=0, layout="coaccess")
        bpl = p.info["blocks_per_lookup"]
        assert p.info["held_out"] and p.info["measured_batches"] == [16, 32]
        assert bpl["reduction"] > 1.3, bpl["reduction"]
        again = blocks_per_lookup(trace, tables, row_order=p.row_order, batches=range(16, 32))
        assert again["total"] == bpl["after"]["total"]
        for name in tables:
            assert p.info["tables"][name]["blocks_per_lookup_after"] < p.info["tables"][name]["blocks_per_lookup_before"]


def grouped_trace(n_rows=50000, group=8, batches=24, bsz=128, seed=0):
    """Rows come in groups of ``group`` scattered ids always looked up together (one bag per
    group, groups drawn Zipf 1.1; a user's history, say): co-access that frequency alone
    cannot see."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n_rows)
    weights = 1.0 / np.arange(1, n_rows // group + 1) ** 1.1
    weights /= weights.sum()
    out = []
    for _ in range(batches):
        g = rng.choice(n_rows // group, size=bsz, p=weights)
        out.append([perm[(g[:, None] * group + np.arange(group)).ravel()]])
    return MemTrace([n_rows], out, bag=group)


def test_coaccess_beats_frequency_when_rows_are_looked_up_together():
    trace = grouped_trace()
    tables = specs_for([50000], [64])
    after = {layout: plan(trace, tables, dram_bytes=0, layout=layout).info["blocks_per_lookup"]
             for layout in ("frequency", "coaccess")}
    freq = after["frequency"]["after"]["total"]["blocks_per_lookup"]
    co = after["coaccess"]["after"]["total"]["blocks_per_lookup"]
    assert co < 0.85 * freq, (co, freq)
    assert after["coaccess"]["reduction"] > 1.8


# -- the file ----------------------------------------------------------------------------

def sample_placement():
    return Placement(("a",), {"b": np.array([1, 5, 9])}, {"b": np.array([3, 0, 1, 2] + list(range(4, 12)))},
                     {"layout": "coaccess", "x": [1, 2.5, None]})


TABLES = {"a": sdm.TableSpec("a", 5, 4), "b": sdm.TableSpec("b", 12, 8, "int8")}


def test_save_load_round_trip(tmp_path):
    p = sample_placement()
    path = p.save(tmp_path / "p.npz")
    assert not [n for n in os.listdir(tmp_path) if "tmp" in n]
    q = Placement.load(path)
    assert q.pinned_tables == ("a",) and q.info == p.info
    for attr in ("pinned_rows", "row_order"):
        assert getattr(q, attr).keys() == getattr(p, attr).keys()
        for k in getattr(p, attr):
            np.testing.assert_array_equal(getattr(q, attr)[k], getattr(p, attr)[k])
            assert getattr(q, attr)[k].dtype == np.int64
    q.validate(TABLES)
    with np.load(path, allow_pickle=False) as npz:  # plain arrays, nothing pickled
        assert all(npz[k].dtype != object for k in npz.files)
    empty = Placement().save(tmp_path / "e.npz")
    assert Placement.load(empty).pinned_row_count() == 0


def test_plan_round_trips_through_a_file(tmp_path):
    with sdm.trace.load(os.path.join(ROOT, "traces", "tiny-zipf.npz")) as trace:
        tables = specs_for(trace.table_sizes, [16, 16])
        p = plan(trace, tables, dram_bytes=20000)
    q = Placement.load(p.save(tmp_path / "p.npz"))
    q.validate(tables)
    assert q.pinned_row_count() == p.pinned_row_count() > 0 and q.info == json.loads(json.dumps(p.info))


def _npz(path, **arrays):
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return str(path)


def good_members():
    return {"format": np.array("sdm-placement"), "version": np.array(1), "pinned_tables": np.array(["a"]),
            "pinned_names": np.array([], dtype="<U1"), "order_names": np.array([], dtype="<U1"),
            "info": np.frombuffer(b"{}", dtype=np.uint8)}


@pytest.mark.parametrize("damage, words", [
    ("missing", ["no placement file"]),
    ("garbage", ["cannot be read"]),
    ("truncated", ["cannot be read"]),
    ("no_format", ["no 'format' member"]),
    ("foreign", ["not an sdm placement"]),
    ("version", ["version"]),
    ("object", ["cannot be read"]),
    ("info", ["'info' is not JSON"]),
    ("member_missing", ["no 'pinned_rows_0' member"]),
    ("unsorted", ["sorted unique", "'b'"]),
    ("not_permutation", ["not a permutation", "'b'"]),
    ("float_ids", ["1-D integer array"]),
    ("npy", ["single .npy"]),
])
def test_bad_files_raise_config_error_naming_the_path(tmp_path, damage, words):
    path = tmp_path / "p.npz"
    good = sample_placement().save(tmp_path / "good.npz")
    m = good_members()
    if damage == "garbage":
        path.write_bytes(b"not a zip at all" * 10)
    elif damage == "truncated":
        data = open(good, "rb").read()
        path.write_bytes(data[: len(data) // 2])
    elif damage == "no_format":
        del m["format"]
        _npz(path, **m)
    elif damage == "foreign":
        m["format"] = np.array("something-else")
        _npz(path, **m)
    elif damage == "version":
        m["version"] = np.array(7)
        _npz(path, **m)
    elif damage == "object":
        m["pinned_tables"] = np.array(["a", None], dtype=object)
        with open(path, "wb") as f:
            np.savez(f, **m)  # pickled member: must be refused, never unpickled
    elif damage == "info":
        m["info"] = np.frombuffer(b"{nope", dtype=np.uint8)
        _npz(path, **m)
    elif damage == "member_missing":
        m["pinned_names"] = np.array(["b"])
        _npz(path, **m)
    elif damage == "unsorted":
        m["pinned_tables"] = np.array([], dtype="<U1")
        m["pinned_names"] = np.array(["b"])
        m["pinned_rows_0"] = np.array([3, 1])
        _npz(path, **m)
    elif damage == "not_permutation":
        m["order_names"] = np.array(["b"])
        m["row_order_0"] = np.array([0, 1, 1, 3])
        _npz(path, **m)
    elif damage == "float_ids":
        m["pinned_tables"] = np.array([], dtype="<U1")
        m["pinned_names"] = np.array(["b"])
        m["pinned_rows_0"] = np.array([0.5])
        _npz(path, **m)
    elif damage == "npy":
        np.save(open(path, "wb"), np.arange(3))
    with pytest.raises(ConfigError) as err:
        Placement.load(path)
    msg = str(err.value)
    assert str(path) in msg
    for w in words:
        assert w in msg, msg


def test_corrupted_member_bytes_raise_config_error(tmp_path):
    path = sample_placement().save(tmp_path / "p.npz")
    data = bytearray(open(path, "rb").read())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("row_order_0.npy")
    at = info.header_offset + 30 + len(info.filename) + 200  # inside the member's data
    data[at] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(ConfigError, match="cannot be read"):
        Placement.load(path)


@pytest.mark.parametrize("placement, words", [
    (lambda: Placement(("zz",)), ["'zz'", "does not hold"]),
    (lambda: Placement(pinned_rows={"b": np.array([2, 12])}), ["id 12", "[0, 12)"]),
    (lambda: Placement(row_order={"b": np.arange(5)}), ["5 entries", "12 rows"]),
    (lambda: Placement(row_order={"q": np.arange(3)}), ["'q'"]),
])
def test_validate_names_the_table_and_the_limit(placement, words):
    with pytest.raises(ConfigError) as err:
        placement().validate(TABLES)
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("kwargs, words", [
    (dict(pinned_rows={"b": np.array([1, 1])}), ["sorted unique", "'b'"]),
    (dict(pinned_rows={"b": np.array([-1, 2])}), ["sorted unique", "-1"]),
    (dict(pinned_tables=("b",), pinned_rows={"b": np.array([1])}), ["'b'", "both pinned whole"]),
    (dict(pinned_tables=("a", "a")), ["more than once"]),
    (dict(row_order={"b": np.array([0, 2])}), ["row 2", "[0, 2)"]),
    (dict(row_order={"b": np.array([1, 1, 0, 2])[:3]}), ["not a permutation", "row 2"]),
    (dict(info={"x": object()}), ["JSON"]),
    (dict(info=[1]), ["info must be a dict"]),
    (dict(pinned_tables="ab"), ["sequence of table names", "'ab'"]),
    (dict(pinned_tables=(3,)), ["holds 3"]),
    (dict(row_order={3: np.arange(2)}), ["key 3"]),
])
def test_malformed_placements_are_refused(kwargs, words):
    with pytest.raises(ConfigError) as err:
        Placement(**kwargs)
    for w in words:
        assert w in str(err.value), str(err.value)


def test_placement_is_immutable():
    p = sample_placement()
    with pytest.raises(ValueError):
        p.pinned_rows["b"][0] = 7
    with pytest.raises(AttributeError):
        p.pinned_tables = ()


# -- bad arguments -------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, words", [
    (dict(dram_bytes=-1), ["dram_bytes", "-1"]),
    (dict(dram_bytes=1.5), ["dram_bytes", "1.5"]),
    (dict(dram_bytes=True), ["dram_bytes", "True"]),
    (dict(dram_bytes=10, pin_fraction=1.5), ["pin_fraction", "1.5"]),
    (dict(dram_bytes=10, pin_fraction=-0.1), ["pin_fraction", "-0.1"]),
    (dict(dram_bytes=10, layout="hilbert"), ["'hilbert'", "coaccess"]),
    (dict(dram_bytes=10, block_bytes=0), ["block_bytes", "0"]),
    (dict(dram_bytes=10, holdout=1.0), ["holdout", "1.0"]),
])
def test_bad_arguments_raise_config_error_naming_the_value(kwargs, words):
    trace = MemTrace([10], [[[1]]])
    with pytest.raises(ConfigError) as err:
        plan(trace, specs_for([10], [4]), **kwargs)
    for w in words:
        assert w in str(err.value)


def test_a_trace_that_does_not_fit_the_store_is_refused():
    trace = MemTrace([10, 20], [[[1], [2]]])
    with pytest.raises(ConfigError, match="2 tables, the store 1"):
        plan(trace, specs_for([10], [4]), dram_bytes=0)
    with pytest.raises(ConfigError, match="trace table 1 has 20 rows.*'t1'.*has 21"):
        plan(trace, specs_for([10, 21], [4, 4]), dram_bytes=0)
    with pytest.raises(ConfigError, match="2 tables, the store 1"):
        blocks_per_lookup(trace, specs_for([10], [4]))
    with pytest.raises(InvalidArgumentError, match="block_bytes"):
        blocks_per_lookup(trace, specs_for([10, 20], [4, 4]), block_bytes=0)
    with pytest.raises(sdm.trace.TraceNotFoundError):
        plan("/nonexistent/trace.npz", specs_for([10], [4]), dram_bytes=0)


def test_inverse_permutation():
    order = np.array([2, 0, 3, 1])
    np.testing.assert_array_equal(inverse_permutation(order), [1, 3, 0, 2])


# -- sdm place -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("place") / "s"
    with sdm.trace.load(os.path.join(ROOT, "traces", "tiny-zipf.npz")) as trace:
        specs = [sdm.TableSpec(f"t{i}", int(n), 16, "fp32") for i, n in enumerate(trace.table_sizes)]
    with sdm.Store.create(path, specs):
        pass
    return str(path)


def test_cli_place_writes_a_placement_and_reports_it(tiny_store, tmp_path, capsys):
    trace = os.path.join(ROOT, "traces", "tiny-zipf.npz")
    out = tmp_path / "p.npz"
    assert cli_main(["place", trace, "--store", tiny_store, "--dram-bytes", "16K", "-o", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["output"] == str(out) and report["dram_bytes"] == 16384 and report["layout"] == "coaccess"
    p = Placement.load(out)
    assert report["pinned_bytes"] == p.info["pinned_bytes"] <= 8192
    assert set(report["tables"]) == {"t0", "t1"}
    assert cli_main(["place", trace, "--store", tiny_store, "--dram-bytes", "0", "--layout", "frequency",
                     "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "blocks per lookup" in text and "fewer blocks" in text and "t1" in text and "cached" in text


@pytest.mark.parametrize("args, words", [
    (["--dram-bytes", "lots"], ["--dram-bytes", "'lots'"]),
    (["--dram-bytes", "1K", "--pin-fraction", "2"], ["pin_fraction", "2"]),
])
def test_cli_place_errors_are_one_line(tiny_store, tmp_path, capsys, args, words):
    trace = os.path.join(ROOT, "traces", "tiny-zipf.npz")
    assert cli_main(["place", trace, "--store", tiny_store, "-o", str(tmp_path / "p.npz")] + args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sdm place: error:") and "\n" not in err
    for w in words:
        assert w in err
    assert not os.path.exists(tmp_path / "p.npz")


def test_cli_place_with_a_store_of_other_tables(tmp_path, capsys):
    path = tmp_path / "s"
    with sdm.Store.create(path, [sdm.TableSpec("x", 5, 4)]):
        pass
    trace = os.path.join(ROOT, "traces", "tiny-zipf.npz")
    assert cli_main(["place", trace, "--store", str(path), "--dram-bytes", "1", "-o", str(tmp_path / "p.npz")]) == 2
    assert "the trace has 2 tables, the store 1" in capsys.readouterr().err

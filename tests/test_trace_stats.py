"""Locality statistics against naive references and the locality_stats definitions."""

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdm.trace import Batch, save
from sdm.trace.stats import (NUM_REUSE_BINS, batch_reuse, fit_zipf_alpha, read_locality_stats,
                             reuse_bins, table_stack_distribution, trace_stats)
from sdm.trace.render import bin_labels, plot_stats, stats_text

LOCALITY = Path("/work/shared/fixtures/dlrm_datasets/locality_stats_2021.txt")


def _naive_bin(c):
    if c <= 1:
        return 0
    for k, hi in enumerate([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                            32768]):
        if c <= hi:
            return k
    return 16


def test_bin_edges():
    counts = [1, 2, 3, 4, 5, 8, 9, 16384, 16385, 32768, 32769, 10**9]
    assert reuse_bins(counts).tolist() == [_naive_bin(c) for c in counts]
    assert len(bin_labels()) == NUM_REUSE_BINS == 17
    assert bin_labels()[0] == "(0, 1]" and bin_labels()[-1] == "(32768+"


@given(st.lists(st.integers(0, 40), max_size=300))
def test_batch_reuse_matches_a_counter(keys):
    rows, lookups, distinct = batch_reuse(np.array(keys, dtype=np.int64))
    c = Counter(keys)
    want_rows = np.zeros(17, np.int64)
    want_lk = np.zeros(17, np.int64)
    for v in c.values():
        want_rows[_naive_bin(v)] += 1
        want_lk[_naive_bin(v)] += v
    assert rows.tolist() == want_rows.tolist() and lookups.tolist() == want_lk.tolist()
    assert distinct == len(c)


def test_fit_zipf_alpha_on_exact_power_laws():
    for a in (0.7, 1.0, 1.3):
        f = np.floor(1e6 * np.arange(1, 5000, dtype=float) ** -a)
        assert abs(fit_zipf_alpha(f) - a) < 0.02
    assert fit_zipf_alpha([1, 1, 1]) is None


def _small_trace(tmp_path):
    # table 0 has 10 rows, table 1 has 5; two batches of 3 samples
    b0 = Batch([np.array([1, 1, 2, 1]), np.array([4])], [np.array([0, 2, 3, 4]), np.array([0, 0, 1, 1])])
    b1 = Batch([np.array([3]), np.array([4, 4, 0])], [np.array([0, 1, 1, 1]), np.array([0, 1, 2, 3])])
    return save(tmp_path / "s.npz", [b0, b1], [10, 5], generator="hand")


def test_trace_stats_on_a_hand_trace(tmp_path):
    s = trace_stats(_small_trace(tmp_path), stack_lookups=100)
    assert (s.batches, s.samples, s.lookups) == (2, 6, 9)
    assert s.distinct == 5  # (0,1) (0,2) (0,3) (1,4) (1,0)
    assert [(t.lookups, t.distinct) for t in s.tables] == [(5, 3), (4, 2)]
    assert s.lookups_per_batch.tolist() == [5, 4] and s.unique_per_batch.tolist() == [3, 3]
    # batch 0: row (0,1) x3, (0,2) x1, (1,4) x1; batch 1: (0,3) x1, (1,4) x2, (1,0) x1
    assert s.reuse_rows[:3].tolist() == [4, 1, 1] and s.reuse_lookups[:3].tolist() == [4, 2, 3]
    assert s.working_set[1].tolist() == [0, 3, 5]
    # global key stream 1 1 2 1 14 | 3 14 14 10: stack distances 0 1 0 2 0 | 0 3 1 0
    assert s.stack["cold"] == pytest.approx(5 / 9)
    assert s.stack["lookups"] == 9
    j = s.to_json()
    for key in ("lookups", "distinct", "tables", "reuse_histogram", "zipf_alpha", "stack_distance",
                "unique_per_batch", "working_set"):
        assert key in j
    h = j["reuse_histogram"]
    assert h["bins"] == [2**k for k in range(16)]
    assert len(h["rows"]) == len(h["lookups"]) == 17
    assert sum(h["rows"]) == pytest.approx(1) and sum(h["lookups"]) == pytest.approx(1)
    assert j["tables"][0]["lookups"] == 5 and j["tables"][1]["distinct"] == 2
    text = stats_text(s)
    assert "(0, 1]" in text and "lookups    9" in text


def test_table_stack_distribution(tmp_path):
    path = _small_trace(tmp_path)
    d = table_stack_distribution(path, 0)
    assert d.unique_accesses.tolist() == [1, 2, 3]
    assert d.distances.tolist() == [0, 1, 2]  # stream 1 1 2 1 3
    np.testing.assert_allclose(d.cumulative, [0.6, 0.8, 1.0])
    with pytest.raises(ValueError, match="table 5 out of range"):
        table_stack_distribution(path, 5)


def test_plots(tmp_path):
    s = trace_stats(_small_trace(tmp_path))
    paths = plot_stats(s, tmp_path / "plots")
    assert len(paths) == 5 and all(Path(p).stat().st_size > 1000 for p in paths)


def test_read_locality_stats():
    blocks = read_locality_stats(LOCALITY)
    assert len(blocks) > 5
    for b in blocks:
        assert len(b["rows"]) == 17 and len(b["lookups_share"]) == 17
        assert abs(sum(b["lookups_share"]) - 1) < 0.01


def test_many_batches_match_a_whole_trace_reference(tmp_path):
    from sdm.trace import generate, load

    gen = generate("zipf", tables=2, table_size=3000, batches=40, batch_size=16, pooling=3, seed=4)
    path = save(tmp_path / "m.npz", gen, gen.table_sizes)
    s = trace_stats(path)
    tr = load(path)
    for t in range(2):
        ids = np.concatenate([b.indices[t] for b in tr])
        u, c = np.unique(ids, return_counts=True)
        assert (s.tables[t].lookups, s.tables[t].distinct) == (ids.size, u.size)
    keys = np.concatenate(list(tr.keys()))
    first = np.zeros(keys.size, bool)
    first[np.unique(keys, return_index=True)[1]] = True
    want = np.concatenate([[0], np.cumsum(first)[np.cumsum(tr.batch_lookups) - 1]])
    assert s.working_set[1].tolist() == want.tolist()
    assert s.distinct == want[-1]

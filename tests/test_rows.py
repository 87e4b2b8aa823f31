"""The row gather of a tier's batch reads (sdm.kernels.rows) against np.take."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdm.kernels.rows import take_rows


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), width=st.integers(1, 300), k=st.integers(0, 200),
       dtype=st.sampled_from([np.uint8, np.float32, np.int64]), seed=st.integers(0, 2**32 - 1))
def test_take_rows_is_np_take(n, width, k, dtype, seed):
    rng = np.random.default_rng(seed)
    table = rng.integers(0, 100, size=(n, width)).astype(dtype)
    pos = rng.integers(0, n, size=k).astype(np.int64)
    out = np.empty((k, width), dtype=dtype)
    take_rows(table, pos, out)
    np.testing.assert_array_equal(out, np.take(table, pos, axis=0))


def test_take_rows_reads_a_strided_table_and_an_mmaped_file(tmp_path):
    rows = np.arange(64 * 40, dtype=np.uint8).reshape(64, 40)
    path = tmp_path / "rows.bin"
    rows.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r", shape=(64, 40))
    pos = np.array([63, 0, 5, 5, 17], dtype=np.int64)
    out = np.empty((5, 40), dtype=np.uint8)
    take_rows(mapped, pos, out)
    np.testing.assert_array_equal(out, rows[pos])
    wide = np.arange(64 * 80, dtype=np.uint8).reshape(64, 80)[:, ::2]  # rows not contiguous
    take_rows(wide, pos, out)
    np.testing.assert_array_equal(out, wide[pos])


@pytest.mark.parametrize("bad", [-1, 10, 1 << 40])
def test_take_rows_refuses_a_position_out_of_range(bad):
    table = np.ones((10, 8), dtype=np.uint8)
    out = np.zeros((3, 8), dtype=np.uint8)
    with pytest.raises(IndexError, match=f"row position {bad} is out of range for 10 rows"):
        take_rows(table, np.array([1, bad, 2], dtype=np.int64), out)


def test_take_rows_refuses_an_out_of_another_shape_or_dtype():
    table = np.ones((10, 8), dtype=np.uint8)
    pos = np.array([1, 2, 3], dtype=np.int64)
    for out in (np.zeros((2, 8), np.uint8), np.zeros((3, 4), np.uint8), np.zeros((3, 8), np.float32)):
        with pytest.raises(ValueError, match=r"out must be \(3, 8\) uint8"):
            take_rows(table, pos, out)

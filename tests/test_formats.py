"""Row formats: round trips, exact constant rows, and the int8 layout against torch's prepack."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import peers
import sdm
from sdm.errors import InvalidArgumentError

finite_rows = hnp.arrays(
    np.float32,
    st.tuples(st.integers(0, 20), st.integers(1, 40)),
    elements=st.floats(-1e4, 1e4, allow_nan=False, width=32),
)


@given(finite_rows)
def test_round_trip(x):
    n, dim = x.shape
    for fmt in sdm.ROW_FORMATS:
        raw = sdm.quantize_rows(x, fmt)
        assert raw.dtype == np.uint8 and raw.shape == (n, sdm.row_bytes(fmt, dim))
        back = sdm.dequantize_rows(raw, fmt, dim)
        assert back.shape == (n, dim) and back.dtype == np.float32
        if fmt == "fp32":
            assert np.array_equal(back, x)
        elif fmt == "fp16":
            np.testing.assert_allclose(back, x, rtol=2**-10, atol=2**-14)
        elif n:
            # int8: within half a quantization step (plus float32 rounding of the decode)
            span = x.max(axis=1) - x.min(axis=1)
            step = span / 255
            err = np.abs(back - x).max(axis=1)
            assert (err <= 0.5 * step + 1e-6 * (np.abs(x).max(axis=1) + 1)).all()


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=1, max_size=8),
       st.integers(1, 33))
def test_constant_rows_exact(values, dim):
    x = np.repeat(np.asarray(values, np.float32)[:, None], dim, axis=1)
    for fmt in ("fp32", "int8"):
        assert np.array_equal(sdm.dequantize_rows(sdm.quantize_rows(x, fmt), fmt, dim), x)


def test_int8_layout():
    x = np.array([[0.0, 1.0, 0.5, -1.0]], dtype=np.float32)
    raw = sdm.quantize_rows(x, "int8")
    assert raw.shape == (1, 12)
    scale, bias = raw[0, 4:].view(np.float32)
    assert bias == np.float32(-1.0) and scale == np.float32(2.0) / np.float32(255.0)
    assert raw[0, 3] == 0 and raw[0, 1] == 255


@pytest.mark.parametrize("dim", [1, 3, 8, 64, 67])
@pytest.mark.peers
def test_int8_layout_matches_torch_prepack(dim):
    torch = peers.require("torch")
    rng = np.random.default_rng(dim)
    x = (rng.standard_normal((300, dim)) * rng.uniform(0.01, 100, (300, 1))).astype(np.float32)
    x[0] = 3.25  # a constant row
    packed = torch.ops.quantized.embedding_bag_byte_prepack(torch.from_numpy(x)).numpy()
    ours = sdm.quantize_rows(x, "int8")
    assert ours.shape == packed.shape
    # scale and bias are bit-identical; a code may differ by one where rounding ties break
    assert np.array_equal(ours[:, dim:], packed[:, dim:])
    assert np.abs(ours[:, :dim].astype(int) - packed[:, :dim].astype(int)).max() <= 1
    assert (ours[:, :dim] == packed[:, :dim]).mean() > 0.999


def test_bad_input():
    with pytest.raises(InvalidArgumentError, match="row format"):
        sdm.quantize_rows(np.zeros((1, 2)), "int4")
    with pytest.raises(InvalidArgumentError, match="finite"):
        sdm.quantize_rows(np.array([[np.nan]]), "int8")
    with pytest.raises(InvalidArgumentError, match="2-D"):
        sdm.quantize_rows(np.zeros(3), "fp32")
    with pytest.raises(InvalidArgumentError, match=r"\(n, 12\) uint8"):
        sdm.dequantize_rows(np.zeros((2, 11), np.uint8), "int8", 4)

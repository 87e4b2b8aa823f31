"""Dense-feature preprocessing of the Criteo datasets, as the reference DLRM does it."""

from __future__ import annotations

import numpy as np

from sdm.errors import InvalidArgumentError

__all__ = ["preprocess_dense"]


def preprocess_dense(x) -> np.ndarray:
    """``log(x + 1)`` with negative values clamped to 0 first (reference DLRM's
    ``data_utils``); missing values given as NaN count as 0, as the reference fills them.

    Args:
        x: ``(..., 13)`` (or any shape) integer or float raw counts.

    Returns:
        float32 array of the same shape, every value >= 0.

    Raises:
        InvalidArgumentError: a non-numeric dtype or an infinite value (named).
    """
    a = np.asarray(x)
    if a.dtype == np.bool_ or not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise InvalidArgumentError(f"dense features must be numeric, got dtype {a.dtype}")
    a = a.astype(np.float64)  # int64 counts above 2^24 keep their precision until the log
    if np.isinf(a).any():
        at = tuple(int(i) for i in np.argwhere(np.isinf(a))[0])
        raise InvalidArgumentError(f"dense feature at {at} is {a[at]}; values must be finite")
    a = np.nan_to_num(a, nan=0.0)
    np.maximum(a, 0.0, out=a)
    return np.log1p(a).astype(np.float32)

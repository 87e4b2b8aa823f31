"""Row formats: how one embedding row is laid out in bytes.

``fp32``  ``dim`` float32, ``4 * dim`` bytes.
``fp16``  ``dim`` float16, ``2 * dim`` bytes.
``int8``  FBGEMM's fused 8-bit row-wise layout: ``dim`` uint8 codes, then a float32 scale and
          a float32 bias (``dim + 8`` bytes). ``scale = (max - min) / 255``, ``bias = min``,
          ``q = rint((x - min) * 255 / (max - min + 1e-8))``, ``x ~ q * scale + bias``.
          A constant row (max == min) has scale 0 and decodes exactly to its value.

Every format is stored and moved as raw ``(n, row_bytes) uint8`` rows; only the kernels and
:func:`dequantize_rows` interpret them.
"""

from __future__ import annotations

import numpy as np

from sdm.errors import InvalidArgumentError
from sdm.validate import check_choice, check_int

__all__ = ["ROW_FORMATS", "MAX_DIM", "row_bytes", "quantize_rows", "dequantize_rows", "check_format",
           "check_dim"]

ROW_FORMATS = ("fp32", "fp16", "int8")
#: The widest row: values per row of any table (``TableSpec.dim``, replay and sweep ``dim``).
MAX_DIM = 2**16

_INT8_EPS = np.float32(1e-8)  # FBGEMM's kEpsilon in the inverse scale
_FP16_MAX = float(np.finfo(np.float16).max)  # 65504: larger values would encode as inf
INT8_TAIL_BYTES = 8  # fp32 scale + fp32 bias after the codes


def check_format(fmt, *, error=InvalidArgumentError) -> str:
    """Return ``fmt`` if it names a row format, else raise naming the accepted ones."""
    return check_choice(fmt, "row format", ROW_FORMATS, error=error)


def check_dim(dim, name: str = "dim", *, error=InvalidArgumentError) -> int:
    """Values per row: an integer in ``[1, MAX_DIM]``."""
    return check_int(dim, name, lo=1, hi=MAX_DIM, error=error)


def row_bytes(fmt: str, dim: int) -> int:
    """Bytes one row of ``dim`` values takes in ``fmt``."""
    check_format(fmt)
    if fmt == "fp32":
        return 4 * dim
    if fmt == "fp16":
        return 2 * dim
    return dim + INT8_TAIL_BYTES


def quantize_rows(x, fmt: str) -> np.ndarray:
    """Encode float rows into a row format.

    Args:
        x: ``(n, dim)`` floating rows (converted to float32); values must be finite.
        fmt: one of :data:`ROW_FORMATS`.

    Returns:
        ``(n, row_bytes(fmt, dim)) uint8``, C-contiguous.
    """
    check_format(fmt)
    x = np.asarray(x)
    if x.ndim != 2:
        raise InvalidArgumentError(f"rows must be 2-D (n, dim), got shape {x.shape}")
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise InvalidArgumentError(f"rows must be numeric, got dtype {x.dtype}")
    with np.errstate(over="ignore"):  # values past float32 become inf, refused just below
        x = np.ascontiguousarray(x, dtype=np.float32)
    n, dim = x.shape
    if dim == 0:
        raise InvalidArgumentError("rows must have dim >= 1, got dim 0")
    if not np.isfinite(x).all():
        raise InvalidArgumentError("rows must be finite float32 values; found NaN, inf or a value "
                                   f"beyond +-{float(np.finfo(np.float32).max):.4g}")
    if fmt == "fp32":
        return x.view(np.uint8).reshape(n, 4 * dim)
    if fmt == "fp16":
        with np.errstate(over="ignore"):
            half = np.ascontiguousarray(x.astype(np.float16))
        big = ~np.isfinite(half)
        if big.any():
            raise InvalidArgumentError(f"rows hold {float(x[big][0])!r}, outside the fp16 range "
                                       f"[-{_FP16_MAX:g}, {_FP16_MAX:g}]")
        return half.view(np.uint8).reshape(n, 2 * dim)
    out = np.empty((n, dim + INT8_TAIL_BYTES), dtype=np.uint8)
    if n == 0:
        return out
    lo = x.min(axis=1)
    hi = x.max(axis=1)
    with np.errstate(over="ignore"):
        span = hi - lo
    if not np.isfinite(span).all():
        r = int(np.argmin(np.isfinite(span)))
        raise InvalidArgumentError(f"row {r} spans [{float(lo[r])!r}, {float(hi[r])!r}]; an int8 row's "
                                   f"max - min must stay within float32 ({float(np.finfo(np.float32).max):.4g})")
    inv_scale = np.float32(255.0) / (span + _INT8_EPS)
    codes = np.rint((x - lo[:, None]) * inv_scale[:, None])
    out[:, :dim] = np.clip(codes, 0, 255).astype(np.uint8)
    tail = out[:, dim:].view(np.float32)  # (n, 2): scale, bias
    tail[:, 0] = span / np.float32(255.0)
    tail[:, 1] = lo
    return out


def dequantize_rows(raw, fmt: str, dim: int) -> np.ndarray:
    """Decode raw rows back to float32.

    Args:
        raw: ``(n, row_bytes(fmt, dim)) uint8`` rows.
        fmt: one of :data:`ROW_FORMATS`.
        dim: values per row.

    Returns:
        ``(n, dim) float32``.
    """
    check_format(fmt)
    dim = check_int(dim, "dim", lo=1)
    raw = np.asarray(raw)
    width = row_bytes(fmt, dim)
    if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] != width:
        raise InvalidArgumentError(
            f"raw rows for {fmt} dim {dim} must be (n, {width}) uint8, "
            f"got {raw.shape} {raw.dtype}"
        )
    raw = np.ascontiguousarray(raw)
    n = raw.shape[0]
    if fmt == "fp32":
        return raw.view(np.float32).reshape(n, dim).copy()
    if fmt == "fp16":
        return raw.view(np.float16).reshape(n, dim).astype(np.float32)
    tail = np.ascontiguousarray(raw[:, dim:]).view(np.float32)
    return raw[:, :dim].astype(np.float32) * tail[:, :1] + tail[:, 1:]


def typed_rows(raw: np.ndarray, fmt: str) -> np.ndarray:
    """View raw ``(n, row_bytes) uint8`` rows as the array the pooling kernels take for
    ``fmt``: float32 or float16 ``(n, dim)``, or the uint8 rows themselves for int8."""
    if fmt == "fp32":
        return raw.view(np.float32)
    if fmt == "fp16":
        return raw.view(np.float16)
    return raw

"""Pooled gather (SparseLengthsSum) kernels.

All cores share one contract and trust their inputs (validated by
:func:`sdm.pooling.embedding_bag`):

* ``table``: ``(n, dim)`` float32 / float16 rows, or ``(n, dim + 8)`` uint8 fused int8 rows.
* ``indices``: ``(nnz,)`` int32 or int64, every value in ``[0, n)``.
* ``offsets``: ``(B + 1,)`` int64 CSR, non-decreasing, ``offsets[0] == 0``, ``offsets[B] == nnz``.
* ``weights``: ``(nnz,)`` float32 per-sample weights; read only when ``weighted``.
* ``mean``: divide each non-empty bag by its length.
* ``out``: ``(B, dim)`` float32, fully overwritten (empty bags -> zeros).
"""

from __future__ import annotations

import numpy as np

from sdm._jit import pjit, prange


@pjit
def bag_float(table, indices, offsets, weights, weighted, mean, out):
    """Pool float32 or float16 rows (float16 is widened to float32 inside the loop)."""
    nbags, dim = out.shape
    for b in prange(nbags):
        start = offsets[b]
        end = offsets[b + 1]
        acc = out[b]
        acc[:] = 0.0
        for k in range(start, end):
            row = table[indices[k]]
            w = weights[k] if weighted else np.float32(1.0)
            for j in range(dim):
                acc[j] += w * np.float32(row[j])
        if mean and end > start:
            inv = np.float32(1.0) / np.float32(end - start)
            for j in range(dim):
                acc[j] *= inv
    return out


@pjit
def bag_int8(table, indices, offsets, weights, weighted, mean, out):
    """Pool fused int8 rows, dequantizing inside the loop: ``sum w * (scale * q + bias)``."""
    nbags, dim = out.shape
    for b in prange(nbags):
        start = offsets[b]
        end = offsets[b + 1]
        acc = out[b]
        acc[:] = 0.0
        for k in range(start, end):
            row = table[indices[k]]
            tail = row[dim:].view(np.float32)
            w = weights[k] if weighted else np.float32(1.0)
            scale = w * tail[0]
            bias = w * tail[1]
            for j in range(dim):
                acc[j] += scale * np.float32(row[j]) + bias
        if mean and end > start:
            inv = np.float32(1.0) / np.float32(end - start)
            for j in range(dim):
                acc[j] *= inv
    return out

"""sdm: software-defined memory for recommendation-model embeddings.

A tiered embedding store (DRAM, emulated SCM, an LMDB SSD tier) with Numba kernels for the
pooled gather and cache policies. See README.md for the two set-up commands and the API.
"""

from sdm import errors
from sdm.devices import DEVICES, DeviceSpec
from sdm.formats import ROW_FORMATS, dequantize_rows, quantize_rows, row_bytes
from sdm.kernels.pooling import embedding_bag
from sdm.policies import POLICIES, SimResult, miss_ratio_curve, simulate
from sdm.store.store import Store, TableSpec
from sdm import trace
from sdm import model

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "errors",
    "DEVICES",
    "DeviceSpec",
    "ROW_FORMATS",
    "quantize_rows",
    "dequantize_rows",
    "row_bytes",
    "embedding_bag",
    "POLICIES",
    "SimResult",
    "simulate",
    "miss_ratio_curve",
    "Store",
    "TableSpec",
    "trace",
    "model",
]

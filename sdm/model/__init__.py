"""PyTorch-free DLRM inference over sdm stores.

``sdm.model.load_npz(path)`` loads the reference fixture layout; ``DLRM.random(preset)``
builds a seeded model of one of ``PRESETS``; ``model.forward(dense_x, sparse,
embeddings=store_or_None)`` returns click probabilities; ``model.to_store(path)`` writes
the model's tables into an :class:`sdm.Store`.
"""

from sdm.model.dlrm import DLRM
from sdm.model.interaction import interact, pair_count
from sdm.model.io import load_npz, save_npz
from sdm.model.mlp import MLP
from sdm.model.preprocess import preprocess_dense
from sdm.model.presets import PRESETS, ModelPreset, get_preset, interaction_width
from sdm.model.profile import Profiler, StageTimes
from sdm.model.sparse import SparseArch

__all__ = [
    "DLRM", "MLP", "SparseArch", "PRESETS", "ModelPreset", "get_preset", "interaction_width",
    "interact", "pair_count", "load_npz", "save_npz", "preprocess_dense", "Profiler",
    "StageTimes",
]

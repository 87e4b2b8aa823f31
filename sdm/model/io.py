"""DLRM weights in the reference fixture's ``.npz`` layout (shared/fixtures/README.md).

Keys: ``config_json`` (a JSON string with ``m_spa``, ``ln_emb``, ``ln_bot``, ``ln_top``,
``op``, ``itself``), ``emb_k (rows_k, m_spa)``, ``bot_w_i (out, in)``, ``bot_b_i (out,)``,
``top_w_i``, ``top_b_i``; all float32. Extra keys (inputs, golden outputs) are ignored.
"""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np

from sdm.errors import ConfigError, InvalidArgumentError
from sdm.model.dlrm import DLRM

__all__ = ["load_npz", "save_npz"]


def load_npz(path, *, overlap: bool = True) -> DLRM:
    """Load a :class:`DLRM` from a reference-layout ``.npz`` file (never unpickles).

    Raises:
        FileNotFoundError: no file at ``path``.
        InvalidArgumentError: not an npz, or a missing or malformed key (named).
        ConfigError: weights whose widths do not fit together.
    """
    path = os.fspath(path)
    try:
        npz = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise InvalidArgumentError(f"{path} is not a readable .npz file: {exc}") from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise InvalidArgumentError(f"{path} holds a single array, not an .npz of DLRM weights")
    with npz:
        keys = set(npz.files)

        def get(key):
            if key not in keys:
                raise InvalidArgumentError(f"{path} has no key {key!r} (keys: {sorted(keys)})")
            try:
                return npz[key]
            except ValueError as exc:  # an object array would need pickle
                raise InvalidArgumentError(f"{path}: key {key!r} cannot be read without pickle: {exc}") from None

        try:
            config = json.loads(str(get("config_json")))
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"{path}: config_json is not JSON: {exc}") from None
        if not isinstance(config, dict):
            raise InvalidArgumentError(f"{path}: config_json must be a JSON object")
        op = config.get("op", "dot")
        itself = bool(config.get("itself", False))
        n_tables = _count(keys, "emb_")
        n_bot = _count(keys, "bot_w_")
        n_top = _count(keys, "top_w_")
        if "ln_emb" in config and not isinstance(config["ln_emb"], list):
            raise InvalidArgumentError(f"{path}: config_json ln_emb must be a list of table sizes, "
                                       f"got {config['ln_emb']!r}")
        if "ln_emb" in config and len(config["ln_emb"]) != n_tables:
            raise InvalidArgumentError(f"{path}: config_json lists {len(config['ln_emb'])} tables "
                                       f"but the file holds {n_tables} emb_k arrays")
        tables = [get(f"emb_{k}") for k in range(n_tables)]
        bw = [get(f"bot_w_{i}") for i in range(n_bot)]
        bb = [get(f"bot_b_{i}") for i in range(n_bot)]
        tw = [get(f"top_w_{i}") for i in range(n_top)]
        tb = [get(f"top_b_{i}") for i in range(n_top)]
    try:
        return DLRM.from_arrays(bw, bb, tw, tb, tables, interaction=op, self_interaction=itself,
                                overlap=overlap)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _count(keys, prefix: str) -> int:
    """Number of consecutive ``prefix0, prefix1, ...`` keys."""
    n = 0
    while f"{prefix}{n}" in keys:
        n += 1
    return n


def save_npz(path, model: DLRM, **extra) -> None:
    """Write ``model`` in the layout :func:`load_npz` reads (tables are materialized for
    it; ``extra`` arrays, e.g. inputs and outputs, are stored beside the weights)."""
    config = {"m_spa": model.sparse.dim, "ln_emb": list(model.sparse.table_sizes),
              "ln_bot": list(model.bottom.widths), "ln_top": list(model.top.widths),
              "op": model.interaction, "itself": model.self_interaction, "source": "sdm.model.save_npz"}
    arrays = {"config_json": np.array(json.dumps(config))}
    for k, t in enumerate(model.sparse.tables):
        arrays[f"emb_{k}"] = t
    for prefix, mlp in (("bot", model.bottom), ("top", model.top)):
        for i, (w, b) in enumerate(zip(mlp.weights, mlp.biases)):
            arrays[f"{prefix}_w_{i}"] = w
            arrays[f"{prefix}_b_{i}"] = b
    clash = sorted(set(arrays) & set(extra))
    if clash:
        raise InvalidArgumentError(f"extra arrays may not reuse weight keys: {clash}")
    arrays.update({k: np.asarray(v) for k, v in extra.items()})
    np.savez(path, **arrays)

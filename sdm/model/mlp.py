"""Fully connected stacks: the dense (bottom) and over (top) arches of DLRM."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sdm.errors import ConfigError
from sdm.validate import check_choice

__all__ = ["MLP", "init_mlp"]

ACTIVATIONS = ("relu", "sigmoid", "none")


class MLP:
    """Layers ``h = act(h @ W.T + b)`` in float32, weights in torch ``Linear`` layout.

    Args:
        weights: per layer ``(out_i, in_i)`` float arrays; ``in_{i+1} == out_i``.
        biases: per layer ``(out_i,)`` float arrays.
        last: activation of the last layer (``relu``, ``sigmoid`` or ``none``); every other
            layer has ReLU, as in the reference DLRM.
        name: used in error messages (``"bottom MLP"``, ``"top MLP"``).

    Raises:
        ConfigError: no layers, mis-shaped weights or biases, or consecutive layers whose
            widths do not chain (the message names both widths).
    """

    def __init__(self, weights: Sequence, biases: Sequence, *, last: str = "relu",
                 name: str = "MLP"):
        check_choice(last, f"{name}: activation", ACTIVATIONS, error=ConfigError)
        if len(weights) == 0:
            raise ConfigError(f"{name} needs at least one layer, got none")
        if len(weights) != len(biases):
            raise ConfigError(f"{name} has {len(weights)} weight matrices but {len(biases)} biases")
        self.name = name
        self.last = last
        self.weights: list[np.ndarray] = []
        self.biases: list[np.ndarray] = []
        for i, (w, b) in enumerate(zip(weights, biases)):
            w = _float32(w, f"{name} layer {i} weight")
            b = _float32(b, f"{name} layer {i} bias")
            if w.ndim != 2 or min(w.shape) < 1:
                raise ConfigError(f"{name} layer {i} weight must be 2-D (out, in), got shape {w.shape}")
            if b.shape != (w.shape[0],):
                raise ConfigError(f"{name} layer {i} bias must have shape ({w.shape[0]},) to match "
                                  f"its weight {w.shape}, got {b.shape}")
            if self.weights and w.shape[1] != self.weights[-1].shape[0]:
                raise ConfigError(f"{name} layer {i} takes {w.shape[1]} inputs but layer {i - 1} "
                                  f"gives {self.weights[-1].shape[0]}")
            self.weights.append(w)
            self.biases.append(b)

    @property
    def in_width(self) -> int:
        return self.weights[0].shape[1]

    @property
    def out_width(self) -> int:
        return self.weights[-1].shape[0]

    @property
    def widths(self) -> tuple[int, ...]:
        """Every width, input first, e.g. ``(13, 512, 256, 64)``."""
        return (self.in_width,) + tuple(w.shape[0] for w in self.weights)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """``(B, in_width)`` float32 -> ``(B, out_width)`` float32 (inputs trusted)."""
        h = x
        n = len(self.weights)
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            # w.T is a transposed view: BLAS reads it as is, nothing is copied.
            h = h @ w.T
            h += b
            act = self.last if i == n - 1 else "relu"
            if act == "relu":
                np.maximum(h, 0.0, out=h)
            elif act == "sigmoid":
                _sigmoid(h)
        return h


def _sigmoid(h: np.ndarray) -> None:
    # exp(-h) overflows to inf for h < -88; 1 / (1 + inf) is the right limit, 0.
    with np.errstate(over="ignore"):
        np.negative(h, out=h)
        np.exp(h, out=h)
        h += 1.0
        np.reciprocal(h, out=h)


def _float32(a, what: str) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype == np.bool_ or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise ConfigError(f"{what} must be numeric, got dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.float32)


def init_mlp(widths: Sequence[int], rng_for_layer, *, last: str, name: str) -> MLP:
    """A randomly initialized MLP over ``widths`` (input first), as the reference DLRM does:
    weights normal with std ``sqrt(2 / (fan_in + fan_out))``, biases normal with std
    ``sqrt(1 / fan_out)``. ``rng_for_layer(i)`` gives layer ``i``'s ``np.random.Generator``."""
    weights, biases = [], []
    for i, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:])):
        rng = rng_for_layer(i)
        weights.append(rng.normal(0.0, np.sqrt(2.0 / (n_in + n_out)), (n_out, n_in)).astype(np.float32))
        biases.append(rng.normal(0.0, np.sqrt(1.0 / n_out), n_out).astype(np.float32))
    return MLP(weights, biases, last=last, name=name)

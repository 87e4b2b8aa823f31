"""Numba kernels: pure functions over arrays, no validation (the public wrappers validate)."""

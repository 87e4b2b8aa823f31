"""Helpers shared by the tests: deterministic table rows, a store with every table written, and
the CPU-model line every bench prints.

pytest puts ``tests/`` on ``sys.path``, and so does running a test module as a script
(``python tests/test_store_fuzz.py ...``), so tests import these as ``from helpers import ...``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np

import sdm


def rows_from(spec: sdm.TableSpec, entropy) -> np.ndarray:
    """``(num_rows, dim) float32`` standard-normal rows of ``spec`` drawn from
    ``np.random.default_rng(entropy)`` (an int or a sequence of ints)."""
    return np.random.default_rng(entropy).standard_normal((spec.num_rows, spec.dim)).astype(np.float32)


def rows_of(spec: sdm.TableSpec, seed: int = 0) -> np.ndarray:
    """The default rows of ``spec``: :func:`rows_from` with entropy ``seed + num_rows``, so
    tables of different sizes in one store differ, and ``seed`` gives another version."""
    return rows_from(spec, seed + spec.num_rows)


def rows_in_turn(seed: int):
    """A ``rows(spec)`` for :func:`write_store` that draws every table, in the order asked,
    from one ``np.random.default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    return lambda spec: rng.standard_normal((spec.num_rows, spec.dim)).astype(np.float32)


def ramp_rows(spec: sdm.TableSpec, modulus: int | None = None) -> np.ndarray:
    """``(num_rows, dim) float32`` rows counting 0, 1, 2, ... in row-major order (modulo
    ``modulus``): row ``r`` starts at ``r * dim``, so a row's bytes can be found in a file."""
    values = np.arange(spec.num_rows * spec.dim, dtype=np.float32)
    if modulus is not None:
        values %= modulus
    return values.reshape(spec.num_rows, spec.dim)


def write_store(path, specs, rows=rows_of, **create):
    """Create a store at ``path`` with ``specs`` (``create``: further ``Store.create``
    arguments) and write every table, in order, with ``rows(spec)``. Returns ``path``."""
    with sdm.Store.create(path, specs, **create) as store:
        for spec in specs:
            store.write_table(spec.name, rows(spec))
    return path


def assert_prints_cpu(out: str) -> None:
    """``out`` (a bench's output) has a ``cpu: <model>`` line (any case) naming this machine's
    CPU as :func:`sdm.load.run.cpu_model` reads it."""
    from sdm.load.run import cpu_model

    found = re.findall(r"^.*\bcpu: (.+)$", out, flags=re.M | re.I)
    assert found, f"no 'cpu: <model>' line in:\n{out[-2000:]}"
    assert any(line.startswith(cpu_model()) for line in found), f"cpu line {found} does not name {cpu_model()!r}"


BENCH = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))


def run_bench(name: str, *args: str, timeout: float = 600) -> str:
    """Run ``bench/<name>.py *args`` in a subprocess (killed after ``timeout`` seconds);
    assert it exits 0; return its stdout."""
    proc = subprocess.run([sys.executable, os.path.join(BENCH, f"{name}.py"), *args],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout

"""What every bench records beside its figures: the CPU model, the core count and the commit.

Not a bench itself; benches import it as ``from machine import ...`` (a script's folder is on
``sys.path``). Its ``cpu: <model>`` line is what the smoke tests look for.
"""

from __future__ import annotations

import os
import subprocess

from sdm.load.run import cpu_model  # the one reader of /proc/cpuinfo's model name

__all__ = ["commit", "cpu_line", "cpu_model", "isa_line"]


def commit() -> str:
    """The repository's short commit, or ``?`` outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10, cwd=os.path.dirname(os.path.abspath(__file__)))
    except (OSError, subprocess.SubprocessError):
        return "?"
    return out.stdout.strip() or "?"


def cpu_line() -> str:
    """``cpu: <model>, <n> cores``: the line every bench prints with its results."""
    return f"cpu: {cpu_model()}, {os.cpu_count()} cores"


def isa_line() -> str:
    """``vector ISA: <widest ISA>, LLVM cpu <name>; gather variant: <lanes>, <prefetch>``: what
    Numba compiles sdm's kernels for, and the tuned gather variant chosen for that CPU."""
    from sdm.kernels.cpu import gather_variant, host_cpu, vector_isa

    v = gather_variant(host_cpu())
    lanes = f"{v['vector_bits']}-bit lanes" if v["vector_bits"] else "LLVM's lanes"
    lines = "every line of a row" if v["prefetch_every_line"] else "first and last line"
    return f"vector ISA: {vector_isa()}; gather variant: {lanes}, prefetch {lines}"

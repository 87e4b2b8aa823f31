"""The CPU the kernels are compiled for, as Numba's LLVM sees it.

Numba compiles for the host (``llvmlite.binding.get_host_cpu_name()`` and its feature
string), so what vector code the kernels get is decided by these, not by ``/proc/cpuinfo``'s
model name (a VM often shows only "AMD EPYC"). Benches print :func:`vector_isa` beside their
figures; the gather kernels read :func:`host_cpu` where a choice depends on the CPU.
"""

from __future__ import annotations

import functools

__all__ = ["HostCpu", "gather_variant", "host_cpu", "vector_isa"]


class HostCpu(tuple):
    """``(name, features)``: LLVM's CPU name (``znver3``, ``sapphirerapids``) and the set of
    features it enables (``{"avx2", "fma", "avx512f", ...}``)."""

    __slots__ = ()

    def __new__(cls, name: str, features: frozenset):
        return super().__new__(cls, (name, frozenset(features)))

    @property
    def name(self) -> str:
        return self[0]

    @property
    def features(self) -> frozenset:
        return self[1]


@functools.lru_cache(maxsize=1)
def host_cpu() -> HostCpu:
    """The :class:`HostCpu` Numba compiles for (read once per process): this host's, or the one
    ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` name, as Numba's own code generator reads them
    (a portable cache built with ``NUMBA_CPU_NAME=generic`` gets the generic variant)."""
    import llvmlite.binding as ll
    from numba.core import config

    name = config.CPU_NAME or ll.get_host_cpu_name()
    feats = config.CPU_FEATURES if config.CPU_FEATURES is not None else ll.get_host_cpu_features()
    on = frozenset(k for k, v in feats.items() if v) if hasattr(feats, "items") else frozenset(
        f[1:] for f in str(feats).split(",") if f.startswith("+"))
    return HostCpu(name, on)


def vector_isa(cpu: HostCpu | None = None) -> str:
    """The widest vector ISA the kernels may use, e.g. ``AVX-512 (512-bit)`` or ``AVX2 + FMA
    (256-bit)``, with LLVM's CPU name: ``AVX2 + FMA (256-bit), LLVM cpu znver3``."""
    cpu = cpu or host_cpu()
    f = cpu.features
    if "avx512f" in f:
        extra = "+".join(x for x in ("bw", "vl", "vnni", "bf16", "fp16") if f"avx512{x}" in f)
        isa = f"AVX-512 (512-bit){' ' + extra if extra else ''}"
    elif "avx2" in f:
        isa = "AVX2" + (" + FMA" if "fma" in f else "") + (" + F16C" if "f16c" in f else "") + " (256-bit)"
    elif "avx" in f:
        isa = "AVX (256-bit)"
    elif "sse4.2" in f:
        isa = "SSE4.2 (128-bit)"
    else:
        isa = "SSE2 (128-bit)"
    return f"{isa}, LLVM cpu {cpu.name}"


# LLVM CPU names whose gather is measurably faster prefetching every line of a row
# (bench/RESULTS.md, issue 19 parts 1 and 4): Zen 3, Zipf ids 0.84-0.92x -> 0.79-0.83x torch's
# time; Ice Lake server, fp32 uniform 1.16x -> 1.06x. On Zen 4 (issue 3) every line was no
# faster than the first and last; other CPUs are unmeasured and keep the first and last line.
_PREFETCH_EVERY_LINE_CPUS = frozenset({"znver3", "icelake-server"})

# LLVM CPU names whose gather gets 512-bit vectors. LLVM tunes every Intel AVX-512 server chip
# to prefer 256-bit ones (its "prefer-256-bit", for Skylake-SP's clock drop on heavy 512-bit
# code), so the column loop of a 64-wide fp32 tile runs on 8 ymm accumulators, not 4 zmm.
# Measured on Ice Lake server: 512-bit lanes took fp32 from 1.06x to 0.99x torch's time
# (uniform ids) and int8 from 0.85x to 0.72x. Sapphire, Emerald and Granite Rapids compile to
# the same 256-bit code (asm of the fp32 core with NUMBA_CPU_NAME set to each: 0 zmm, 569 ymm,
# as Ice Lake had) and downclock little on 512-bit code, so they get the width too; their speed
# with it is unmeasured. Skylake-SP, Cascade Lake and Cooper Lake, whose 512-bit clock drop is
# the reason for LLVM's tuning, keep it. AMD's Zen 4 and 5 already get 512-bit code.
_VECTOR_BITS_512_CPUS = frozenset({"icelake-server", "sapphirerapids", "emeraldrapids",
                                   "graniterapids", "graniterapids-d"})


def gather_variant(cpu: HostCpu) -> dict:
    """The pooled-gather kernels' tuning for ``cpu``: ``{"prefetch_every_line": bool,
    "vector_bits": 512 or None}`` (None: LLVM's own choice for the CPU). Every variant
    computes the same bits (the prefetch hints and the vector width of the column loop, whose
    lanes are independent columns, are all that differ), and each is tested against the
    reference (tests/test_bag.py)."""
    wide = cpu.name in _VECTOR_BITS_512_CPUS and "avx512f" in cpu.features
    return {"prefetch_every_line": cpu.name in _PREFETCH_EVERY_LINE_CPUS,
            "vector_bits": 512 if wide else None}

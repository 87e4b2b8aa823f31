"""Pooled gather (SparseLengthsSum) kernels.

All drivers share one contract and trust their inputs (validated by
:func:`sdm.kernels.pooling.embedding_bag`), except the row ids when asked to ``check`` them:

* ``table``: ``(n, dim)`` float32 rows (:func:`bag_fp32`), ``(n, dim)`` uint16 holding
  IEEE half bits (:func:`bag_fp16`; pass ``float16_table.view(np.uint16)``, Numba has no
  float16 arrays), or ``(n, dim + 8)`` uint8 fused int8 rows (:func:`bag_int8`).
* ``indices``: ``(nnz,)`` int32 or int64, every value in ``[0, n)``.
* ``offsets``: ``(B + 1,)`` int64 CSR, non-decreasing, ``offsets[0] == 0``, ``offsets[B] == nnz``.
* ``weights``: ``(nnz,)`` float32 per-sample weights; read only when ``weighted``.
* ``mean``: divide each non-empty bag by its length.
* ``out``: ``(B, dim)`` float32 C-contiguous, fully overwritten (empty bags -> zeros).
* ``every_line``: the prefetch variant (below); it changes speed only, never the result.
* ``check``: compare each row id with ``n`` before its row is read (negative ids are huge
  once unsigned). An id out of range is read as row 0 and the driver returns True; the caller
  then raises and ``out`` holds no meaningful values. Without ``check`` the ids must be in
  range and the drivers return False. Checking here rather than in a pass of its own costs
  one predictable branch per row group: the separate pass read the ids from memory before
  the gather read them again (3-10% of an fp32 call at 1 thread, up to 25% at 2, measured).

How they are fast (the gather is memory-bound: keep many row loads in flight, keep the
arithmetic and bookkeeping off the critical path):

* Bags are split into one contiguous chunk per thread (``prange`` over chunks, not bags);
  each chunk runs a serial core. One thread, or a small batch, calls the core directly
  (:func:`sdm.kernels.pooling.pool`): a parallel launch costs microseconds.
* A bag is summed into a stack buffer, never into ``out``: LLVM can prove the stack aliases
  nothing, so the column loop vectorizes with no runtime overlap checks. For 64-column tiles
  the width is a compile-time constant, so the loop unrolls and the accumulator lives in vector
  registers for the whole bag (4 zmm for fp32) and ``out`` is written once per bag.
* Rows are taken ``_GROUP`` at a time, so their loads are independent and issue together;
  the sum's order is written out (``(r0 + r1) + (r2 + r3)``, groups in bag order) and kept:
  the kernels' fast-math flags (``_FASTMATH``) leave out ``reassoc`` and ``contract``, so the
  serial core and its copy inlined in the parallel driver round alike and a bag's sum is
  bitwise the same whatever the batch around it (a pooled-embedding cache relies on it).
  The column loop vectorizes without them: its lanes are independent columns.
* A software prefetch (``llvm.prefetch``, an intrinsic below) fetches the row ``_PREFETCH``
  lookups ahead, across bag boundaries, so DRAM latency overlaps the work on current rows:
  its first and last line (:func:`prefetch_row`) or, with ``every_line``, each line of a row
  up to ``_EVERY_LINE_BYTES`` long. The drivers take ``every_line`` as an argument; the caller
  passes the variant :func:`sdm.kernels.cpu.gather_variant` picks for the CPU (every line on
  AMD Zen 3, where it is measurably faster). Prefetches are hints: the sums are the same bits.
* The column loops are vectorized as wide as the CPU's variant asks (``vector_bits``, an
  LLVM function attribute set by :func:`vector_width_hint`): LLVM tunes Intel's AVX-512 server
  chips to prefer 256-bit vectors, and on Ice Lake server a 64-wide fp32 tile summed in 4 zmm
  registers is measurably faster than in 8 ymm (bench/RESULTS.md). The lanes are independent
  columns, so the width never changes a sum's bits.
* fp16 is widened with ``vcvtph2ps`` (an ``fpext`` intrinsic); int8 rows are dequantized in the
  loop as ``sum_k (w_k s_k) q_k`` per column plus the scalar ``sum_k w_k b_k`` once per bag.

The on-disk JIT cache is stamped with a digest of every sdm source file
(:mod:`sdm.kernels.jit`), so an edit here, to a helper elsewhere or to the JIT flags
recompiles these kernels (``bench/bench_compile.py --check-stale`` shows it).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from sdm.kernels.cpu import gather_variant, host_cpu
from sdm.kernels.jit import jit, pjit, prange

# No reassoc / contract: each would let LLVM pick the order of a bag's adds (or fuse them
# into FMAs) differently in each compiled copy of a core, so results would depend on the
# batch size. Measured: no speed difference (bench/bench_gather.py).
_FASTMATH = {"nnan", "ninf", "nsz", "arcp"}
_GROUP = 4  # rows added per pass over the columns (the unrolled body below has 4 slots)
_PREFETCH = 16  # lookups ahead to prefetch; ~ DRAM latency / time per row
# int8 rows (dim + 8 bytes: 72 for dim 64, two lines) take less time each than fp32 ones (256
# bytes, four lines), so the same lines in flight need more rows ahead. Measured, Zipf ids, 1M x
# 64, against torch's byte-rowwise op: Zen 4 0.97x at 16 -> 0.78x at 32; Ice Lake server 32 the
# best of 16-32 (bench/RESULTS.md). Uniform ids are DRAM- and TLB-bound at every distance.
_PREFETCH_INT8 = 32
_TILE = 512  # columns summed per pass; the stack accumulator holds one tile (2 KiB)
_EVERY_LINE_BYTES = 256  # rows up to this long prefetch every line when asked (every_line)
# The vector width this CPU's variant asks of the column loops (None: LLVM's choice). Read at
# import: kernels are compiled for this host, and Numba's disk cache is keyed by its CPU.
_VECTOR_BITS = gather_variant(host_cpu())["vector_bits"]


# -- tiny intrinsics, each with a plain-Python twin so NUMBA_DISABLE_JIT=1 still runs ----------

def prefetch_row(table, row, nbytes):
    """Hint the CPU to fetch ``nbytes`` of ``table[row]`` into cache (a no-op in Python)."""


def half_bits_to_float(h):
    """IEEE half-precision bits (uint16) -> float32."""
    return np.float32(np.array([h], dtype=np.uint16).view(np.float16)[0])


def bits_to_float(u):
    """The float32 whose bits are the low 32 bits of integer ``u``."""
    return np.array([int(u) & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0]


def prefetch_line(table, row, byte):
    """Hint the CPU to fetch the line holding byte ``byte`` of ``table[row]`` (a no-op in Python)."""


@intrinsic
def _prefetch_line(typingctx, table, row, byte):
    if not isinstance(table, types.Array):
        return None

    def codegen(context, builder, sig, args):
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, value=args[0])
        stride0 = cgutils.unpack_tuple(builder, ary.strides)[0]
        intp = context.get_value_type(types.intp)
        r = context.cast(builder, args[1], sig.args[1], types.intp)
        off = builder.add(builder.mul(r, stride0), context.cast(builder, args[2], sig.args[2], types.intp))
        base = builder.ptrtoint(ary.data, intp)
        addr = builder.inttoptr(builder.add(base, off), cgutils.voidptr_t)
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        # read, high temporal locality (keep in all levels), data cache
        builder.call(fn, [addr, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.none(table, row, byte), codegen


def vector_width_hint():
    """Ask LLVM to vectorize the calling kernel's loops :data:`_VECTOR_BITS` wide (a no-op in
    Python, and when the variant leaves the width to LLVM)."""


@intrinsic
def _vector_width_hint(typingctx):
    def codegen(context, builder, sig, args):
        if _VECTOR_BITS:
            # LLVM's "prefer-vector-width" function attribute overrides the CPU's tuning for
            # this function only. llvmlite lists no string attributes, so it is added to the
            # function's attribute set directly; the IR prints it as written.
            set.add(builder.function.attributes, f'"prefer-vector-width"="{_VECTOR_BITS}"')
        return context.get_dummy_value()

    return types.none(), codegen


@overload(vector_width_hint, inline="always")  # inlined: the attribute is the caller's
def _ol_vector_width_hint():
    return lambda: _vector_width_hint()


@intrinsic
def _half_to_float(typingctx, h):
    if h != types.uint16:
        return None

    def codegen(context, builder, sig, args):
        # fpext half -> float becomes vcvtph2ps (F16C) and vectorizes
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(h), codegen


@intrinsic
def _bits_to_float(typingctx, u):
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if u.bitwidth > 32:  # Numba widens uint32 arithmetic to 64 bits; the low word holds them
            v = builder.trunc(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return types.float32(u), codegen


@overload(prefetch_line)
def _ol_prefetch_line(table, row, byte):
    return lambda table, row, byte: _prefetch_line(table, row, byte)


@overload(prefetch_row)
def _ol_prefetch_row(table, row, nbytes):
    # The first and the last line: all of a row up to 128 bytes wherever it starts; longer rows
    # stream on from there (the hardware prefetchers take adjacent lines). Measured: prefetching
    # every line of a 256-byte row is no faster, and a loop over lines costs more than it saves.
    def impl(table, row, nbytes):
        _prefetch_line(table, row, 0)
        _prefetch_line(table, row, nbytes - 1)
    return impl


@jit(inline="always")
def _prefetch_bag_row(table, row, nbytes, every_line):
    """:func:`prefetch_row`, or with ``every_line`` each 64-byte line of a row up to
    ``_EVERY_LINE_BYTES`` long (the row may start anywhere in a line: its last byte too)."""
    if every_line and nbytes <= _EVERY_LINE_BYTES:
        for byte in range(0, nbytes - 1, 64):
            prefetch_line(table, row, byte)
        prefetch_line(table, row, nbytes - 1)
    else:
        prefetch_row(table, row, nbytes)


def stack_f32(n):
    """A ``(n,) float32`` scratch array (on the stack when compiled; ``n`` must be a constant)."""
    return np.empty(n, dtype=np.float32)


@intrinsic
def _stack_f32(typingctx, n):
    if not isinstance(n, types.IntegerLiteral):
        return None
    size = n.literal_value
    arrty = types.Array(types.float32, 1, "C")

    def codegen(context, builder, sig, args):
        # alloca in the entry block: a private buffer LLVM knows aliases nothing else
        buf = cgutils.alloca_once(builder, ir.FloatType(), size=size)
        ary = context.make_array(arrty)(context, builder)
        intp = context.get_value_type(types.intp)
        context.populate_array(ary, data=buf, shape=[intp(size)], strides=[intp(4)],
                               itemsize=intp(4), meminfo=None)
        return ary._getvalue()

    return arrty(n), codegen


@overload(stack_f32)
def _ol_stack_f32(n):
    return lambda n: _stack_f32(n)


@overload(half_bits_to_float)
def _ol_half(h):
    return lambda h: _half_to_float(h)


@overload(bits_to_float)
def _ol_bits(u):
    return lambda u: _bits_to_float(u)


# -- serial cores over bags [b0, b1) ------------------------------------------------------------
# A core walks its bags; for each bag, a tile helper sums the rows' columns [j0, j0 + width)
# into ``acc``, a stack buffer (see :func:`stack_f32`) that LLVM knows aliases nothing, so the
# column loop vectorizes without the runtime overlap checks it would emit per row group when
# summing into ``out`` (those cost as much as the adds for dim 64). Tiles of ``_WIDE`` columns
# have a constant width: the helper is inlined, the column loop fully unrolled and ``acc``
# lives in vector registers for the whole bag (4 zmm for 64 fp32 columns), as in FBGEMM's
# generated code. The rest (dim not a multiple of ``_WIDE``) goes through runtime-width tiles.
# Every index is cast to unsigned (columns, positions in ``indices`` and the row ids read from
# it): Numba wraps negative indices, and a per-lane "if < 0" turns the vector loads into
# gathers when LLVM cannot prove ``j0 + j >= 0``; on positions and row ids the wrap is a
# sign test, a mask and an add per load that sit on the path to each row's address (measured
# on AMD Zen 3: 1.08x -> 0.90x torch's time, uniform ids, 1 thread).
#
# Specialized: a ``_<fmt>_range`` runs its bag loop (``_<fmt>_bags``, inlined) in two copies:
# dim 64 unweighted, and any other case. In the first the width and the flags are constants,
# so the single tile's offset folds away, the weighted branch and the remainder tiles vanish,
# and the loop keeps its pointers in registers instead of reloading them from the stack
# around each row group (the generic copy ran ~10% slower on dim 64). Each copy performs the
# same adds in the same order, so results do not depend on which one ran. A third copy for
# weighted dim 64 was dropped: every copy adds to the cold compile time (one fp32 signature:
# ~5 s with one copy, 14 s with three, 9 s with two, at load ~2).

_WIDE = 64


@jit(inline="always", fastmath=_FASTMATH)
def _fp32_tile(table, indices, weights, weighted, start, end, j0, width, acc, prefetch, every_line, check,
               nnz, row_nbytes):
    for j in range(width):
        acc[j] = 0.0
    nrows = np.uint64(table.shape[0])
    bad = False
    k = start
    while k + _GROUP <= end:
        if prefetch and k + _PREFETCH + _GROUP <= nnz:
            for p in range(_GROUP):
                _prefetch_bag_row(table, indices[np.uint64(k + _PREFETCH + p)], row_nbytes, every_line)
        r0 = np.uint64(indices[np.uint64(k)])
        r1 = np.uint64(indices[np.uint64(k + 1)])
        r2 = np.uint64(indices[np.uint64(k + 2)])
        r3 = np.uint64(indices[np.uint64(k + 3)])
        if check and (r0 >= nrows) | (r1 >= nrows) | (r2 >= nrows) | (r3 >= nrows):
            bad = True  # read row 0 instead; the caller raises
            r0 = r1 = r2 = r3 = np.uint64(0)
        if weighted:
            w0 = weights[np.uint64(k)]
            w1 = weights[np.uint64(k + 1)]
            w2 = weights[np.uint64(k + 2)]
            w3 = weights[np.uint64(k + 3)]
            for j in range(width):
                c = np.uint64(j0 + j)
                acc[j] += (w0 * table[r0, c] + w1 * table[r1, c]) + (w2 * table[r2, c] + w3 * table[r3, c])
        else:
            for j in range(width):
                c = np.uint64(j0 + j)
                acc[j] += (table[r0, c] + table[r1, c]) + (table[r2, c] + table[r3, c])
        k += _GROUP
    while k < end:
        if prefetch and k + _PREFETCH < nnz:
            _prefetch_bag_row(table, indices[np.uint64(k + _PREFETCH)], row_nbytes, every_line)
        r0 = np.uint64(indices[np.uint64(k)])
        if check and r0 >= nrows:
            bad = True
            r0 = np.uint64(0)
        w0 = weights[np.uint64(k)] if weighted else np.float32(1.0)
        for j in range(width):
            acc[j] += w0 * table[r0, np.uint64(j0 + j)]
        k += 1
    return bad


@jit(inline="always", fastmath=_FASTMATH)
def _fp16_tile(table, indices, weights, weighted, start, end, j0, width, acc, prefetch, every_line, check,
               nnz, row_nbytes):
    for j in range(width):
        acc[j] = 0.0
    nrows = np.uint64(table.shape[0])
    bad = False
    k = start
    while k + _GROUP <= end:
        if prefetch and k + _PREFETCH + _GROUP <= nnz:
            for p in range(_GROUP):
                _prefetch_bag_row(table, indices[np.uint64(k + _PREFETCH + p)], row_nbytes, every_line)
        r0 = np.uint64(indices[np.uint64(k)])
        r1 = np.uint64(indices[np.uint64(k + 1)])
        r2 = np.uint64(indices[np.uint64(k + 2)])
        r3 = np.uint64(indices[np.uint64(k + 3)])
        if check and (r0 >= nrows) | (r1 >= nrows) | (r2 >= nrows) | (r3 >= nrows):
            bad = True  # read row 0 instead; the caller raises
            r0 = r1 = r2 = r3 = np.uint64(0)
        if weighted:
            w0 = weights[np.uint64(k)]
            w1 = weights[np.uint64(k + 1)]
            w2 = weights[np.uint64(k + 2)]
            w3 = weights[np.uint64(k + 3)]
            for j in range(width):
                c = np.uint64(j0 + j)
                acc[j] += (w0 * half_bits_to_float(table[r0, c]) + w1 * half_bits_to_float(table[r1, c])) + (
                    w2 * half_bits_to_float(table[r2, c]) + w3 * half_bits_to_float(table[r3, c]))
        else:
            for j in range(width):
                c = np.uint64(j0 + j)
                acc[j] += (half_bits_to_float(table[r0, c]) + half_bits_to_float(table[r1, c])) + (
                    half_bits_to_float(table[r2, c]) + half_bits_to_float(table[r3, c]))
        k += _GROUP
    while k < end:
        if prefetch and k + _PREFETCH < nnz:
            _prefetch_bag_row(table, indices[np.uint64(k + _PREFETCH)], row_nbytes, every_line)
        r0 = np.uint64(indices[np.uint64(k)])
        if check and r0 >= nrows:
            bad = True
            r0 = np.uint64(0)
        w0 = weights[np.uint64(k)] if weighted else np.float32(1.0)
        for j in range(width):
            acc[j] += w0 * half_bits_to_float(table[r0, np.uint64(j0 + j)])
        k += 1
    return bad


@jit(inline="always")
def _int8_scale_bias(table, r, dim):
    """(scale, bias) float32 of fused row ``r``: the 8 bytes after its ``dim`` codes."""
    s = (np.uint32(table[r, np.uint64(dim)]) | (np.uint32(table[r, np.uint64(dim + 1)]) << np.uint32(8))
         | (np.uint32(table[r, np.uint64(dim + 2)]) << np.uint32(16))
         | (np.uint32(table[r, np.uint64(dim + 3)]) << np.uint32(24)))
    c = (np.uint32(table[r, np.uint64(dim + 4)]) | (np.uint32(table[r, np.uint64(dim + 5)]) << np.uint32(8))
         | (np.uint32(table[r, np.uint64(dim + 6)]) << np.uint32(16))
         | (np.uint32(table[r, np.uint64(dim + 7)]) << np.uint32(24)))
    return bits_to_float(s), bits_to_float(c)


@jit(inline="always", fastmath=_FASTMATH)
def _int8_tile(table, indices, weights, weighted, start, end, j0, width, acc, prefetch, every_line, check, nnz,
               dim):
    """Sum ``(w s) q`` over the bag into ``acc``; return ``sum w * bias`` (same for every column)
    and whether an id was out of range (``check``)."""
    for j in range(width):
        acc[j] = 0.0
    nrows = np.uint64(table.shape[0])
    bad = False
    bias = np.float32(0.0)
    row_nbytes = dim + 8
    k = start
    while k + _GROUP <= end:
        if prefetch and k + _PREFETCH_INT8 + _GROUP <= nnz:
            for p in range(_GROUP):
                _prefetch_bag_row(table, indices[np.uint64(k + _PREFETCH_INT8 + p)], row_nbytes, every_line)
        r0 = np.uint64(indices[np.uint64(k)])
        r1 = np.uint64(indices[np.uint64(k + 1)])
        r2 = np.uint64(indices[np.uint64(k + 2)])
        r3 = np.uint64(indices[np.uint64(k + 3)])
        if check and (r0 >= nrows) | (r1 >= nrows) | (r2 >= nrows) | (r3 >= nrows):
            bad = True  # read row 0 instead; the caller raises
            r0 = r1 = r2 = r3 = np.uint64(0)
        s0, c0 = _int8_scale_bias(table, r0, dim)
        s1, c1 = _int8_scale_bias(table, r1, dim)
        s2, c2 = _int8_scale_bias(table, r2, dim)
        s3, c3 = _int8_scale_bias(table, r3, dim)
        if weighted:
            w0 = weights[np.uint64(k)]
            w1 = weights[np.uint64(k + 1)]
            w2 = weights[np.uint64(k + 2)]
            w3 = weights[np.uint64(k + 3)]
            s0 *= w0
            s1 *= w1
            s2 *= w2
            s3 *= w3
            c0 *= w0
            c1 *= w1
            c2 *= w2
            c3 *= w3
        bias += (c0 + c1) + (c2 + c3)
        for j in range(width):
            c = np.uint64(j0 + j)
            acc[j] += (s0 * np.float32(table[r0, c]) + s1 * np.float32(table[r1, c])) + (
                s2 * np.float32(table[r2, c]) + s3 * np.float32(table[r3, c]))
        k += _GROUP
    while k < end:
        if prefetch and k + _PREFETCH_INT8 < nnz:
            _prefetch_bag_row(table, indices[np.uint64(k + _PREFETCH_INT8)], row_nbytes, every_line)
        r0 = np.uint64(indices[np.uint64(k)])
        if check and r0 >= nrows:
            bad = True
            r0 = np.uint64(0)
        s0, c0 = _int8_scale_bias(table, r0, dim)
        if weighted:
            s0 *= weights[np.uint64(k)]
            c0 *= weights[np.uint64(k)]
        bias += c0
        for j in range(width):
            acc[j] += s0 * np.float32(table[r0, np.uint64(j0 + j)])
        k += 1
    return bias, bad


@jit(fastmath=_FASTMATH)
def _fp32_range(table, indices, offsets, weights, weighted, mean, out, b0, b1, every_line, check):
    dim = out.shape[1]
    vector_width_hint()
    if dim == _WIDE and not weighted:  # width and flags as constants: see "Specialized" above
        return _fp32_bags(table, indices, offsets, weights, False, mean, out, b0, b1, _WIDE, every_line, check)
    else:
        return _fp32_bags(table, indices, offsets, weights, weighted, mean, out, b0, b1, dim, every_line, check)


@jit(inline="always", fastmath=_FASTMATH)
def _fp32_bags(table, indices, offsets, weights, weighted, mean, out, b0, b1, dim, every_line, check):
    nnz = offsets[offsets.shape[0] - 1]
    bad = False
    row_nbytes = dim * 4
    wide = stack_f32(_WIDE)  # only constant indices after unrolling: promoted to registers
    acc = stack_f32(_TILE)
    for b in range(b0, b1):
        start = offsets[b]
        end = offsets[b + 1]
        inv = np.float32(1.0) / np.float32(end - start) if mean and end > start else np.float32(1.0)
        j0 = 0
        while j0 + _WIDE <= dim:
            bad |= _fp32_tile(table, indices, weights, weighted, start, end, j0, _WIDE, wide, j0 == 0,
                               every_line, check, nnz, row_nbytes)
            for j in range(_WIDE):
                out[b, np.uint64(j0 + j)] = wide[j] * inv
            j0 += _WIDE
        while j0 < dim:
            jn = min(_TILE, dim - j0)
            bad |= _fp32_tile(table, indices, weights, weighted, start, end, j0, jn, acc, j0 == 0, every_line,
                               check, nnz, row_nbytes)
            for j in range(jn):
                out[b, np.uint64(j0 + j)] = acc[j] * inv
            j0 += jn
    return bad


@jit(fastmath=_FASTMATH)
def _fp16_range(table, indices, offsets, weights, weighted, mean, out, b0, b1, every_line, check):
    dim = out.shape[1]
    vector_width_hint()
    if dim == _WIDE and not weighted:  # width and flags as constants: see "Specialized" above
        return _fp16_bags(table, indices, offsets, weights, False, mean, out, b0, b1, _WIDE, every_line, check)
    else:
        return _fp16_bags(table, indices, offsets, weights, weighted, mean, out, b0, b1, dim, every_line, check)


@jit(inline="always", fastmath=_FASTMATH)
def _fp16_bags(table, indices, offsets, weights, weighted, mean, out, b0, b1, dim, every_line, check):
    nnz = offsets[offsets.shape[0] - 1]
    bad = False
    row_nbytes = dim * 2
    wide = stack_f32(_WIDE)
    acc = stack_f32(_TILE)
    for b in range(b0, b1):
        start = offsets[b]
        end = offsets[b + 1]
        inv = np.float32(1.0) / np.float32(end - start) if mean and end > start else np.float32(1.0)
        j0 = 0
        while j0 + _WIDE <= dim:
            bad |= _fp16_tile(table, indices, weights, weighted, start, end, j0, _WIDE, wide, j0 == 0,
                               every_line, check, nnz, row_nbytes)
            for j in range(_WIDE):
                out[b, np.uint64(j0 + j)] = wide[j] * inv
            j0 += _WIDE
        while j0 < dim:
            jn = min(_TILE, dim - j0)
            bad |= _fp16_tile(table, indices, weights, weighted, start, end, j0, jn, acc, j0 == 0, every_line,
                               check, nnz, row_nbytes)
            for j in range(jn):
                out[b, np.uint64(j0 + j)] = acc[j] * inv
            j0 += jn
    return bad


@jit(fastmath=_FASTMATH)
def _int8_range(table, indices, offsets, weights, weighted, mean, out, b0, b1, every_line, check):
    dim = out.shape[1]
    vector_width_hint()
    if dim == _WIDE and not weighted:  # width and flags as constants: see "Specialized" above
        return _int8_bags(table, indices, offsets, weights, False, mean, out, b0, b1, _WIDE, every_line, check)
    else:
        return _int8_bags(table, indices, offsets, weights, weighted, mean, out, b0, b1, dim, every_line, check)


@jit(inline="always", fastmath=_FASTMATH)
def _int8_bags(table, indices, offsets, weights, weighted, mean, out, b0, b1, dim, every_line, check):
    nnz = offsets[offsets.shape[0] - 1]
    bad = False
    wide = stack_f32(_WIDE)
    acc = stack_f32(_TILE)
    for b in range(b0, b1):
        start = offsets[b]
        end = offsets[b + 1]
        inv = np.float32(1.0) / np.float32(end - start) if mean and end > start else np.float32(1.0)
        j0 = 0
        while j0 + _WIDE <= dim:
            bias, bad_tile = _int8_tile(table, indices, weights, weighted, start, end, j0, _WIDE, wide, j0 == 0,
                                        every_line, check, nnz, dim)
            bad |= bad_tile
            for j in range(_WIDE):
                out[b, np.uint64(j0 + j)] = (wide[j] + bias) * inv
            j0 += _WIDE
        while j0 < dim:
            jn = min(_TILE, dim - j0)
            bias, bad_tile = _int8_tile(table, indices, weights, weighted, start, end, j0, jn, acc, j0 == 0,
                                        every_line, check, nnz, dim)
            bad |= bad_tile
            for j in range(jn):
                out[b, np.uint64(j0 + j)] = (acc[j] + bias) * inv
            j0 += jn
    return bad


@jit
def offsets_valid(offsets, nnz):
    """True when ``offsets`` is CSR over ``nnz`` ids: starts at 0, non-decreasing, ends at
    ``nnz``."""
    nb = offsets.shape[0]
    if nb == 0 or offsets[0] != 0 or offsets[nb - 1] != nnz:
        return False
    dec = False
    for b in range(nb - 1):
        dec |= offsets[b + 1] < offsets[b]
    return not dec


@jit
def bags_valid(indices, offsets, num_rows):
    """True when ``offsets`` is CSR over ``indices`` (starts at 0, non-decreasing, ends at
    ``len(indices)``) and every index is in ``[0, num_rows)``: the whole check in one pass,
    cheaper than the numpy checks that name the culprit (the wrapper runs those on False)."""
    if not offsets_valid(offsets, indices.shape[0]):
        return False
    bad = False
    for i in range(indices.shape[0]):  # branch-free so it vectorizes
        v = indices[i]
        bad |= (v < 0) | (v >= num_rows)
    return not bad


# -- parallel drivers: one contiguous chunk of bags per thread ----------------------------------
# ``nthreads`` comes from the caller (``numba.get_num_threads()``): calling that inside a kernel
# embeds a ctypes pointer, which makes the kernel uncacheable.

@pjit
def bag_fp32(table, indices, offsets, weights, weighted, mean, out, every_line, check, nthreads):
    """Pool float32 rows; see the module docstring for the contract.
    Returns whether an id was out of range (with ``check``)."""
    nbags = out.shape[0]
    nchunks = max(1, min(nthreads, nbags))
    nbad = 0
    for c in prange(nchunks):
        nbad += _fp32_range(table, indices, offsets, weights, weighted, mean, out,
                            c * nbags // nchunks, (c + 1) * nbags // nchunks, every_line, check)
    return nbad > 0


@pjit
def bag_fp16(table, indices, offsets, weights, weighted, mean, out, every_line, check, nthreads):
    """Pool half rows given as ``(n, dim)`` uint16 bits, widened to float32 in the loop.
    Returns whether an id was out of range (with ``check``)."""
    nbags = out.shape[0]
    nchunks = max(1, min(nthreads, nbags))
    nbad = 0
    for c in prange(nchunks):
        nbad += _fp16_range(table, indices, offsets, weights, weighted, mean, out,
                            c * nbags // nchunks, (c + 1) * nbags // nchunks, every_line, check)
    return nbad > 0


@pjit
def bag_int8(table, indices, offsets, weights, weighted, mean, out, every_line, check, nthreads):
    """Pool fused int8 rows ``(n, dim + 8) uint8``, dequantized inside the loop.
    Returns whether an id was out of range (with ``check``)."""
    nbags = out.shape[0]
    nchunks = max(1, min(nthreads, nbags))
    nbad = 0
    for c in prange(nchunks):
        nbad += _int8_range(table, indices, offsets, weights, weighted, mean, out,
                            c * nbags // nchunks, (c + 1) * nbags // nchunks, every_line, check)
    return nbad > 0

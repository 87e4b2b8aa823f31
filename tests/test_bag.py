"""sdm.embedding_bag against a naive loop reference (hypothesis) and against torch."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time

import numba
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import peers
import sdm
from sdm.errors import IdOutOfRangeError, InvalidArgumentError, InvalidOffsetsError
from sdm.kernels import pooling
from sdm.kernels.cpu import host_cpu
from sdm.kernels.pooling import pool

SENTINEL = np.float32(-12345.5)


@contextlib.contextmanager
def prefetch_variant(every_line: bool):
    """Run the kernels' ``every_line`` prefetch variant, whichever this CPU would choose."""
    before = pooling.PREFETCH_EVERY_LINE
    pooling.PREFETCH_EVERY_LINE = every_line
    try:
        yield
    finally:
        pooling.PREFETCH_EVERY_LINE = before


class Rows(np.ndarray):
    """Decoded float32 rows; ``.mag`` is the size of each value's terms for the tolerance (for
    int8 ``|scale * q| + |bias|``: the kernel sums those two parts separately)."""


def make_table(rng, n, dim, fmt):
    """(table as embedding_bag takes it, float32 rows it decodes to, with ``.mag``)."""
    x = rng.standard_normal((n, dim)).astype(np.float32)
    raw = sdm.quantize_rows(x, fmt)
    if fmt == "fp32":
        table = x
    elif fmt == "fp16":
        table = x.astype(np.float16)
    else:
        table = raw
    rows = sdm.dequantize_rows(raw, fmt, dim).view(Rows)
    rows.mag = np.abs(rows).astype(np.float64)
    if fmt == "int8":
        sb = raw[:, dim:].copy().view(np.float32)
        rows.mag = np.abs(raw[:, :dim] * sb[:, :1].astype(np.float64)) + np.abs(sb[:, 1:])
    return table, rows


def reference_bag(rows, ids, offsets, weights, mode):
    """Loop reference in float64, plus the sum of |terms| per bag to scale the tolerance."""
    nbags = len(offsets) - 1
    dim = rows.shape[1]
    out = np.zeros((nbags, dim))
    mag = np.zeros((nbags, dim))
    for b in range(nbags):
        n = offsets[b + 1] - offsets[b]
        for k in range(offsets[b], offsets[b + 1]):
            w = 1.0 if weights is None else float(weights[k])
            out[b] += w * np.asarray(rows[ids[k]], dtype=np.float64)
            mag[b] += abs(w) * getattr(rows, "mag", np.abs(rows))[ids[k]]
        if mode == "mean" and n:
            out[b] /= n
            mag[b] /= n
    return out, mag


def assert_close(got, ref, mag):
    # fastmath pooling reassociates sums: allow a few float32 ulps of the magnitude summed
    err = np.abs(got.astype(np.float64) - ref)
    bound = 4e-6 * mag + 1e-6
    assert (err <= bound).all(), f"max error {err.max()} over bound at {np.unravel_index(np.argmax(err - bound), err.shape)}"


@st.composite
def bag_cases(draw):
    fmt = draw(st.sampled_from(sdm.ROW_FORMATS))
    n = draw(st.integers(1, 40))
    dim = draw(st.sampled_from([1, 2, 3, 4, 5, 8, 13, 16, 17, 31, 64, 65, 100, 128]))
    lens = draw(st.lists(st.integers(0, 13), min_size=0, max_size=12))
    nnz = sum(lens)
    # a small id alphabet makes repeated ids within a bag common
    ids = draw(st.lists(st.integers(0, n - 1), min_size=nnz, max_size=nnz))
    return dict(
        fmt=fmt, n=n, dim=dim, lens=lens, ids=ids,
        idx_dtype=draw(st.sampled_from([np.int32, np.int64])),
        mode=draw(st.sampled_from(["sum", "mean"])),
        weighted=draw(st.booleans()),
        every_line=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@given(bag_cases())
def test_matches_reference(case):
    rng = np.random.default_rng(case["seed"])
    table, rows = make_table(rng, case["n"], case["dim"], case["fmt"])
    offsets = np.concatenate([[0], np.cumsum(case["lens"], dtype=np.int64)]).astype(np.int64)
    ids = np.asarray(case["ids"], dtype=case["idx_dtype"])
    weights = rng.uniform(-2, 2, len(ids)).astype(np.float32) if case["weighted"] else None
    nbags = len(case["lens"])
    table_before = table.copy()

    # write through a view of a bigger buffer: nothing may land past the output
    buf = np.full((nbags + 3, case["dim"]), SENTINEL, dtype=np.float32)
    with prefetch_variant(case["every_line"]):
        got = sdm.embedding_bag(table, ids, offsets, fmt=case["fmt"], mode=case["mode"],
                                per_sample_weights=weights, out=buf[:nbags])
    ref, mag = reference_bag(rows, ids, offsets, weights, case["mode"])
    assert got.shape == (nbags, case["dim"]) and got.dtype == np.float32
    assert_close(got, ref, mag)
    assert (buf[nbags:] == SENTINEL).all()
    assert np.array_equal(table, table_before)
    for b, length in enumerate(case["lens"]):
        if length == 0:
            assert (got[b] == 0).all()

    # the allocating path agrees bit for bit with the out= path
    again = sdm.embedding_bag(table, ids, offsets, fmt=case["fmt"], mode=case["mode"],
                              per_sample_weights=weights)
    assert np.array_equal(again, got)


@pytest.mark.parametrize("fmt", sdm.ROW_FORMATS)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("every_line", [False, True])
def test_large_batch_all_threads(fmt, threads, every_line, monkeypatch):
    """Many bags over several chunks, prefetch running ahead across bag boundaries."""
    monkeypatch.setattr(pooling, "SERIAL_BELOW_LOOKUPS", 0)  # the parallel driver, at any wait policy
    rng = np.random.default_rng(7)
    table, rows = make_table(rng, 5000, 64, fmt)
    lens = rng.integers(0, 40, 701)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    ids = rng.integers(0, 5000, offsets[-1])
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        with prefetch_variant(every_line):
            got = sdm.embedding_bag(table, ids, offsets, fmt=fmt)
    finally:
        numba.set_num_threads(before)
    ref, mag = reference_bag(rows, ids, offsets, None, "sum")
    assert_close(got, ref, mag)


@pytest.mark.parametrize("fmt", sdm.ROW_FORMATS)
@pytest.mark.parametrize("weighted", [False, True])
def test_wide_rows_span_column_tiles(fmt, weighted):
    """dim above the kernels' 512-column accumulator tile: summed tile by tile."""
    rng = np.random.default_rng(9)
    table, rows = make_table(rng, 50, 1100, fmt)
    offsets = np.array([0, 0, 7, 20, 21], dtype=np.int64)
    ids = rng.integers(0, 50, 21)
    w = rng.uniform(-1, 1, 21).astype(np.float32) if weighted else None
    got = sdm.embedding_bag(table, ids, offsets, fmt=fmt, mode="mean", per_sample_weights=w)
    ref, mag = reference_bag(rows, ids, offsets, w, "mean")
    assert_close(got, ref, mag)


def test_no_bags_and_no_lookups():
    table = np.ones((3, 4), dtype=np.float32)
    assert sdm.embedding_bag(table, np.empty(0, np.int64), np.array([0])).shape == (0, 4)
    got = sdm.embedding_bag(table, [], np.zeros(5, np.int64))
    assert got.shape == (4, 4) and (got == 0).all()


def test_pool_fast_path_matches_wrapper():
    rng = np.random.default_rng(3)
    table, _ = make_table(rng, 100, 16, "int8")
    ids = rng.integers(0, 100, 50).astype(np.int32)
    offsets = np.array([0, 10, 10, 50], dtype=np.int64)
    out = np.empty((3, 16), dtype=np.float32)
    got = pool(table, ids, offsets, None, True, "int8", out)
    assert got is out
    assert np.array_equal(out, sdm.embedding_bag(table, ids, offsets, fmt="int8", mode="mean"))


# -- validation ----------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [10, 11, 2**40, -1, -7])
def test_out_of_range_id_is_named(bad):
    table = np.zeros((10, 4), dtype=np.float32)
    ids = np.array([0, bad, 3], dtype=np.int64)
    with pytest.raises(IdOutOfRangeError, match=str(bad)):
        sdm.embedding_bag(table, ids, np.array([0, 3]))
    assert issubclass(IdOutOfRangeError, IndexError)


@pytest.mark.parametrize("offsets, match", [
    ([1, 3], "offsets\\[0\\] must be 0"),
    ([0, 2], "offsets\\[-1\\] must equal len\\(indices\\) = 3"),
    ([0, 2, 1, 3], "non-decreasing"),
    ([], "B \\+ 1 >= 1"),
    ([[0, 3]], "1-D"),
    ([0.0, 3.0], "integer"),
])
def test_bad_offsets(offsets, match):
    table = np.zeros((10, 4), dtype=np.float32)
    with pytest.raises(InvalidOffsetsError, match=match):
        sdm.embedding_bag(table, np.array([1, 2, 3]), np.asarray(offsets))


def test_bad_arguments():
    table = np.zeros((10, 4), dtype=np.float32)
    ids = np.array([1, 2, 3])
    off = np.array([0, 3])
    with pytest.raises(InvalidArgumentError, match="mode 'max'"):
        sdm.embedding_bag(table, ids, off, mode="max")
    with pytest.raises(InvalidArgumentError, match=r"per_sample_weights must have shape \(3,\)"):
        sdm.embedding_bag(table, ids, off, per_sample_weights=np.ones(2))
    with pytest.raises(InvalidArgumentError, match="float16"):
        sdm.embedding_bag(table, ids, off, fmt="fp16")
    with pytest.raises(InvalidArgumentError, match="12 bytes per row"):
        sdm.embedding_bag(np.zeros((10, 13), np.uint8), ids, off, fmt="int8", dim=4)
    with pytest.raises(InvalidArgumentError, match="integer dtype"):
        sdm.embedding_bag(table, np.array([1.0, 2.0, 3.0]), off)
    with pytest.raises(InvalidArgumentError, match=r"C-contiguous \(1, 4\) float32"):
        sdm.embedding_bag(table, ids, off, out=np.zeros((1, 4), np.float64))
    with pytest.raises(InvalidArgumentError, match="row format"):
        sdm.embedding_bag(table, ids, off, fmt="bf16")


# -- the GIL is released -------------------------------------------------------------------------

def test_kernel_releases_the_gil():
    """A Python thread counting in a loop keeps counting during one long kernel call."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((200_000, 64), dtype=np.float32)
    ids = rng.integers(0, 200_000, 3_000_000).astype(np.int32)
    offsets = np.arange(0, 3_000_001, 30, dtype=np.int64)
    sdm.embedding_bag(table, ids[:30], offsets[:2])  # compile / load outside the timed call

    count = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    before = numba.get_num_threads()
    numba.set_num_threads(1)  # leave a core for the counting thread
    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        time.sleep(0.02)
        r0 = count[0]
        time.sleep(0.1)
        rate = (count[0] - r0) / 0.1  # counts per second with the main thread idle
        c0 = count[0]
        t0 = time.perf_counter()
        sdm.embedding_bag(table, ids, offsets)
        elapsed = time.perf_counter() - t0
        during = count[0] - c0
    finally:
        stop.set()
        spinner.join()
        numba.set_num_threads(before)
    assert elapsed > 0.02, "call too short to tell"
    # With the GIL held the counter moves only for one switch interval (5 ms) before the call
    # starts: measured 4 % of its idle rate over a 114 ms call, against ~100 % without the GIL.
    assert during > 0.25 * rate * elapsed, (
        f"counter moved {during} times during a {elapsed * 1e3:.0f} ms call "
        f"(idle rate {rate:.0f}/s)")


# -- against torch (an independent implementation: FBGEMM) ---------------------------------------

# torch takes per-sample weights with mode="sum" only
@pytest.mark.parametrize("mode, weighted", [("sum", False), ("sum", True), ("mean", False)])
@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
@pytest.mark.peers
def test_fp32_against_torch(mode, weighted, idx_dtype):
    torch = peers.require("torch")
    rng = np.random.default_rng(11)
    table = rng.standard_normal((1000, 24)).astype(np.float32)
    lens = rng.integers(0, 30, 200)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    ids = rng.integers(0, 1000, offsets[-1]).astype(idx_dtype)
    w = rng.uniform(0, 2, len(ids)).astype(np.float32) if weighted else None
    want = torch.nn.functional.embedding_bag(
        torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(table), torch.from_numpy(offsets),
        mode=mode, include_last_offset=True,
        per_sample_weights=None if w is None else torch.from_numpy(w)).numpy()
    got = sdm.embedding_bag(table, ids, offsets, mode=mode, per_sample_weights=w)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.peers
def test_int8_against_torch_byte_rowwise(weighted):
    torch = peers.require("torch")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((500, 32)).astype(np.float32)
    packed = torch.ops.quantized.embedding_bag_byte_prepack(torch.from_numpy(x))
    lens = rng.integers(0, 25, 150)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    ids = rng.integers(0, 500, offsets[-1])
    w = rng.uniform(0, 2, len(ids)).astype(np.float32) if weighted else None
    want = torch.ops.quantized.embedding_bag_byte_rowwise_offsets(
        packed, torch.from_numpy(ids), torch.from_numpy(offsets), False, 0, False,
        None if w is None else torch.from_numpy(w), None, True).numpy()
    # sdm reads torch's prepacked bytes directly: the layouts are the same
    got = sdm.embedding_bag(packed.numpy(), ids, offsets, fmt="int8", per_sample_weights=w)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("fmt", sdm.ROW_FORMATS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dim", [16, 64, 100])
def test_a_bag_pools_bitwise_alike_in_any_batch(fmt, weighted, dim, monkeypatch):
    # A big batch runs the parallel driver (2+ threads); one bag alone runs the serial core.
    # A pooled-embedding cache pools its misses as a smaller batch, so the two must agree
    # to the bit, not within a tolerance.
    monkeypatch.setattr(pooling, "SERIAL_BELOW_LOOKUPS", 64)  # the big batch parallel, one bag serial
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((1000, dim)).astype(np.float32)
    table = sdm.formats.typed_rows(sdm.quantize_rows(rows, fmt), fmt)
    lengths = rng.integers(0, 40, 300)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    indices = rng.integers(0, 1000, int(offsets[-1]))
    weights = rng.random(len(indices), dtype=np.float32) if weighted else None
    big = sdm.embedding_bag(table, indices, offsets, fmt=fmt, dim=dim, per_sample_weights=weights)
    for b in range(0, 300, 7):
        a, e = offsets[b], offsets[b + 1]
        one = sdm.embedding_bag(table, indices[a:e], np.array([0, e - a]), fmt=fmt, dim=dim,
                                per_sample_weights=None if weights is None else weights[a:e])
        np.testing.assert_array_equal(one[0], big[b])


@given(fmt=st.sampled_from(sdm.ROW_FORMATS), weighted=st.booleans(), mode=st.sampled_from(["sum", "mean"]),
       lens=st.lists(st.integers(0, 11), min_size=1, max_size=9), seed=st.integers(0, 2**31 - 1))
def test_dim_64_copy_rounds_like_the_generic_one(fmt, weighted, mode, lens, seed):
    # dim 64 unweighted runs its own compiled copy of the bag loop (width and flags constant);
    # dim 128 runs the generic one, tile by tile. The first 64 columns of a dim-128 table pool
    # to the same bits.
    rng = np.random.default_rng(seed)
    wide = rng.standard_normal((50, 128)).astype(np.float32)
    narrow = np.ascontiguousarray(wide[:, :64])
    if fmt == "int8":  # the scale and bias come from the whole row: quantize the narrow rows, pad
        t64 = sdm.quantize_rows(narrow, "int8")
        codes = np.concatenate([t64[:, :64], t64[:, :64]], axis=1)
        t128 = np.concatenate([codes, t64[:, 64:]], axis=1)
    else:
        t64 = sdm.formats.typed_rows(sdm.quantize_rows(narrow, fmt), fmt)
        t128 = sdm.formats.typed_rows(sdm.quantize_rows(wide, fmt), fmt)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    ids = rng.integers(0, 50, int(offsets[-1]))
    w = rng.uniform(-2, 2, len(ids)).astype(np.float32) if weighted else None
    a = sdm.embedding_bag(t64, ids, offsets, fmt=fmt, dim=64, mode=mode, per_sample_weights=w)
    b = sdm.embedding_bag(t128, ids, offsets, fmt=fmt, dim=128, mode=mode, per_sample_weights=w)
    np.testing.assert_array_equal(a.view(np.uint32), b[:, :64].view(np.uint32))


@given(fmt=st.sampled_from(sdm.ROW_FORMATS), dim=st.sampled_from([1, 3, 16, 17, 64, 65, 128]),
       weighted=st.booleans(), mean=st.booleans(), threads=st.sampled_from([1, 2]),
       lens=st.lists(st.integers(0, 60), min_size=1, max_size=80), seed=st.integers(0, 2**31 - 1))
def test_prefetch_variants_pool_the_same_bits(fmt, dim, weighted, mean, threads, lens, seed):
    # The CPU-chosen variants differ in prefetch hints only (sdm.kernels.cpu.gather_variant).
    rng = np.random.default_rng(seed)
    table, _ = make_table(rng, 300, dim, fmt)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    ids = rng.integers(0, 300, int(offsets[-1]))
    w = rng.uniform(-2, 2, len(ids)).astype(np.float32) if weighted else None
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        a, b = [pool(table, ids, offsets, w, mean, fmt, np.empty((len(lens), dim), np.float32),
                     every_line=e) for e in (False, True)]
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_gather_variant_is_chosen_from_the_cpu():
    from sdm.kernels.cpu import HostCpu, gather_variant, vector_isa
    assert gather_variant(HostCpu("znver3", {"avx2", "fma"})) == {"prefetch_every_line": True, "vector_bits": None}
    assert gather_variant(HostCpu("icelake-server", {"avx2", "avx512f"})) == {"prefetch_every_line": True,
                                                                              "vector_bits": 512}
    assert gather_variant(HostCpu("icelake-server", {"avx2"}))["vector_bits"] is None  # AVX-512 off
    assert gather_variant(HostCpu("emeraldrapids", {"avx512f"})) == {"prefetch_every_line": False,
                                                                     "vector_bits": 512}
    assert gather_variant(HostCpu("cascadelake", {"avx512f"}))["vector_bits"] is None  # its clock drop
    assert gather_variant(HostCpu("znver4", {"avx512f"}))["vector_bits"] is None  # LLVM picks 512 itself
    assert pooling.PREFETCH_EVERY_LINE == gather_variant(host_cpu())["prefetch_every_line"]
    assert vector_isa(HostCpu("znver3", {"avx", "avx2", "fma"})).startswith("AVX2 + FMA (256-bit)")
    assert vector_isa(HostCpu("x", {"avx512f", "avx512bw"})).startswith("AVX-512 (512-bit) bw")


_ASM_OF_THE_FP32_CORE = """
import re, numpy as np, sdm
from sdm.kernels import bag
from sdm.kernels.cpu import gather_variant, host_cpu
t = np.ones((100, 64), np.float32)
sdm.embedding_bag(t, np.arange(40) % 100, np.arange(0, 41, 20), fmt="fp32", dim=64)
asm = "".join(bag._fp32_range.inspect_asm().values())
print(host_cpu().name, gather_variant(host_cpu())["vector_bits"],
      len(re.findall(r"%zmm[0-9]", asm)), len(re.findall(r"%ymm[0-9]", asm)))
"""


@pytest.mark.skipif("avx512f" not in host_cpu().features, reason="runs AVX-512 code compiled for an Intel server CPU")
def test_intel_server_cpus_get_512_bit_gather_code(tmp_path):
    """LLVM tunes Intel's AVX-512 server chips to 256-bit vectors. Compiled for Emerald Rapids
    (``NUMBA_CPU_NAME``, which the variant reads as Numba does), the fp32 core asks for 512 and
    its asm sums in zmm registers; on Zen 4 this is the code LLVM picks by itself."""
    env = dict(os.environ, NUMBA_CPU_NAME="emeraldrapids", NUMBA_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", _ASM_OF_THE_FP32_CORE], env=env, capture_output=True,
                         text=True, timeout=600, check=True).stdout.split()
    name, bits, zmm, ymm = out[0], out[1], int(out[2]), int(out[3])
    assert (name, bits) == ("emeraldrapids", "512")
    assert zmm > 100 and zmm > ymm, (zmm, ymm)


@pytest.mark.parametrize("fmt", ["fp32", "int8"])
@pytest.mark.parametrize("bits", [256, 512])
def test_vector_width_variants_pool_the_same_bits(monkeypatch, fmt, bits):
    """A bag core compiled afresh with each vector width the CPU variants may ask for (on a
    CPU without AVX-512, LLVM narrows 512 to what it has) pools the same bits as this host's,
    which the reference tests check; the width reaches LLVM as the function's attribute."""
    from sdm.kernels import bag
    monkeypatch.setattr(bag, "_VECTOR_BITS", bits)
    core = getattr(bag, f"_{fmt}_range")
    fresh = numba.njit(nogil=True, fastmath=bag._FASTMATH)(core.py_func)
    rng = np.random.default_rng(bits)
    for dim, weighted, mean in [(64, False, False), (64, True, True), (65, False, True), (130, True, False)]:
        table, _ = make_table(rng, 500, dim, fmt)
        lens = rng.integers(0, 40, 50)
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        ids = rng.integers(0, 500, int(offsets[-1]))
        w = rng.uniform(-2, 2, len(ids)).astype(np.float32) if weighted else pooling._NO_WEIGHTS
        a, b = [np.empty((len(lens), dim), np.float32) for _ in range(2)]
        for kernel, out in ((core, a), (fresh, b)):
            kernel(table, ids, offsets, w, weighted, mean, out, 0, len(lens), bits == 512, False)
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32), err_msg=f"dim {dim}")
    ir = next(iter(fresh.inspect_llvm().values()))
    assert f'"prefer-vector-width"="{bits}"' in ir


@given(fmt=st.sampled_from(sdm.ROW_FORMATS), dim=st.sampled_from([1, 5, 64, 100]),
       idx_dtype=st.sampled_from([np.int32, np.int64]), threads=st.sampled_from([1, 2]),
       weighted=st.booleans(), n=st.integers(1, 30),
       lens=st.lists(st.integers(0, 40), min_size=1, max_size=60), data=st.data())
def test_kernel_id_check_raises_exactly_when_an_id_is_out_of_range(fmt, dim, idx_dtype, threads, weighted,
                                                                    n, lens, data):
    # embedding_bag leaves the range check of plain int32/int64 ids to the kernel (check=True):
    # it must raise naming a bad id, never read past the table, and otherwise pool the same bits
    # as the trusted path (check=False).
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    table, _ = make_table(rng, n, dim, fmt)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    nnz = int(offsets[-1])
    lo, hi = np.iinfo(idx_dtype).min, np.iinfo(idx_dtype).max
    bad_values = st.one_of(st.integers(n, hi), st.integers(lo, -1))
    ids = rng.integers(0, n, nnz).astype(idx_dtype)
    for pos in data.draw(st.lists(st.integers(0, max(nnz - 1, 0)), max_size=3 if nnz else 0)):
        ids[pos] = data.draw(bad_values)
    w = rng.uniform(-2, 2, nnz).astype(np.float32) if weighted else None
    bad = ((ids < 0) | (ids >= n)).any()
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        if bad:
            named = int(ids.min()) if ids.min() < 0 else int(ids.max())  # as check_ids names it
            with pytest.raises(IdOutOfRangeError, match=f"index {named} is"):
                sdm.embedding_bag(table, ids, offsets, fmt=fmt, dim=dim, per_sample_weights=w)
        else:
            got = sdm.embedding_bag(table, ids, offsets, fmt=fmt, dim=dim, per_sample_weights=w)
            want = pool(table, ids, offsets, w, False, fmt, np.empty_like(got))
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    finally:
        numba.set_num_threads(before)


def test_kernel_id_check_on_an_empty_table():
    table = np.zeros((0, 4), dtype=np.float32)
    assert sdm.embedding_bag(table, np.empty(0, np.int64), np.array([0, 0])).shape == (1, 4)
    with pytest.raises(IdOutOfRangeError, match="0"):
        sdm.embedding_bag(table, np.array([0], np.int64), np.array([0, 1]))

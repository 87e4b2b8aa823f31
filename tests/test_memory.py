"""Arrays in transparent huge pages (sdm.kernels.memory): same contents as numpy's, and the
pages really are advised where the machine allows it."""

from __future__ import annotations

import mmap
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from sdm.kernels.memory import HUGE_PAGE_BYTES, huge_empty, huge_full, huge_pages_wanted, huge_zeros

BIG = (HUGE_PAGE_BYTES // 8 + 3,)  # just over one huge page of int64


@pytest.mark.parametrize("shape, dtype", [(BIG, np.int64), ((1000, 72), np.uint8), ((5,), np.int32),
                                          ((HUGE_PAGE_BYTES // 64 + 1, 64), np.uint8), ((0,), np.int64)])
def test_contents_shape_and_dtype_match_numpy(shape, dtype):
    z = huge_zeros(shape, dtype)
    assert z.shape == shape and z.dtype == dtype and z.flags.c_contiguous and z.flags.writeable
    assert not z.any()
    fill = np.iinfo(dtype).max  # all bits set: not zero-filled memory by chance
    f = huge_full(shape, fill, dtype)
    np.testing.assert_array_equal(f, np.full(shape, fill, dtype=dtype))
    e = huge_empty(shape, dtype)
    e[...] = 7
    np.testing.assert_array_equal(e, np.full(shape, 7, dtype=dtype))


def test_large_arrays_are_mapped_small_ones_are_numpy():
    assert isinstance(huge_zeros((10,), np.int64).base, (type(None), np.ndarray))
    big = huge_zeros(BIG, np.int64)
    if huge_pages_wanted():
        root = big
        while isinstance(root, (np.ndarray, memoryview)):
            root = root.obj if isinstance(root, memoryview) else root.base
        assert isinstance(root, mmap.mmap)


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("SDM_HUGE_PAGES", "0")
    assert not huge_pages_wanted()
    big = huge_full(BIG, 3, np.int64)
    assert big.base is None and (big == 3).all()


def test_the_array_outlives_its_other_references():
    a = huge_full(BIG, 5, np.int64)[10:20]  # a view: the mapping lives while it does
    import gc
    gc.collect()
    assert (a == 5).all()


_THP = "/sys/kernel/mm/transparent_hugepage/enabled"


@pytest.mark.skipif(not (os.path.exists(_THP) and "[never]" not in open(_THP).read()),
                    reason="transparent huge pages are off on this machine")
def test_touched_pages_are_huge_where_the_kernel_allows():
    """In a fresh process (this one's memory is fragmented by the suite), a 16 MiB array's
    smaps entry shows AnonHugePages once written."""
    code = (
        "import re, numpy as np\n"
        "from sdm.kernels.memory import huge_zeros\n"
        "a = huge_zeros((16 << 20,), np.uint8); a[:] = 1\n"
        "p = a.ctypes.data; cur = False\n"
        "for line in open('/proc/self/smaps'):\n"
        "    m = re.match(r'([0-9a-f]+)-([0-9a-f]+) ', line)\n"
        "    if m: cur = int(m.group(1), 16) <= p < int(m.group(2), 16)\n"
        "    elif cur and line.startswith('AnonHugePages'): print(line.split()[1])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    kb = int(re.findall(r"\d+", out.stdout)[0])
    # the kernel may lack free 2 MiB frames; at least one huge page shows it advised
    assert kb >= HUGE_PAGE_BYTES // 1024, out.stdout

"""A structural check of an LMDB data file's B-trees before LMDB is trusted to walk them.

LMDB (0.9.36) refuses a page number past its last page, but not a value that runs past it: a
leaf node whose damaged size makes its overflow pages extend beyond the end of ``data.mdb``
makes the next read of it touch a mapped page with no file behind it, and the process dies
of SIGBUS. Checksums on values cannot help (the fault comes first), so when a store opens,
the live trees (the main DB and the free-page DB of a read snapshot's meta page) are walked
here, checking every page number, page header, node bound and value extent against the
file. A bad one is reported as damage instead of a crash. The caller holds a read
transaction for the walk, so no writer reuses the snapshot's pages meanwhile.
Only the tree pages are read (branch and leaf pages, ~1-2% of a store of 4 KiB blocks), never
the overflow pages that hold the rows: a reference to them is checked to lie inside the
file, and what they hold is the values' checksums' business.

:func:`check_tree` walks in a Numba kernel over a read-only map of the file's first
``last_pgno + 1`` pages (the caller has checked the file holds them), ~5 ns a node; the
reference walk (:func:`check_tree_reference`: recursive, ``pread`` per page, obviously
following the format) is what tests compare it with.

The on-disk layout is LMDB 0.9's (lmdb.h / mdb.c, 64-bit): a 16-byte page header
``(pgno u64, pad u16, flags u16, lower u16, upper u16)`` (an overflow page keeps its page
count as a u32 at offset 12), a ``u16`` node offset per entry after it, and 8-byte node
headers ``(lo u16, hi u16, flags u16, key size u16)``; a branch node's child is
``lo | hi << 16 | flags << 32``, a leaf node's data size is ``lo | hi << 16``, and a leaf
node flagged ``F_BIGDATA`` holds the u64 number of its first overflow page as its data; the
free-page DB's values are page-number lists ``(count u64, pgno u64 * count)``.
"""

from __future__ import annotations

import os
import struct

import numpy as np

from sdm.kernels.jit import jit

__all__ = ["check_tree", "check_tree_reference", "TreeDamage", "MetaGone"]

_PAGE = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper
_PAGE_HEADER = 16
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, key size
_NODE_HEADER = 8
_PGNO = struct.Struct("<Q")
# the meta page: after the page header, magic and version, then two MDB_db records
_META = struct.Struct("<II")
_MAGIC = 0xBEEFC0DE
_DB_ROOT_AT = (16 + 24 + 40, 16 + 24 + 48 + 40)  # md_root of FREE_DBI, MAIN_DBI
_LAST_PG_AT = 16 + 24 + 2 * 48
_TXNID_AT = _LAST_PG_AT + 8
_INVALID = 2**64 - 1  # an empty tree's root

P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x20
FREE_DBI, MAIN_DBI = 0, 1
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
_MAX_DEPTH = 64


class TreeDamage(Exception):
    """What is wrong with the file's trees (internal: the caller names the file)."""


class MetaGone(TreeDamage):
    """Neither meta page names the transaction asked for: damage, or (when a writer may be
    running) a meta page a later commit has overwritten; the caller can retry on a newer
    snapshot."""


def check_tree(path: str, psize: int, txnid: int) -> None:
    """Walk the trees of the meta page of transaction ``txnid`` in the LMDB data file at
    ``path`` (page size ``psize``), raising :class:`TreeDamage` at a page number, page
    header or node that does not fit the file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        walk = _Walk(fd, psize)
        roots = walk.roots(txnid)
    finally:
        os.close(fd)
    if not roots:
        return
    pages = np.memmap(path, dtype=np.uint8, mode="r", shape=(walk.limit * psize,))
    try:
        info = np.zeros(4, dtype=np.int64)
        for root, free in roots:
            code = _walk(pages, psize, walk.limit, root, free, _MAX_DEPTH, info)
            if code:
                raise TreeDamage(_message(code, info, psize, walk.limit))
    finally:
        del pages


def check_tree_reference(path: str, psize: int, txnid: int) -> None:
    """:func:`check_tree`, recursively in Python with a ``pread`` per page (the reference)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        walk = _Walk(fd, psize)
        for root, free in walk.roots(txnid):
            walk.tree(root, 0, free)
    finally:
        os.close(fd)


class _Walk:
    def __init__(self, fd: int, psize: int):
        self.fd = fd
        self.psize = psize
        self.pages = os.fstat(fd).st_size // psize
        self.seen: set[int] = set()

    def page(self, pgno: int) -> bytes:
        if not 0 <= pgno < self.limit:
            raise TreeDamage(f"page number {pgno} is outside the file's {self.limit} pages")
        raw = os.pread(self.fd, self.psize, pgno * self.psize)
        if len(raw) != self.psize:
            raise TreeDamage(f"page {pgno} reads short: {len(raw)} bytes")
        return raw

    def roots(self, txnid: int) -> list[tuple[int, bool]]:
        """``(root page, is the free-page DB)`` of the live trees; sets ``limit``."""
        self.limit = min(self.pages, 2)
        metas = [self.page(0), self.page(1)]
        meta = next((m for m in metas if _META.unpack_from(m, 16)[0] == _MAGIC
                     and _PGNO.unpack_from(m, _TXNID_AT)[0] == txnid), None)
        if meta is None:
            raise MetaGone(f"no meta page holds transaction {txnid}")
        last = _PGNO.unpack_from(meta, _LAST_PG_AT)[0]
        if last >= self.pages:
            raise TreeDamage(f"the meta page's last page {last} is past the file's {self.pages} pages")
        self.limit = last + 1
        out = []
        for dbi, at in enumerate(_DB_ROOT_AT):
            root = _PGNO.unpack_from(meta, at)[0]
            if root != _INVALID:
                if root >= self.limit:
                    raise TreeDamage(f"page number {root} is outside the file's {self.limit} pages")
                out.append((root, dbi == FREE_DBI))
        return out

    def tree(self, pgno: int, depth: int, free: bool) -> None:
        if depth > _MAX_DEPTH:
            raise TreeDamage(f"tree deeper than {_MAX_DEPTH} at page {pgno}")
        if pgno in self.seen:
            raise TreeDamage(f"page {pgno} is reached twice")
        self.seen.add(pgno)
        raw = self.page(pgno)
        own, _, flags, lower, upper = _PAGE.unpack_from(raw)
        if own != pgno:
            raise TreeDamage(f"page {pgno} names itself page {own}")
        kind = flags & (P_BRANCH | P_LEAF | P_OVERFLOW | P_META | P_LEAF2)
        if kind not in (P_BRANCH, P_LEAF):
            raise TreeDamage(f"page {pgno} has flags {flags:#x}, not a branch or leaf page")
        if not _PAGE_HEADER <= lower <= upper <= self.psize or lower % 2:
            raise TreeDamage(f"page {pgno} has bounds lower {lower} upper {upper}")
        for i in range((lower - _PAGE_HEADER) // 2):
            at = struct.unpack_from("<H", raw, _PAGE_HEADER + 2 * i)[0]
            if not upper <= at <= self.psize - _NODE_HEADER:
                raise TreeDamage(f"page {pgno} node {i} at offset {at} is outside [{upper}, {self.psize})")
            lo, hi, nflags, ksize = _NODE.unpack_from(raw, at)
            end = at + _NODE_HEADER + ksize
            if kind == P_BRANCH:
                if end > self.psize:
                    raise TreeDamage(f"page {pgno} node {i} key runs past the page")
                self.tree(lo | hi << 16 | nflags << 32, depth + 1, free)
                continue
            size = lo | hi << 16
            if nflags & (F_SUBDATA | F_DUPDATA):
                raise TreeDamage(f"page {pgno} node {i} has flags {nflags:#x}; this store keeps none")
            if nflags & F_BIGDATA:
                if end + 8 > self.psize:
                    raise TreeDamage(f"page {pgno} node {i} overflow reference runs past the page")
                first = _PGNO.unpack_from(raw, end)[0]
                need = -(-(size + _PAGE_HEADER) // self.psize)
                if first + need > self.limit:
                    raise TreeDamage(f"page {pgno} node {i} refers to {need} overflow pages from page "
                                     f"{first}, past the file's {self.limit} pages")
                if free:  # a long free list: its page numbers are not read here
                    continue
            elif end + size > self.psize:
                raise TreeDamage(f"page {pgno} node {i} data runs past the page")
            elif free:
                self.free_list(raw[end:end + size], pgno)

    def free_list(self, data: bytes, parent: int) -> None:
        """A free-page DB value: pages a writer will reuse must lie inside the file."""
        ids = np.frombuffer(data, dtype="<u8", count=len(data) // 8)
        if len(data) % 8 or not len(ids) or ids[0] != len(ids) - 1:
            raise TreeDamage(f"page {parent} holds a free list of {len(data)} bytes that is not a "
                             f"count and that many page numbers")
        if len(ids) > 1 and ids[1:].max() >= self.limit:
            raise TreeDamage(f"page {parent} lists free page {int(ids[1:].max())}, past the file's "
                             f"{self.limit} pages")


# -- the kernel ---------------------------------------------------------------------------

(_OK, _DEEP, _OUTSIDE, _TWICE, _SELF, _FLAGS, _BOUNDS, _NODE_AT, _KEY, _NODE_FLAGS, _REF,
 _OVERFLOW, _DATA, _FREE_LIST, _FREE_PAGE, _WIDE) = range(16)


def _message(code: int, info: np.ndarray, psize: int, limit: int) -> str:
    pg, a, b, c = (int(x) for x in info)
    return {
        _DEEP: f"tree deeper than {_MAX_DEPTH} at page {pg}",
        _OUTSIDE: f"page number {pg} is outside the file's {limit} pages",
        _TWICE: f"page {pg} is reached twice",
        _SELF: f"page {pg} names itself page {a}",
        _FLAGS: f"page {pg} has flags {a:#x}, not a branch or leaf page",
        _BOUNDS: f"page {pg} has bounds lower {a} upper {b}",
        _NODE_AT: f"page {pg} node {a} at offset {b} is outside [{c}, {psize})",
        _KEY: f"page {pg} node {a} key runs past the page",
        _NODE_FLAGS: f"page {pg} node {a} has flags {b:#x}; this store keeps none",
        _REF: f"page {pg} node {a} overflow reference runs past the page",
        _OVERFLOW: f"page {pg} node {a} refers to {b} overflow pages from page {c}, past the file's "
                   f"{limit} pages",
        _DATA: f"page {pg} node {a} data runs past the page",
        _FREE_LIST: f"page {pg} holds a free list of {a} bytes that is not a count and that many "
                    f"page numbers",
        _FREE_PAGE: f"page {pg} lists free page {a}, past the file's {limit} pages",
        _WIDE: f"tree wider than the walk's stack at page {pg}",
    }[code]


@jit(inline="always")
def _u16(buf, at):
    return np.int64(buf[at]) | np.int64(buf[at + 1]) << 8


@jit(inline="always")
def _u64(buf, at):
    """A little-endian u64 as int64 (values past 2**63 come out negative)."""
    v = np.int64(0)
    for k in range(8):
        v |= np.int64(buf[at + k]) << (8 * k)
    return v


@jit
def _walk(buf, psize, limit, root, free, max_depth, info):
    """Depth-first walk of the tree at page ``root`` in ``buf`` (the file's first ``limit``
    pages); returns 0 or an error code with its details in ``info`` (page, a, b, c)."""
    cap = (max_depth + 1) * (psize // 2) + 1
    stack = np.empty(cap, dtype=np.int64)
    depths = np.empty(cap, dtype=np.int64)
    seen = np.zeros((limit + 7) // 8, dtype=np.uint8)
    stack[0] = root
    depths[0] = 0
    top = 1
    while top > 0:
        top -= 1
        pg = stack[top]
        depth = depths[top]
        info[0] = pg
        if depth > max_depth:
            return _DEEP
        if pg < 0 or pg >= limit:
            return _OUTSIDE
        if seen[pg >> 3] & (1 << (pg & 7)):
            return _TWICE
        seen[pg >> 3] |= np.uint8(1 << (pg & 7))
        base = pg * psize
        own = _u64(buf, base)
        if own != pg:
            info[1] = own
            return _SELF
        flags = _u16(buf, base + 10)
        kind = flags & (P_BRANCH | P_LEAF | P_OVERFLOW | P_META | P_LEAF2)
        if kind != P_BRANCH and kind != P_LEAF:
            info[1] = flags
            return _FLAGS
        lower = _u16(buf, base + 12)
        upper = _u16(buf, base + 14)
        if not (16 <= lower <= upper <= psize) or lower % 2:
            info[1] = lower
            info[2] = upper
            return _BOUNDS
        for i in range((lower - 16) // 2):
            info[1] = i
            at = _u16(buf, base + 16 + 2 * i)
            if not (upper <= at <= psize - 8):
                info[2] = at
                info[3] = upper
                return _NODE_AT
            node = base + at
            lo = _u16(buf, node)
            hi = _u16(buf, node + 2)
            nflags = _u16(buf, node + 4)
            end = at + 8 + _u16(buf, node + 6)
            if kind == P_BRANCH:
                if end > psize:
                    return _KEY
                if top >= cap:
                    return _WIDE
                stack[top] = lo | hi << 16 | nflags << 32
                depths[top] = depth + 1
                top += 1
                continue
            size = lo | hi << 16
            if nflags & (F_SUBDATA | F_DUPDATA):
                info[2] = nflags
                return _NODE_FLAGS
            if nflags & F_BIGDATA:
                if end + 8 > psize:
                    return _REF
                first = _u64(buf, base + end)
                need = (size + 16 + psize - 1) // psize
                if first < 0 or first > limit - need:  # not first + need: it may wrap
                    info[2] = need
                    info[3] = first
                    return _OVERFLOW
                continue
            if end + size > psize:
                return _DATA
            if free:
                count = _u64(buf, base + end) if size >= 8 else -1
                if size % 8 or size < 8 or count != size // 8 - 1:
                    info[1] = size
                    return _FREE_LIST
                for k in range(count):
                    id_ = _u64(buf, base + end + 8 + 8 * k)
                    if id_ < 0 or id_ >= limit:
                        info[1] = id_
                        return _FREE_PAGE
    return _OK

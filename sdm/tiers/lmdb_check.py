"""A structural check of an LMDB data file's B-trees before LMDB is trusted to walk them.

LMDB follows page numbers it finds on disk without bounds checks: a damaged branch entry or
overflow reference that points past the end of ``data.mdb`` makes the next read touch a
mapped page with no file behind it, and the process dies of SIGBUS. Checksums on values
cannot help (the fault comes first), so when a store opens, the live trees (the main DB and
the free-page DB of the current meta page) are walked here with plain ``pread``s, checking
every page number, page header and node bounds against the file. A bad one is reported as
damage instead of a crash. Only the tree pages are read (branch and leaf pages, ~1-2% of a
store of 4 KiB blocks), never the overflow pages that hold the rows: a reference to them is
checked to lie inside the file, and what they hold is the values' checksums' business.

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

__all__ = ["check_tree", "TreeDamage"]

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


def check_tree(path: str, psize: int, txnid: int) -> None:
    """Walk the trees of the meta page of transaction ``txnid`` in the LMDB data file at
    ``path`` (page size ``psize``), raising :class:`TreeDamage` at the first page number,
    page header or node that does not fit the file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        _Walk(fd, psize).run(txnid)
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

    def run(self, txnid: int) -> None:
        self.limit = min(self.pages, 2)
        metas = [self.page(0), self.page(1)]
        meta = next((m for m in metas if _META.unpack_from(m, 16)[0] == _MAGIC
                     and _PGNO.unpack_from(m, _TXNID_AT)[0] == txnid), None)
        if meta is None:
            raise TreeDamage(f"no meta page holds transaction {txnid}")
        last = _PGNO.unpack_from(meta, _LAST_PG_AT)[0]
        if last >= self.pages:
            raise TreeDamage(f"the meta page's last page {last} is past the file's {self.pages} pages")
        self.limit = last + 1
        for dbi, at in enumerate(_DB_ROOT_AT):
            root = _PGNO.unpack_from(meta, at)[0]
            if root != _INVALID:
                self.tree(root, 0, dbi == FREE_DBI)

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

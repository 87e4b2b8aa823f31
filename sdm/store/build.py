"""Stores made whole from a source, and what a store directory holds: create, info, verify.

* :func:`build_store` writes seeded rows of given table sizes (a trace's tables, a DLRM
  preset's), the store every replay builds for a trace;
* :func:`create_from_arrays` writes the 2-D arrays of ``.npy`` / ``.npz`` files, one table
  each;
* :func:`store_info` describes a store from its manifest, :func:`verify_store` reads every
  LMDB block and checks its checksum.

A store made here appears whole or not at all: it is written under a hidden sibling name
and renamed into place once every table is written, so bad input or a kill leaves nothing.
"""

from __future__ import annotations

import math
import os
import shutil
import uuid
import zipfile

import numpy as np

from sdm.errors import CorruptStoreError, InvalidArgumentError, StoreExistsError, StoreNotFoundError
from sdm.formats import check_dim, check_format, row_bytes
from sdm.store.store import Store, TableSpec
from sdm.tiers.lmdb import RowDB
from sdm.tiers.manifest import MANIFEST_NAME, Manifest

__all__ = ["table_names", "seeded_rows", "store_bytes", "check_space", "build_store", "create_from_arrays",
           "store_info", "verify_store"]

_ROWS_PER_CHUNK = 1 << 16


def table_names(num_tables: int) -> list[str]:
    """Names of the tables a store built for a trace holds: ``emb_0 ...`` (the DLRM's
    default names)."""
    return [f"emb_{t}" for t in range(num_tables)]


def seeded_rows(num_rows: int, dim: int, seed: int, table: int):
    """Deterministic ``(k, dim)`` float32 chunks, uniform in ``+-sqrt(1 / num_rows)``; each
    chunk has its own generator, so rows do not depend on the chunking."""
    bound = np.float32(math.sqrt(1.0 / num_rows))
    for start in range(0, num_rows, _ROWS_PER_CHUNK):
        rng = np.random.default_rng([seed, table, start // _ROWS_PER_CHUNK])
        block = rng.random((min(_ROWS_PER_CHUNK, num_rows - start), dim), dtype=np.float32)
        block *= 2 * bound
        block -= bound
        yield block


def store_bytes(table_sizes, dim: int, fmt: str) -> int:
    """Bytes of the rows of tables of ``table_sizes`` rows of ``dim`` in ``fmt``."""
    return int(np.sum(np.asarray(table_sizes, dtype=np.int64))) * row_bytes(fmt, int(dim))


def check_space(directory, need: int, *, hint: str = "") -> None:
    """InvalidArgumentError unless ``directory``'s file system has ``need`` bytes free."""
    free = shutil.disk_usage(directory).free
    if need > free:
        raise InvalidArgumentError(f"a store of about {need / 2**30:.1f} GiB does not fit: {directory} "
                                   f"has {free / 2**30:.1f} GiB free" + (f"; {hint}" if hint else ""))


def _parent(path) -> str:
    path = os.path.abspath(os.fspath(path))
    if os.path.lexists(path):
        raise StoreExistsError(f"cannot create a store at {path}: it already exists")
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise StoreNotFoundError(f"cannot create a store at {path}: {parent} is not a directory")
    return parent


def _atomically(path, specs, fill) -> str:
    """Create a store of ``specs`` under a hidden sibling of ``path``, run ``fill(store)``,
    and rename it to ``path``; on any failure nothing stays behind."""
    parent = _parent(path)
    path = os.path.abspath(os.fspath(path))
    tmp = os.path.join(parent, f".{os.path.basename(path)}.building-{uuid.uuid4().hex[:12]}")
    try:
        with Store.create(tmp, specs) as store:
            fill(store)
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def build_store(path, table_sizes, *, dim: int = 64, fmt: str = "fp32", seed: int = 0,
                progress: bool | None = None) -> str:
    """Create a store at ``path`` with one table ``emb_t`` of ``table_sizes[t]`` rows of
    ``dim`` per entry, filled with :func:`seeded_rows`. Returns the path."""
    dim, fmt = check_dim(dim), check_format(fmt)
    specs = [TableSpec(n, int(rows), dim, fmt) for n, rows in zip(table_names(len(table_sizes)), table_sizes)]
    check_space(_parent(path), store_bytes(table_sizes, dim, fmt))

    def fill(store):
        for t, spec in enumerate(specs):
            store.write_table(spec.name, seeded_rows(spec.num_rows, spec.dim, seed, t), progress=progress)

    return _atomically(path, specs, fill)


def _arrays(files) -> list[tuple[str, str, str | None]]:
    """``(table name, file, npz member or None)`` per array of ``files``: a ``.npy`` is one
    table named for its file, a ``.npz`` one table per member, named for the member."""
    out = []
    for f in files:
        f = os.fspath(f)
        if not os.path.isfile(f):
            raise InvalidArgumentError(f"array file {f!r} does not exist")
        stem, ext = os.path.splitext(os.path.basename(f))
        if ext == ".npy":
            out.append((stem, f, None))
        elif ext == ".npz":
            try:
                with np.load(f, allow_pickle=False) as z:
                    out += [(m, f, m) for m in z.files]
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
                raise InvalidArgumentError(f"{f!r} is not a readable .npz archive ({exc})") from None
        else:
            raise InvalidArgumentError(f"array file {f!r} must end in .npy or .npz")
    return out


def _open_array(f: str, member: str | None) -> np.ndarray:
    try:
        if member is None:
            return np.load(f, mmap_mode="r", allow_pickle=False)  # rows stream from the file
        with np.load(f, allow_pickle=False) as z:
            return z[member]
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        where = f if member is None else f"{f}[{member!r}]"
        raise InvalidArgumentError(f"{where} is not a numpy array file without pickles ({exc})") from None


def create_from_arrays(path, files, *, fmt: str = "fp32", progress: bool | None = None) -> str:
    """Create a store at ``path`` with a table per 2-D float array of ``files`` (``.npy``:
    named for the file; ``.npz``: one per member, named for it), rows encoded in ``fmt``.

    Raises:
        InvalidArgumentError: a file that is missing, not an array file, not 2-D float, or
            holds non-finite rows; two arrays of one name. Nothing is written.
        StoreExistsError: ``path`` exists.
    """
    fmt = check_format(fmt)
    found = _arrays(files)
    if not found:
        raise InvalidArgumentError("no arrays given: pass .npy or .npz files")
    specs, seen = [], {}
    for name, f, member in found:
        if name in seen:
            raise InvalidArgumentError(f"two arrays would be table {name!r}: {seen[name]} and {f}")
        seen[name] = f
        a = _open_array(f, member)
        if a.ndim != 2 or not np.issubdtype(a.dtype, np.floating):
            raise InvalidArgumentError(f"array {name!r} of {f} must be 2-D float rows (num_rows, dim), "
                                       f"got shape {a.shape} dtype {a.dtype}")
        specs.append(TableSpec(name, a.shape[0], check_dim(a.shape[1], f"dim of array {name!r}"), fmt))
    check_space(_parent(path), sum(s.num_rows * s.row_bytes for s in specs))

    def fill(store):
        for spec, (_, f, member) in zip(specs, found):
            store.write_table(spec.name, _open_array(f, member), progress=progress)

    return _atomically(path, specs, fill)


def _disk_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(path) for f in names)


def _manifest(path) -> tuple[str, Manifest]:
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(os.path.join(path, MANIFEST_NAME)):
        raise StoreNotFoundError(f"no sdm store at {path} ({MANIFEST_NAME} not found)")
    return path, Manifest.read(path)


def store_info(path) -> dict:
    """What the manifest of the store at ``path`` says: ``tables`` (name, num_rows, dim,
    fmt, row_bytes, rows_per_block, blocks, written), ``rows``, ``row_bytes_total`` (bytes
    of rows), ``disk_bytes`` (every file of the directory), ``version`` (updates applied)."""
    path, manifest = _manifest(path)
    db = RowDB(path, readonly=True)
    try:
        version = db.version()
    finally:
        db.close()
    tables = [{"name": t.name, "num_rows": t.spec.num_rows, "dim": t.spec.dim, "fmt": t.spec.fmt,
               "row_bytes": t.spec.row_bytes, "rows_per_block": t.rows_per_block,
               "blocks": t.num_blocks, "written": t.generation is not None} for t in manifest.tables]
    return {"path": path, "tables": tables, "rows": sum(t["num_rows"] for t in tables),
            "row_bytes_total": sum(t["num_rows"] * t["row_bytes"] for t in tables),
            "disk_bytes": _disk_bytes(path), "version": version}


def verify_store(path) -> dict:
    """Read every block of every written table of the store at ``path`` and check its
    checksum (and the manifest's, the change log's). Returns ``{"path", "tables": [{name,
    blocks, rows}], "blocks", "damage"}``: ``damage`` is None, or the first damage found
    (the message names the file, the table and the block)."""
    path = os.path.abspath(os.fspath(path))
    checked, damage = [], None
    try:
        path, manifest = _manifest(path)
        db = RowDB(path, readonly=True)
        try:
            db.changes()
            for layout in manifest.tables:
                if layout.generation is None:
                    continue
                blocks = sum(1 for _ in db.iter_blocks(layout))
                checked.append({"name": layout.name, "blocks": blocks, "rows": layout.spec.num_rows})
        finally:
            db.close()
    except CorruptStoreError as exc:
        damage = str(exc)
    return {"path": path, "tables": checked, "blocks": sum(t["blocks"] for t in checked), "damage": damage}

"""Importers of real trace formats into sdm trace files (``sdm trace import KIND SRC -o FILE``).

* ``fbgemm``: Meta's dlrm_datasets / FBGEMM layout, one batch per file:
  ``indices`` (nnz,) int64 table-major, ``offsets`` (T * B + 1,), ``lengths`` (T, B); from a torch
  file (``indices, offsets, lengths = torch.load(file)``, needs torch) or an ``.npz`` with those keys.
* ``dlrm-trace``: the reference DLRM's memory-reference trace (comma-separated row ids).
* ``dlrm-dist``: the reference DLRM's 3-line stack-distance distribution, expanded into a trace.
* ``criteo``: Criteo Kaggle / Terabyte raw TSV (``label, 13 ints, 26 hex hashes``), streamed.

Every importer validates as it reads and raises :class:`~sdm.trace.TraceFormatError` naming the
file and the line, column or field at fault; the output appears only when the import succeeds.
"""

from __future__ import annotations

import os
import re
import warnings
import zipfile

import numpy as np

from sdm.kernels.jit import jit
from sdm.errors import ConfigError
from sdm.trace.format import Batch, TraceFormatError, TraceWriter, input_file
from sdm.validate import INT64_MAX, check_int

__all__ = ["IMPORTERS", "import_fbgemm", "read_fbgemm", "import_dlrm_trace", "import_dlrm_dist",
           "import_criteo", "parse_criteo_line", "parse_criteo_block", "CRITEO_DENSE",
           "CRITEO_SPARSE"]

CRITEO_DENSE = 13
CRITEO_SPARSE = 26
_CRITEO_COLUMNS = 1 + CRITEO_DENSE + CRITEO_SPARSE


def _exists(path) -> str:
    return input_file(path)


def _bar(total, desc, progress, unit="B"):
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, unit_scale=True, desc=desc)


# ---------------------------------------------------------------------------------- fbgemm


def read_fbgemm(path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read one dlrm_datasets / FBGEMM batch file and validate it.

    Returns ``(indices (nnz,) int64, offsets (T * B + 1,) int64, lengths (T, B) int64)``.

    Raises:
        TraceFormatError: missing keys, wrong shapes, or offsets that disagree with lengths or
            indices (the message names the field).
        ConfigError: a torch file while torch is not installed.
    """
    path = _exists(path)
    if path.endswith(".npz"):
        try:
            with np.load(path, allow_pickle=False) as z:
                missing = [k for k in ("indices", "offsets", "lengths") if k not in z.files]
                if missing:
                    raise TraceFormatError(f"{path}: no {missing[0]!r} array (an FBGEMM .npz holds "
                                           f"indices, offsets, lengths)", field=missing[0], path=path)
                indices, offsets, lengths = z["indices"], z["offsets"], z["lengths"]
        except TraceFormatError:
            raise
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
            raise TraceFormatError(f"{path}: not a readable .npz ({exc})", field="file",
                                   path=path) from None
    else:
        if not zipfile.is_zipfile(path):  # torch.save writes a zip; anything else is a bare pickle
            raise TraceFormatError(f"{path}: not an FBGEMM trace file (an .npz of indices, offsets, "
                                   f"lengths, or a torch.save zip of those three tensors)",
                                   field="file", path=path)
        try:
            import torch
        except ImportError:
            raise ConfigError(f"{path}: reading a torch file needs torch (pip install "
                              f"'sdm[peers]'); or convert it to .npz with keys indices, offsets, "
                              f"lengths") from None
        try:
            # weights_only: tensors and tuples only, never arbitrary unpickled objects; torch's
            # warnings stay off the terminal
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises many kinds on damaged files; its messages
            # advise loading with weights_only=False, which sdm never does: not repeated
            raise TraceFormatError(f"{path}: not an FBGEMM trace file (torch cannot read it as "
                                   f"tensors: {type(exc).__name__})", field="file", path=path) from None
        if not isinstance(obj, (tuple, list)) or len(obj) != 3:
            raise TraceFormatError(f"{path}: expected a (indices, offsets, lengths) tuple, got "
                                   f"{type(obj).__name__}", field="file", path=path)
        indices, offsets, lengths = (np.asarray(x.numpy() if hasattr(x, "numpy") else x)
                                     for x in obj)
    for name, arr, nd in (("indices", indices, 1), ("offsets", offsets, 1), ("lengths", lengths, 2)):
        if arr.ndim != nd or not np.issubdtype(arr.dtype, np.integer):
            raise TraceFormatError(f"{path}: {name} must be a {nd}-D integer array, got shape "
                                   f"{arr.shape} dtype {arr.dtype}", field=name, path=path)
    ntab, bsz = lengths.shape
    if offsets.shape[0] != ntab * bsz + 1:
        raise TraceFormatError(f"{path}: offsets has {offsets.shape[0]} entries; lengths is "
                               f"({ntab}, {bsz}) so it needs T * B + 1 = {ntab * bsz + 1}",
                               field="offsets", path=path)
    offsets = offsets.astype(np.int64)
    if offsets[0] != 0 or offsets[-1] != indices.shape[0]:
        raise TraceFormatError(f"{path}: offsets run from {int(offsets[0])} to {int(offsets[-1])}; "
                               f"they must run from 0 to len(indices) = {indices.shape[0]}",
                               field="offsets", path=path)
    diff = np.diff(offsets)
    bad = np.nonzero(diff != lengths.reshape(-1))[0]
    if bad.size:
        j = int(bad[0])
        raise TraceFormatError(f"{path}: offsets disagree with lengths at table {j // bsz}, sample "
                               f"{j % bsz}: offsets step {int(diff[j])}, length "
                               f"{int(lengths.reshape(-1)[j])}", field="lengths", path=path)
    if indices.size and indices.min() < 0:
        raise TraceFormatError(f"{path}: indices holds a negative id {int(indices.min())}",
                               field="indices", path=path)
    return indices.astype(np.int64, copy=False), offsets, lengths.astype(np.int64, copy=False)


def _split_fbgemm(indices, offsets, ntab, bsz, batch_size):
    for s in range(0, bsz, batch_size):
        e = min(s + batch_size, bsz)
        ind, off = [], []
        for t in range(ntab):
            o = offsets[t * bsz + s:t * bsz + e + 1]
            ind.append(indices[o[0]:o[-1]])
            off.append(o - o[0])
        yield Batch(ind, off)


def import_fbgemm(sources, out, *, batch_size: int | None = None, table_sizes=None,
                  compress: bool = False, progress: bool = False) -> str:
    """Import dlrm_datasets / FBGEMM batch files (``.pt`` with torch, or ``.npz``).

    Args:
        sources: one path or a list; each file is one batch of ``B`` samples over ``T`` tables.
        out: the trace file to write.
        batch_size: split each file's ``B`` samples into batches of this many (default: keep).
        table_sizes: rows per table; default ``max id + 1`` per table over all files.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    if batch_size is not None:
        batch_size = check_int(batch_size, "batch_size", lo=1)
    meta = {"source": "fbgemm", "files": [os.path.basename(os.fspath(s)) for s in sources],
            "batch_size": batch_size}
    bar = _bar(len(sources), "import fbgemm", progress, unit="file")
    ntab = None
    with TraceWriter(out, None, meta, compress=compress) as w:
        for src in sources:
            indices, offsets, lengths = read_fbgemm(src)
            t, bsz = lengths.shape
            if ntab is not None and t != ntab:
                raise TraceFormatError(f"{src}: has {t} tables, earlier files {ntab}",
                                       field="lengths", path=os.fspath(src))
            ntab = t
            for b in _split_fbgemm(indices, offsets, t, bsz, batch_size or max(bsz, 1)):
                w.add(b)
            if bar:
                bar.update(1)
        w.close(table_sizes)
    if bar:
        bar.close()
    return w.path


# ---------------------------------------------------------------------------------- dlrm logs


def read_dlrm_trace(path) -> np.ndarray:
    """Read a reference DLRM trace log: comma-separated non-negative row ids over one or more
    lines. Returns ``(n,)`` int64. Raises TraceFormatError naming line and item of a bad id."""
    path = _exists(path)
    parts = []
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, 1):
            toks = [t.strip() for t in line.split(b",")]
            if toks and toks[-1] == b"":
                toks.pop()  # a trailing comma
            if not toks:
                continue
            try:
                arr = np.array([int(t) for t in toks], dtype=np.int64)
            except ValueError:
                for col, tok in enumerate(toks, 1):
                    try:
                        int(tok)
                    except ValueError:
                        raise TraceFormatError(f"{path}: line {lineno}, item {col}: {tok[:40]!r} is "
                                               f"not an integer row id", field=f"line {lineno}",
                                               path=path) from None
                raise
            if arr.size and arr.min() < 0:
                col = int(np.argmax(arr < 0)) + 1
                raise TraceFormatError(f"{path}: line {lineno}, item {col}: negative row id "
                                       f"{int(arr[col - 1])}", field=f"line {lineno}", path=path)
            parts.append(arr)
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def _keys_to_batches(keys, batch_size, pooling):
    per = batch_size * pooling
    for s in range(0, keys.shape[0], per):
        ids = keys[s:s + per]
        n = -(-ids.shape[0] // pooling)
        off = np.minimum(np.arange(n + 1, dtype=np.int64) * pooling, ids.shape[0])
        yield Batch([ids], [off])


def import_dlrm_trace(src, out, *, batch_size: int = 1024, pooling: int = 1, table_size=None,
                      compress: bool = False) -> str:
    """Import the reference DLRM's ``trace.log`` as one table: consecutive ids form bags of
    ``pooling`` lookups, ``batch_size`` bags per batch (the last batch may be short)."""
    batch_size, pooling = check_int(batch_size, "batch_size", lo=1), check_int(pooling, "pooling", lo=1)
    keys = read_dlrm_trace(src)
    if keys.size == 0:
        raise TraceFormatError(f"{src}: holds no row ids", field="file", path=os.fspath(src))
    size = int(table_size) if table_size is not None else int(keys.max()) + 1
    meta = {"source": "dlrm-trace", "file": os.path.basename(os.fspath(src)),
            "batch_size": batch_size, "pooling": pooling}
    with TraceWriter(out, [size], meta, compress=compress) as w:
        for b in _keys_to_batches(keys, batch_size, pooling):
            w.add(b)
    return w.path


def import_dlrm_dist(src, out, *, lookups: int = 1 << 20, batch_size: int = 1024, pooling: int = 1,
                     seed: int = 0, compress: bool = False) -> str:
    """Expand a reference DLRM stack-distance distribution file into a trace of ``lookups``
    lookups (one table, bags of ``pooling``), drawn as the reference generator does."""
    from sdm.trace.generate import generate_to

    lookups, batch_size, pooling = (check_int(v, name, lo=1, hi=INT64_MAX) for name, v in
                                    (("lookups", lookups), ("batch_size", batch_size), ("pooling", pooling)))
    per = batch_size * pooling
    return generate_to(out, "stack-distance", seed=seed, dist_file=os.fspath(src),
                       batch_size=batch_size, pooling=[pooling], batches=max(1, -(-lookups // per)),
                       compress=compress)


# ---------------------------------------------------------------------------------- criteo


def parse_criteo_line(line: bytes, lineno: int, path: str = "<criteo>"):
    """Parse one Criteo TSV line: ``label``, 13 integer features, 26 hex hashes.

    Missing fields are empty. Returns ``(label float, dense (13,) float64 raw values, hashes
    (26,) uint64)``; a missing integer is 0, a missing hash 0 (the reference DLRM's choice).
    Hashes are parsed as 64-bit (many Criteo hashes are >= 2**31).

    Raises:
        TraceFormatError: wrong column count, a non-integer label or dense value, or a hash
            that is not hexadecimal (names the line and column, 1-based).
    """
    labels, dense, hashes = parse_criteo_block([line], [lineno], path)
    return float(labels[0]), dense[0], hashes[0]


def _dlrm_dense(raw: np.ndarray) -> np.ndarray:
    # DLRM's Criteo preprocessing: negatives clamped to 0, then log(x + 1)
    return np.log1p(np.maximum(raw, 0.0)).astype(np.float32)


def _patterns(field: bytes):
    # one field, and a whole tab-joined column of them (one C-level match per column)
    return re.compile(field), re.compile(rb"(?:" + field + rb"\t)*" + field)


_HEX = _patterns(rb"[0-9a-fA-F]{0,16}")
_INT = _patterns(rb"(?:[-+]?[0-9]+)?")
_UINT = _patterns(rb"[0-9]*")


def _column(values, linenos, col, base, patterns, path, what):
    """Convert one column of a block of lines to Python ints (empty -> 0), checking every field
    against the pattern first (``int()`` alone would accept spaces, ``0x`` and ``_``)."""
    one, many = patterns
    if many.fullmatch(b"\t".join(values)) is None:
        for v, ln in zip(values, linenos):
            if one.fullmatch(v) is None:
                raise TraceFormatError(f"{path}: line {ln}, column {col}: {v[:20]!r} is not {what}",
                                       field=f"line {ln}", path=path)
    return [int(v, base) if v else 0 for v in values]


def parse_criteo_block(lines, linenos, path: str = "<criteo>"):
    """Parse Criteo TSV lines (bytes, newline allowed) at once, column by column.

    Returns ``(labels (n,) float32, dense (n, 13) float64 raw values, hashes (n, 26) uint64)``
    with the conventions of :func:`parse_criteo_line`; raises the same errors naming the line.
    """
    rows = [ln.rstrip(b"\r\n").split(b"\t") for ln in lines]
    for r, ln in zip(rows, linenos):
        if len(r) != _CRITEO_COLUMNS:
            raise TraceFormatError(f"{path}: line {ln} has {len(r)} tab-separated columns; "
                                   f"Criteo lines have {_CRITEO_COLUMNS} (label, {CRITEO_DENSE} "
                                   f"integers, {CRITEO_SPARSE} hashes)", field=f"line {ln}", path=path)
    cols = list(zip(*rows)) if rows else [()] * _CRITEO_COLUMNS
    n = len(rows)
    labels = np.array(_column(cols[0], linenos, 1, 10, _UINT, path, "an integer label"),
                      dtype=np.float32).reshape(n)
    dense = np.empty((n, CRITEO_DENSE), dtype=np.float64)
    for j in range(CRITEO_DENSE):
        dense[:, j] = _column(cols[1 + j], linenos, 2 + j, 10, _INT, path, "an integer")
    hashes = np.empty((n, CRITEO_SPARSE), dtype=np.uint64)
    for j in range(CRITEO_SPARSE):
        c = 1 + CRITEO_DENSE + j
        hashes[:, j] = _column(cols[c], linenos, c + 1, 16, _HEX, path,
                               "a hexadecimal hash of at most 64 bits")
    return labels, dense, hashes


def _new_map():
    from numba import types
    from numba.typed import Dict

    return Dict.empty(key_type=types.uint64, value_type=types.int64)


@jit
def _remap_kernel(m, keys, out):
    # contiguous ids in first-seen order; the map lives across blocks
    for i in range(keys.shape[0]):
        k = keys[i]
        v = m.get(k, -1)
        if v < 0:
            v = len(m)
            m[k] = v
        out[i] = v


def _remap(m, keys: np.ndarray) -> np.ndarray:
    out = np.empty(keys.shape[0], dtype=np.int64)
    _remap_kernel(m, keys, out)
    return out


def import_criteo(src, out, *, table_sizes=None, batch_size: int = 2048, limit: int | None = None,
                  compress: bool = False, progress: bool = False) -> str:
    """Import a Criteo Kaggle / Terabyte raw TSV file, streaming it a batch of lines at a time.

    Args:
        src: the TSV path (``train.txt``, ``day_0``, ...).
        out: the trace file to write: 26 tables, one id per sample per table, dense features
            ``log(x + 1)`` with negatives clamped to 0, labels.
        table_sizes: None (remap: ids are contiguous per column in first-seen order, table sizes
            are the distinct counts), or 26 sizes (hash: ``id = hash mod size``), or a profile
            name whose tables have 26 entries (``"criteo-kaggle"``).
        batch_size: samples per batch.
        limit: stop after this many lines.

    Memory is one batch of lines in hash mode; remap mode also keeps one map entry per distinct
    hash (a Numba typed dict, ~33M entries for the whole Kaggle set). Speed here: ~50K lines/s
    hashing, ~30K lines/s remapping all-distinct hashes.

    Raises:
        TraceFormatError: a line with the wrong column count, a bad label, integer or hash
            (names the line and column); nothing is written.
    """
    path = _exists(src)
    batch_size = check_int(batch_size, "batch_size", lo=1)
    if limit is not None:
        limit = check_int(limit, "limit (lines to read)", lo=1)
    if isinstance(table_sizes, str):
        from sdm.trace.generate import get_profile

        table_sizes = get_profile(table_sizes).table_sizes
    sizes = None
    if table_sizes is not None:
        sizes = np.asarray(table_sizes, dtype=np.int64)
        if sizes.shape != (CRITEO_SPARSE,) or sizes.min() < 1:
            raise ConfigError(f"Criteo table_sizes needs {CRITEO_SPARSE} sizes >= 1, got "
                              f"{sizes.tolist()}")
    maps = None if sizes is not None else [_new_map() for _ in range(CRITEO_SPARSE)]
    meta = {"source": "criteo", "file": os.path.basename(path), "batch_size": batch_size,
            "mode": "remap" if sizes is None else "hash",
            "dense": "log(x + 1), negatives clamped to 0", "missing_hash": 0}
    bar = _bar(os.path.getsize(path), "import criteo", progress)
    writer = TraceWriter(out, None if sizes is None else sizes, meta, compress=compress,
                         index_dtype=np.int64)
    off = np.arange(batch_size + 1, dtype=np.int64)

    def flush(block, linenos):
        labels, raw, hashes = parse_criteo_block(block, linenos, path)
        n = labels.shape[0]
        if sizes is not None:
            ids = (hashes % sizes.astype(np.uint64)).astype(np.int64)
        else:
            ids = np.empty(hashes.shape, dtype=np.int64)
            for j in range(CRITEO_SPARSE):
                ids[:, j] = _remap(maps[j], np.ascontiguousarray(hashes[:, j]))
        writer.add(Batch([ids[:, j].copy() for j in range(CRITEO_SPARSE)],
                         [off[:n + 1]] * CRITEO_SPARSE, dense=_dlrm_dense(raw), labels=labels))

    try:
        lines = 0
        block, linenos = [], []
        with open(path, "rb") as fh:
            for lineno, line in enumerate(fh, 1):
                if limit is not None and lines >= limit:
                    break
                if bar:
                    bar.update(len(line))
                if not line.strip():
                    continue
                block.append(line)
                linenos.append(lineno)
                lines += 1
                if len(block) == batch_size:
                    flush(block, linenos)
                    block, linenos = [], []
        if block:
            flush(block, linenos)
        if lines == 0:
            raise TraceFormatError(f"{path}: holds no Criteo lines", field="file", path=path)
        meta["lines"] = lines
        writer.metadata = meta
        final = None if sizes is not None else [max(len(m), 1) for m in maps]
        writer.close(final)
    except BaseException:
        writer.abort()
        raise
    finally:
        if bar:
            bar.close()
    return writer.path


IMPORTERS = {
    "fbgemm": import_fbgemm,
    "dlrm-trace": import_dlrm_trace,
    "dlrm-dist": import_dlrm_dist,
    "criteo": import_criteo,
}

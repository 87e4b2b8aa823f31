"""The sdm trace file: a versioned, never-pickled ``.npz`` of embedding-lookup batches.

Layout (schema version 1). A trace is one zip archive written by :func:`save` / :class:`TraceWriter`;
every member is a plain ``.npy`` array, so ``np.load(path, allow_pickle=False)`` reads it:

==========================  =============================  =====================================
member                      shape, dtype                   meaning
==========================  =============================  =====================================
``schema_version``          ``()`` int64                   :data:`SCHEMA_VERSION`
``table_sizes``             ``(T,)`` int64                 rows per table, every id in ``[0, n_t)``
``batch_sizes``             ``(N,)`` int64                 samples ``B_i`` of batch ``i``
``batch_lookups``           ``(N,)`` int64                 lookups ``nnz_i`` of batch ``i``
``metadata``                ``()`` unicode                 JSON object: generator + parameters, or source
``b{i:08d}_indices``        ``(nnz_i,)`` int32 or int64    all lookups of batch i, table-major (FBGEMM)
``b{i:08d}_offsets``        ``(T * B_i + 1,)`` int32/64    CSR bag starts, table-major, last = nnz_i
``b{i:08d}_dense``          ``(B_i, D)`` float32           optional dense features
``b{i:08d}_request_ids``    ``(B_i,)`` int64               optional request id of each sample
``b{i:08d}_labels``         ``(B_i,)`` float32             optional click labels
==========================  =============================  =====================================

Bag ``b`` of table ``t`` in batch ``i`` is ``indices[offsets[t * B + b]:offsets[t * B + b + 1]]``:
exactly FBGEMM's table-major ``(indices, offsets)`` with ``T * B + 1`` offsets, so a batch is one
contiguous read. Indices are stored as int32 when every table has fewer than 2**31 rows, offsets
when a batch has fewer than 2**31 lookups (one id per bag makes offsets as large as the ids);
readers always hand out int64 indices and offsets.

Streaming: a zip member is read only when its batch is asked for, so a trace larger than RAM is
replayed batch by batch with memory for one batch. The writer appends one batch at a time to a
temporary file and renames it into place when complete, so a half-written trace is never seen.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from sdm.errors import IdOutOfRangeError, InvalidArgumentError, SdmError
from sdm.validate import check_int

__all__ = [
    "SCHEMA_VERSION",
    "Batch",
    "Trace",
    "TraceWriter",
    "TraceFormatError",
    "TraceNotFoundError",
    "load",
    "save",
]

SCHEMA_VERSION = 1
_INT32_LIMIT = 2**31 - 1
_OPTIONAL = ("dense", "request_ids", "labels")


class TraceFormatError(InvalidArgumentError):
    """A trace file or an imported file that breaks its schema; ``field`` names the member,
    field or line at fault."""

    def __init__(self, message: str, *, field: str | None = None, path: str | None = None):
        super().__init__(message)
        self.field = field
        self.path = path

    def __str__(self) -> str:
        return self.args[0]


class TraceNotFoundError(SdmError, FileNotFoundError):
    """A trace path that does not exist."""

    def __str__(self) -> str:
        return self.args[0]


@dataclass
class Batch:
    """One batch of ``B`` samples over ``T`` tables.

    Attributes:
        indices: ``T`` arrays, ``indices[t]`` the ``(nnz_t,)`` row ids of table ``t`` (int64 when
            read from a trace file).
        offsets: ``T`` arrays, ``offsets[t]`` the ``(B + 1,)`` int64 CSR bag boundaries of table
            ``t`` (``offsets[t][0] == 0``, ``offsets[t][-1] == nnz_t``).
        dense: optional ``(B, D)`` float32 dense features.
        request_ids: optional ``(B,)`` int64 request of each sample (inference: one user request
            holds several candidate items, i.e. several samples).
        labels: optional ``(B,)`` float32 labels.
    """

    indices: list
    offsets: list
    dense: np.ndarray | None = None
    request_ids: np.ndarray | None = None
    labels: np.ndarray | None = None

    @property
    def num_tables(self) -> int:
        return len(self.indices)

    @property
    def batch_size(self) -> int:
        return int(self.offsets[0].shape[0] - 1) if self.offsets else 0

    @property
    def lookups(self) -> int:
        return int(sum(int(ix.shape[0]) for ix in self.indices))

    @classmethod
    def from_fbgemm(cls, indices, offsets, num_tables: int, **optional) -> "Batch":
        """Split FBGEMM's table-major ``(indices, offsets)`` (``T * B + 1`` offsets) into tables.

        The per-table arrays are views of ``indices``; offsets are rebased to start at 0.
        """
        offsets = np.asarray(offsets, dtype=np.int64)
        nb = (offsets.shape[0] - 1) // num_tables
        ind, off = [], []
        for t in range(num_tables):
            o = offsets[t * nb:(t + 1) * nb + 1]
            ind.append(indices[o[0]:o[-1]])
            off.append(o - o[0])
        return cls(ind, off, **optional)

    def to_fbgemm(self) -> tuple[np.ndarray, np.ndarray]:
        """Concatenate into FBGEMM's table-major layout: ``(nnz,)`` ids, ``(T * B + 1,)`` int64 offsets."""
        bsz = self.batch_size
        offsets = np.empty(self.num_tables * bsz + 1, dtype=np.int64)
        base = 0
        for t, o in enumerate(self.offsets):
            offsets[t * bsz:(t + 1) * bsz] = np.asarray(o[:-1], dtype=np.int64) + base
            base += int(o[-1])
        offsets[-1] = base
        if self.indices:
            dtype = np.result_type(*[np.asarray(ix).dtype for ix in self.indices])
            indices = np.concatenate([np.asarray(ix) for ix in self.indices]).astype(dtype, copy=False)
        else:
            indices = np.empty(0, dtype=np.int64)
        return indices, offsets


def _check_batch(batch: Batch, table_sizes: np.ndarray, where: str) -> None:
    """Validate one batch against the table sizes; raise TraceFormatError naming the field."""
    ntab = table_sizes.shape[0]
    if len(batch.indices) != ntab or len(batch.offsets) != ntab:
        raise TraceFormatError(
            f"{where}: has {len(batch.indices)} index arrays and {len(batch.offsets)} offset arrays, "
            f"the trace has {ntab} tables", field=f"{where}.indices")
    bsz = None
    for t in range(ntab):
        ix = np.asarray(batch.indices[t])
        of = np.asarray(batch.offsets[t])
        f_ix, f_of = f"{where}.indices[{t}]", f"{where}.offsets[{t}]"
        if ix.ndim != 1 or not np.issubdtype(ix.dtype, np.integer) or ix.dtype == np.bool_:
            raise TraceFormatError(f"{f_ix} must be a 1-D integer array, got shape {ix.shape} "
                                   f"dtype {ix.dtype}", field=f_ix)
        if of.ndim != 1 or not np.issubdtype(of.dtype, np.integer) or of.shape[0] < 1:
            raise TraceFormatError(f"{f_of} must be a 1-D integer array of B + 1 >= 1 entries, got "
                                   f"shape {of.shape} dtype {of.dtype}", field=f_of)
        if bsz is None:
            bsz = of.shape[0] - 1
        elif of.shape[0] - 1 != bsz:
            raise TraceFormatError(f"{f_of} has {of.shape[0]} entries (B = {of.shape[0] - 1}); table 0 "
                                   f"has B = {bsz} and every table of a batch must agree", field=f_of)
        if of[0] != 0:
            raise TraceFormatError(f"{f_of}[0] must be 0, got {int(of[0])}", field=f_of)
        if of[-1] != ix.shape[0]:
            raise TraceFormatError(f"{f_of}[-1] = {int(of[-1])} does not match len({f_ix}) = "
                                   f"{ix.shape[0]}", field=f_of)
        if of.shape[0] > 1:
            steps = np.diff(of)
            if steps.min() < 0:
                at = int(np.argmax(steps < 0))
                raise TraceFormatError(f"{f_of} decreases at entry {at + 1}: {int(of[at + 1])} < "
                                       f"{int(of[at])}", field=f_of)
        if ix.shape[0]:
            lo, hi = int(ix.min()), int(ix.max())
            if lo < 0 or hi >= table_sizes[t]:
                bad = lo if lo < 0 else hi
                raise TraceFormatError(f"{f_ix} holds id {bad}, outside [0, {int(table_sizes[t])}) "
                                       f"of table {t}", field=f_ix)
    bsz = bsz or 0
    for name in _OPTIONAL:
        arr = getattr(batch, name)
        if arr is None:
            continue
        arr = np.asarray(arr)
        if arr.shape[0:1] != (bsz,) or (name == "dense" and arr.ndim != 2) or (
                name != "dense" and arr.ndim != 1):
            want = f"({bsz}, D)" if name == "dense" else f"({bsz},)"
            raise TraceFormatError(f"{where}.{name} must have shape {want}, got {arr.shape}",
                                   field=f"{where}.{name}")
        kinds = "iu" if name == "request_ids" else "iuf"
        if arr.dtype.kind not in kinds:
            raise TraceFormatError(f"{where}.{name} must be {'integer' if kinds == 'iu' else 'numeric'}, "
                                   f"got dtype {arr.dtype}", field=f"{where}.{name}")


def _as_batch(obj, where: str = "batch") -> Batch:
    if isinstance(obj, Batch):
        parts = (obj.indices, obj.offsets, {k: getattr(obj, k) for k in _OPTIONAL})
    elif isinstance(obj, dict) and "indices" in obj and "offsets" in obj:
        parts = (obj["indices"], obj["offsets"], {k: obj.get(k) for k in _OPTIONAL})
    elif isinstance(obj, (tuple, list)) and len(obj) == 2:
        parts = (obj[0], obj[1], {})
    else:
        raise InvalidArgumentError(
            f"{where}: a batch must be a sdm.trace.Batch, a dict with 'indices' and 'offsets', or "
            f"an (indices, offsets) pair of per-table lists; got {type(obj).__name__}")
    indices, offsets, optional = parts
    for name, seq in (("indices", indices), ("offsets", offsets)):
        if isinstance(seq, (str, bytes)) or not isinstance(seq, Iterable):
            raise TraceFormatError(f"{where}.{name} must be a list with one array per table, got "
                                   f"{type(seq).__name__}", field=f"{where}.{name}")
    # arrays, not nested lists: the checks and the writer read .shape and .dtype
    return Batch([_array(a, f"{where}.indices[{t}]") for t, a in enumerate(indices)],
                 [_array(a, f"{where}.offsets[{t}]") for t, a in enumerate(offsets)],
                 **{k: None if v is None else _array(v, f"{where}.{k}") for k, v in optional.items()})


def _array(values, field: str) -> np.ndarray:
    try:
        return np.asarray(values)
    except (ValueError, TypeError) as exc:
        raise TraceFormatError(f"{field} is not an array (ragged nesting?): {exc}", field=field) from None


def _check_table_sizes(table_sizes) -> np.ndarray:
    ts = _array(table_sizes, "table_sizes")
    if ts.ndim != 1 or ts.shape[0] < 1 or not np.issubdtype(ts.dtype, np.integer):
        raise TraceFormatError(f"table_sizes must be a non-empty 1-D integer array, got shape "
                               f"{ts.shape} dtype {ts.dtype}", field="table_sizes")
    if ts.min() < 1:
        t = int(np.argmin(ts))
        raise TraceFormatError(f"table_sizes[{t}] = {int(ts[t])}; every table needs >= 1 row",
                               field="table_sizes")
    return ts.astype(np.int64)


class TraceWriter:
    """Append batches to a new trace file, one at a time (memory for one batch).

    ``with TraceWriter(path, table_sizes, metadata) as w: w.add(batch)``. ``table_sizes`` may be
    None when it is known only at the end (importers that remap ids): pass it to
    :meth:`close`, or let the writer use ``max id + 1`` per table. The file appears at ``path``
    only when :meth:`close` succeeds; an exception inside the ``with`` removes the partial file.
    """

    def __init__(self, path, table_sizes=None, metadata: dict | None = None, *,
                 compress: bool = False, index_dtype=None):
        self.path = _path(path, "trace path")
        if os.path.isdir(self.path):
            raise InvalidArgumentError(f"cannot write a trace to {self.path!r}: it is a directory")
        folder = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(folder):
            raise InvalidArgumentError(f"cannot write a trace to {self.path!r}: directory {folder!r} "
                                       f"does not exist")
        self._ts = None if table_sizes is None else _check_table_sizes(table_sizes)
        self.metadata = dict(metadata or {})
        try:
            json.dumps(self.metadata)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"trace metadata must be JSON-serializable: {exc}") from None
        if index_dtype is None:
            wide = self._ts is None or int(self._ts.max()) > _INT32_LIMIT
            index_dtype = np.int64 if wide else np.int32
        self._index_dtype = np.dtype(index_dtype)
        self._tmp = f"{self.path}.tmp-{os.getpid()}"
        try:
            self._zip = zipfile.ZipFile(self._tmp, "w",
                                        zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED,
                                        allowZip64=True)
        except OSError as exc:
            raise InvalidArgumentError(f"cannot write a trace to {self.path!r}: "
                                       f"{exc.strerror or exc}") from None
        self._sizes: list[int] = []
        self._nnz: list[int] = []
        self._max = None
        self._ntab = None if self._ts is None else self._ts.shape[0]

    def _put(self, name: str, arr: np.ndarray) -> None:
        # a fixed member timestamp makes the same batches give the same bytes
        info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = self._zip.compression
        with self._zip.open(info, "w", force_zip64=True) as fh:
            np.lib.format.write_array(fh, np.asarray(arr, order="C"), allow_pickle=False)

    def add(self, batch) -> None:
        """Append one batch (a :class:`Batch`, a dict, or an ``(indices, offsets)`` pair)."""
        where = f"batch {len(self._sizes)}"
        batch = _as_batch(batch, where)
        if self._ts is not None:
            _check_batch(batch, self._ts, where)
        else:
            if self._ntab is None:
                self._ntab = len(batch.indices)
            if self._max is None:
                self._max = np.full(self._ntab, -1, dtype=np.int64)
            big = np.full(self._ntab, np.iinfo(np.int64).max, dtype=np.int64)
            _check_batch(batch, big, where)
            for t, ix in enumerate(batch.indices):
                if len(ix):
                    self._max[t] = max(self._max[t], int(np.max(ix)))
        indices, offsets = batch.to_fbgemm()
        if self._index_dtype == np.int32 and indices.size and int(indices.max()) > _INT32_LIMIT:
            raise InvalidArgumentError(f"{where}: id {int(indices.max())} does not fit the int32 "
                                       f"index dtype chosen for this trace")
        i = len(self._sizes)
        self._put(f"b{i:08d}_indices", indices.astype(self._index_dtype, copy=False))
        narrow = offsets[-1] <= _INT32_LIMIT
        self._put(f"b{i:08d}_offsets", offsets.astype(np.int32) if narrow else offsets)
        for name in _OPTIONAL:
            arr = getattr(batch, name)
            if arr is not None:
                dtype = np.int64 if name == "request_ids" else np.float32
                self._put(f"b{i:08d}_{name}", np.asarray(arr, dtype=dtype))
        self._sizes.append(batch.batch_size)
        self._nnz.append(int(indices.shape[0]))

    def close(self, table_sizes=None) -> str:
        """Write the header members, close, and move the file into place. Returns the path."""
        if self._zip is None:
            return self.path
        try:
            if table_sizes is not None:
                ts = _check_table_sizes(table_sizes)
                if self._max is not None:
                    if ts.shape[0] != self._max.shape[0]:
                        raise TraceFormatError(f"table_sizes has {ts.shape[0]} entries, the batches "
                                               f"{self._max.shape[0]} tables", field="table_sizes")
                    bad = np.nonzero(self._max >= ts)[0]
                    if bad.size:
                        t = int(bad[0])
                        raise TraceFormatError(f"table {t} holds id {int(self._max[t])}, outside "
                                               f"[0, {int(ts[t])})", field="table_sizes")
                self._ts = ts
            elif self._ts is None:
                if self._max is None:
                    raise InvalidArgumentError("a trace with no batches needs table_sizes")
                self._ts = np.maximum(self._max + 1, 1)
            self._put("schema_version", np.array(SCHEMA_VERSION, dtype=np.int64))
            self._put("table_sizes", self._ts)
            self._put("batch_sizes", np.array(self._sizes, dtype=np.int64))
            self._put("batch_lookups", np.array(self._nnz, dtype=np.int64))
            self._put("metadata", np.array(json.dumps(self.metadata, sort_keys=True)))
            self._zip.close()
            self._zip = None
            os.replace(self._tmp, self.path)
        except BaseException:
            self.abort()
            raise
        return self.path

    def abort(self) -> None:
        """Drop the partial file."""
        if self._zip is not None:
            self._zip.close()
            self._zip = None
        if os.path.exists(self._tmp):
            os.unlink(self._tmp)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()


def save(path, batches: Iterable, table_sizes, *, compress: bool = False, **metadata) -> str:
    """Write a trace file.

    Args:
        path: destination (``.npz`` by convention); replaced atomically when complete.
        batches: an iterable (a generator is fine: batches are written as they come) of
            :class:`Batch`, dicts with ``indices``/``offsets`` (and optional ``dense``,
            ``request_ids``, ``labels``), or ``(indices, offsets)`` pairs of per-table lists.
            ``indices[t]`` is ``(nnz_t,)`` integer, ``offsets[t]`` ``(B + 1,)`` integer CSR.
        table_sizes: ``(T,)`` rows per table; every id must lie in ``[0, table_sizes[t])``.
        compress: deflate the members (smaller files, slower reads).
        **metadata: JSON-serializable facts kept with the trace (``generator``, ``params``,
            ``source``, ...).

    Returns:
        The path written.

    Raises:
        TraceFormatError: a batch that does not fit the schema (the message names the field).
    """
    if not isinstance(batches, Iterable):
        raise InvalidArgumentError(f"batches must be an iterable of batches, got {type(batches).__name__}")
    with TraceWriter(path, table_sizes, metadata, compress=compress) as w:
        for b in batches:
            w.add(b)
    return w.path


class Trace:
    """A trace file opened for reading; batches are loaded lazily, one zip member at a time.

    ``len(trace)`` is the number of batches; ``trace[i]`` and iteration give :class:`Batch`
    objects. Attributes: ``table_sizes`` ``(T,)`` int64, ``batch_sizes`` ``(N,)`` int64 samples
    and ``batch_lookups`` ``(N,)`` int64 lookups per batch (known without reading batches),
    ``metadata`` dict, ``path``. Use as a context manager or call :meth:`close`.
    """

    def __init__(self, path, *, validate: bool = True):
        self.path = _path(path, "trace path")
        self.validate = validate
        if not os.path.exists(self.path):
            raise TraceNotFoundError(f"no trace at {self.path!r}")
        if os.path.isdir(self.path):
            raise TraceFormatError(f"{self.path!r} is a directory, not a trace file", field="file",
                                   path=self.path)
        # Told apart before numpy sees the file: numpy takes anything that is neither .npz
        # nor .npy for a pickle, and its message advises allow_pickle=True.
        with open(self.path, "rb") as fh:
            head = fh.read(6)
        if head == b"\x93NUMPY":
            raise TraceFormatError(f"{self.path!r} is a single .npy array, not a trace archive",
                                   field="file", path=self.path)
        if not zipfile.is_zipfile(self.path):
            raise TraceFormatError(f"{self.path!r} is not a readable trace (.npz) file: not an sdm trace "
                                   f"(no zip archive; `sdm trace gen` and `sdm trace import` write them)",
                                   field="file", path=self.path)
        try:
            self._npz = np.load(self.path, allow_pickle=False)
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
            raise TraceFormatError(f"{self.path!r} is not a readable trace (.npz) file: {exc}",
                                   field="file", path=self.path) from None
        names = self._names = set(self._npz.files)
        for key in ("schema_version", "table_sizes", "batch_sizes", "batch_lookups", "metadata"):
            if key not in names:
                raise TraceFormatError(f"{self.path!r} has no {key!r} member; not an sdm trace "
                                       f"(or the file is truncated)", field=key, path=self.path)
        version = self._member("schema_version")
        if version.shape != () or not np.issubdtype(version.dtype, np.integer):
            raise TraceFormatError(f"schema_version must be a scalar integer, got shape "
                                   f"{version.shape} dtype {version.dtype}", field="schema_version")
        if int(version) != SCHEMA_VERSION:
            raise TraceFormatError(f"schema_version {int(version)} is not supported; this sdm reads "
                                   f"version {SCHEMA_VERSION}", field="schema_version", path=self.path)
        self.table_sizes = _check_table_sizes(self._member("table_sizes"))
        bs = self._member("batch_sizes")
        if bs.ndim != 1 or not np.issubdtype(bs.dtype, np.integer) or (bs.size and bs.min() < 0):
            raise TraceFormatError(f"batch_sizes must be a 1-D array of counts >= 0, got shape "
                                   f"{bs.shape} dtype {bs.dtype}", field="batch_sizes")
        self.batch_sizes = bs.astype(np.int64)
        bl = self._member("batch_lookups")
        if bl.shape != bs.shape or not np.issubdtype(bl.dtype, np.integer) or (bl.size and bl.min() < 0):
            raise TraceFormatError(f"batch_lookups must be {bs.shape[0]} counts >= 0 like batch_sizes, "
                                   f"got shape {bl.shape} dtype {bl.dtype}", field="batch_lookups")
        self.batch_lookups = bl.astype(np.int64)
        meta = self._member("metadata")
        try:
            self.metadata = json.loads(str(meta))
        except ValueError as exc:
            raise TraceFormatError(f"metadata is not valid JSON: {exc}", field="metadata") from None
        if not isinstance(self.metadata, dict):
            raise TraceFormatError("metadata must be a JSON object", field="metadata")
        for i in range(len(self.batch_sizes)):
            for part in ("indices", "offsets"):
                if f"b{i:08d}_{part}" not in names:
                    raise TraceFormatError(f"batch {i} has no {part} member (b{i:08d}_{part}); the "
                                           f"file is truncated or damaged",
                                           field=f"b{i:08d}_{part}", path=self.path)

    def _member(self, name: str) -> np.ndarray:
        try:
            return self._npz[name]
        except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as exc:
            raise TraceFormatError(f"member {name!r} of {self.path!r} cannot be read: {exc}",
                                   field=name, path=self.path) from None

    @property
    def num_tables(self) -> int:
        return int(self.table_sizes.shape[0])

    @property
    def num_lookups(self) -> int:
        return int(self.batch_lookups.sum())

    def __len__(self) -> int:
        return int(self.batch_sizes.shape[0])

    def __getitem__(self, i: int) -> Batch:
        n = len(self)
        i = check_int(i, "batch index")
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IdOutOfRangeError(f"batch {i} out of range for a trace of {n} batch{'' if n == 1 else 'es'}")
        pre = f"b{i:08d}_"
        indices = self._member(pre + "indices")
        offsets = self._member(pre + "offsets")
        bsz = int(self.batch_sizes[i])
        ntab = self.num_tables
        if offsets.ndim != 1 or offsets.shape[0] != ntab * bsz + 1:
            raise TraceFormatError(f"{pre}offsets has shape {offsets.shape}; batch {i} needs "
                                   f"T * B + 1 = {ntab} * {bsz} + 1 = {ntab * bsz + 1} entries",
                                   field=pre + "offsets", path=self.path)
        if indices.ndim != 1 or not np.issubdtype(indices.dtype, np.integer):
            raise TraceFormatError(f"{pre}indices must be 1-D integer, got shape {indices.shape} "
                                   f"dtype {indices.dtype}", field=pre + "indices", path=self.path)
        if not np.issubdtype(offsets.dtype, np.integer):
            raise TraceFormatError(f"{pre}offsets must be integer, got {offsets.dtype}",
                                   field=pre + "offsets", path=self.path)
        if indices.shape[0] != self.batch_lookups[i]:
            raise TraceFormatError(f"{pre}indices has {indices.shape[0]} ids; the header says batch "
                                   f"{i} has {int(self.batch_lookups[i])}", field=pre + "indices",
                                   path=self.path)
        if offsets[-1] != indices.shape[0] or offsets[0] != 0:
            raise TraceFormatError(f"{pre}offsets run from {int(offsets[0])} to {int(offsets[-1])}; "
                                   f"they must run from 0 to len(indices) = {indices.shape[0]}",
                                   field=pre + "offsets", path=self.path)
        opt = {}
        for name in _OPTIONAL:
            if pre + name in self._names:
                opt[name] = self._member(pre + name)
        # int64 in memory whatever the disk width: callers add table bases to ids, and int32
        # sums would overflow
        batch = Batch.from_fbgemm(indices.astype(np.int64, copy=False),
                                  offsets.astype(np.int64, copy=False), ntab, **opt)
        if self.validate:
            _check_batch(batch, self.table_sizes, f"batch {i}")
        return batch

    def __iter__(self) -> Iterator[Batch]:
        for i in range(len(self)):
            yield self[i]

    def fbgemm(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Batch ``i`` in FBGEMM layout without splitting: ``(nnz,)`` ids, ``(T * B + 1,)`` offsets."""
        return self[i].to_fbgemm()

    @property
    def table_bases(self) -> np.ndarray:
        """``(T,)`` int64 first global key of each table: ``key = table_bases[t] + row``."""
        return np.concatenate([[0], np.cumsum(self.table_sizes)[:-1]]).astype(np.int64)

    def keys(self) -> Iterator[np.ndarray]:
        """Per batch, the ``(nnz,)`` int64 global keys ``table_bases[t] + row`` in table-major order
        (the key stream a cache simulator replays)."""
        bases = self.table_bases
        for batch in self:
            parts = [np.asarray(ix, dtype=np.int64) + bases[t] for t, ix in enumerate(batch.indices)]
            yield np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def close(self) -> None:
        self._npz.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return (f"Trace({self.path!r}, batches={len(self)}, tables={self.num_tables}, "
                f"generator={self.metadata.get('generator', self.metadata.get('source'))!r})")


def _path(path, what: str) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(f"{what} must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    if isinstance(path, bytes) or "\0" in path:
        raise InvalidArgumentError(f"{what} {path!r} must be a text path without NUL bytes")
    return path


def input_file(path, what: str = "file") -> str:
    """The path of an existing regular file the user named, else TraceNotFoundError (missing)
    or TraceFormatError (a directory, or not a path at all)."""
    path = _path(path, what)
    if not os.path.exists(path):
        raise TraceNotFoundError(f"no {what} at {path!r}")
    if not os.path.isfile(path):
        raise TraceFormatError(f"{what} {path!r} is a directory, not a file", field="file", path=path)
    return path


def load(path, *, validate: bool = True) -> Trace:
    """Open a trace file written by :func:`save` (``np.load(..., allow_pickle=False)``, lazy).

    The header (schema version, table sizes, batch sizes, metadata) is validated now; each batch
    is read and, when ``validate`` is true, checked (offsets vs indices, ids vs table sizes) when
    it is accessed.

    Raises:
        TraceNotFoundError: no file at ``path``.
        TraceFormatError: a damaged, truncated or foreign file, or an unknown schema version; the
            message and ``.field`` name the member at fault.
    """
    return Trace(path, validate=validate)
